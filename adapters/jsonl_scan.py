"""Scanning JSONL lines (Claude, Codex, Pi): one scanner, three classifiers.

A :class:`JsonlFormat` names a format's classifier, its cheap pre-filter, its per-file state
and the newest version we tested it on; :func:`scan` classifies complete lines (what both the
monitor and ``sessionwatch replay`` run), and :mod:`adapters.jsonl_adapter` tails linked files.

Lines are parsed by orjson; only a line orjson refuses goes to :func:`parse_line`'s tolerant
fallback (a lone surrogate escape, invalid UTF-8 read with replacement characters, or, for
Claude and Codex, a record written after a torn fragment on the same line). Only a line that
is not JSON at all is invalid: Pi stops there (its own reader's rule: the cursor blocks);
Claude and Codex count it in the link's drift (``invalidLines``, ``lastInvalidOffset``),
log it once, and read on, since their writers append whole records and a torn line can
carry no record we could read.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from adapters.base import (
    Drift,
    Marker,
    OwnPool,
    Turn,
    Verdict,
    as_int,
    as_list,
    member,
    parse_time,
)
from adapters.jsonl_format import JsonlFormat
from monitor.records import NamedTuple

RECENT_IDS = 32  # native ids of the last turns reported, kept in the marker


def first_prompt(
    fmt: JsonlFormat[Any], first: list[dict[str, Any]], rest: Iterable[dict[str, Any]] = ()
) -> str | None:
    """The first direct human prompt among ``first`` then ``rest`` (the file's first
    records; ``rest`` is read only until one is found), as the classifier finds it, on one
    line; None when there is none."""
    state = fmt.state_from_first(first[0] if first else None)
    for record in itertools.chain(first, rest):
        verdict = fmt.classify(record, state)
        text = _prompt_text(fmt, record) if verdict is not None and verdict.turn else None
        if text:
            return text
    return None


def _prompt_text(fmt: JsonlFormat[Any], record: dict[str, Any]) -> str:
    """The text of a record counted as a turn, on one line."""
    return " ".join(fmt.prompt_text(record).split())


def parse_line(line: bytes, *, recover: bool) -> Any:
    """A line's JSON value, tolerating what orjson refuses; None when it is not JSON."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        pass
    try:  # lone surrogates are JSON; invalid UTF-8 is read with replacement characters,
        return json.loads(line.decode("utf-8-sig", "replace"))  # and a leading BOM dropped
    except ValueError:
        pass
    return _recovered(line) if recover else None


def _recovered(line: bytes) -> Any:
    """The whole record after a torn fragment on the same line; None when there is none."""
    start = line.find(b'{"', 1)
    while start > 0:
        try:
            return json.loads(line[start:].decode("utf-8", "replace"))
        except ValueError:
            start = line.find(b'{"', start + 1)
    return None


def time_ms(record: dict[str, Any]) -> int | None:
    at = parse_time(record.get("timestamp"))
    return int(at.timestamp() * 1000) if at else None


@dataclass
class ScanResult:
    turns: list[Turn] = field(default_factory=list)
    compactions: list[str] = field(default_factory=list)
    invalid: list[int] = field(default_factory=list)  # offsets of invalid complete lines
    stopped_at: int | None = None  # strict formats: the first invalid row
    latest_at: int | None = None  # the newest turn's time
    seen_at: int | None = None  # the newest record time read
    drift: Drift = field(default_factory=Drift)


class Cutoff(NamedTuple):
    """While a rotated or truncated file is re-read: only what is newer than ``after`` (ms)
    and not among the ``recent`` native ids is new."""

    after: int
    recent: frozenset[str] = frozenset()

    @classmethod
    def of(cls, marker: Marker) -> Cutoff | None:
        """The cutoff of a marker that is re-reading its source, else None."""
        after = as_int(member(marker.get("reread"), "after"))
        return None if after is None else cls(after=after, recent=frozenset(_recent(marker)))

    def is_old(self, record: dict[str, Any], native_id: str | None) -> bool:
        if native_id is not None and native_id in self.recent:
            return True
        at = time_ms(record)
        return at is not None and at <= self.after


def _ms(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _recent(marker: Marker) -> list[str]:
    """The native ids of the last turns a marker holds."""
    return [r for r in as_list(marker.get("recent")) if isinstance(r, str)]


def reread_from(marker: Marker, last_scanned_at: int | None, reason: str) -> Marker:
    """What a source read again from its start carries over: only what is newer than the
    newest record seen (else the last scan, else now) and not a recent turn will count."""
    after = _ms(marker.get("seenAt")) or last_scanned_at or int(time.time() * 1000)
    return {
        "reread": {"reason": reason, "after": after},
        "recent": marker.get("recent") or [],
        "seenAt": marker.get("seenAt"),
    }


def remembered(marker: Marker, result: ScanResult) -> Marker:
    """``recent`` (the last turns' native ids) and ``seenAt`` (the newest record time, left
    out while no record had one) after a scan."""
    recent = _recent(marker) + [t.native_id for t in result.turns if t.native_id]
    seen = max(_ms(marker.get("seenAt")), result.seen_at or 0)
    return {"recent": recent[-RECENT_IDS:], **({"seenAt": seen} if seen else {})}


def _note(result: ScanResult, fmt: JsonlFormat[Any], verdict: Verdict) -> None:
    drift = result.drift
    if verdict.version is not None:
        drift.see_version(verdict.version, fmt.tested_version)
    if verdict.unknown_type is not None:
        drift.count_type(verdict.unknown_type)
    if verdict.unclassified:
        drift.unclassified += 1


def _shaped(buf: bytes, start: int, stop: int) -> bool:
    """Whether ``buf[start:stop]`` is shaped like a record: ``{`` … ``}``."""
    return buf[start] == 0x7B and buf[stop - 1] == 0x7D


class Selection(NamedTuple):
    """What :func:`select` found: the lines :func:`scan` reads, the offset of the first
    line that is not blank (None: none is), and that of the first line longer than
    ``max_line`` (the selection ends before it)."""

    lines: list[tuple[int, bytes | None]]
    first: int | None
    long_at: int | None = None


def select(
    fmt: JsonlFormat[Any], chunk: bytes, base: int, stop: int, max_line: int | None = None
) -> Selection:
    """What :func:`scan` reads of the complete lines of ``chunk[:stop]`` (file offset
    ``base``), found in place: every line the pre-filter lets through, and (as None) every
    line it does not that is not even shaped like a record. The rest cannot matter, and is
    never copied out of the chunk. Leading NUL padding and blank lines are dropped, as
    :func:`adapters.tailer.split_lines` drops them."""
    prefilter = fmt.prefilter or _every
    limit = max_line if max_line is not None else stop
    out: list[tuple[int, bytes | None]] = []
    append = out.append
    find = chunk.find
    first: int | None = None
    pos = 0
    while pos < stop:
        start = pos
        end = find(b"\n", start)
        pos = end + 1
        if end - start <= limit and chunk[start] == 0x7B and chunk[end - 1] == 0x7D:
            # the common case: shaped like a record, unpadded, not too long
            if prefilter(chunk, start, end):
                append((base + start, chunk[start:end]))
            if first is None:
                first = base + start
            continue
        line = chunk[start:end].lstrip(b"\x00").strip()
        if not line:
            continue
        if first is None:
            first = base + start
        if len(line) > limit:
            return Selection(out, first, base + start)
        _pick(prefilter, base + start, line, append)
    return Selection(out, first)


def _every(buf: bytes, start: int, stop: int) -> bool:
    return True


def _pick(
    prefilter: Callable[[bytes, int, int], bool],
    offset: int,
    line: bytes,
    append: Callable[[tuple[int, bytes | None]], None],
) -> None:
    """Append ``line`` as :func:`scan` reads it: as it is when the pre-filter lets it
    through, as None when it is not even shaped like a record, not at all otherwise."""
    if prefilter(line, 0, len(line)):
        append((offset, line))
    elif not _shaped(line, 0, len(line)):
        append((offset, None))


def selected(
    fmt: JsonlFormat[Any], lines: list[tuple[int, bytes]] | list[tuple[int, bytes | None]]
) -> list[tuple[int, bytes | None]]:
    """:func:`select` of lines already split (a line given as None stays None)."""
    prefilter = fmt.prefilter
    if prefilter is None:
        return list(lines)
    out: list[tuple[int, bytes | None]] = []
    append = out.append
    for offset, line in lines:
        if line is None:
            append((offset, None))
        else:
            _pick(prefilter, offset, line, append)
    return out


def scan(
    fmt: JsonlFormat[Any],
    lines: list[tuple[int, bytes]] | list[tuple[int, bytes | None]],
    state: Any,
    own: OwnPool,
    cutoff: Cutoff | None = None,
    *,
    prefiltered: bool = False,
) -> ScanResult:
    """Classify complete lines in order; updates ``state`` and consumes from ``own``. A
    line given as None was judged invalid where it was read (see :func:`select`);
    ``prefiltered``: the pre-filter has already been applied to the rest."""
    result = ScanResult()
    picked = lines if prefiltered else selected(fmt, lines)
    records = _records(fmt, picked, state, result)
    return classify_records(fmt, records, state, own, cutoff, result)


def _records(
    fmt: JsonlFormat[Any],
    lines: list[tuple[int, bytes]] | list[tuple[int, bytes | None]],
    state: Any,
    result: ScanResult,
) -> Iterator[tuple[int | None, dict[str, Any]]]:
    """The records of ``lines``, parsed one at a time as they are classified: a record is
    let go before the next is made, where a list of a check's records held them all (and
    made each parse cost a fifth more), and a line is parsed only if, with the state the
    records before it left, it can matter (``fmt.idle``). A line that is not a record is
    noted in ``result``, and a strict format stops there."""
    idle = fmt.idle
    for offset, line in lines:
        if idle is not None and line is not None and idle(state, line):
            continue
        record = parse_line(line, recover=not fmt.strict) if line is not None else None
        if not isinstance(record, dict):
            if fmt.strict:
                result.stopped_at = offset
                return
            _invalid(result, offset)
            continue
        yield offset, record


def classify_records(
    fmt: JsonlFormat[Any],
    records: Iterable[tuple[int | None, dict[str, Any]]],
    state: Any,
    own: OwnPool,
    cutoff: Cutoff | None = None,
    result: ScanResult | None = None,
) -> ScanResult:
    """Classify parsed records (with their offsets, where they have one) in order."""
    result = result if result is not None else ScanResult()
    last: dict[str, Any] | None = None
    for offset, record in records:
        last = record
        verdict = fmt.classify(record, state)
        if verdict is None:
            continue
        _note(result, fmt, verdict)
        if verdict.compaction is not None or verdict.turn is not None:
            _candidate(fmt, result, offset, record, verdict, own, cutoff)
    if last is not None:
        _seen(result, time_ms(last))
    return result


def _candidate(
    fmt: JsonlFormat[Any],
    result: ScanResult,
    offset: int | None,
    record: dict[str, Any],
    verdict: Verdict,
    own: OwnPool,
    cutoff: Cutoff | None,
) -> None:
    """A record that may be a turn or a compaction: counted unless the re-read cutoff says
    it was read before, or (a turn) it is the session's own text coming back."""
    native = fmt.native_id(record)
    at = time_ms(record)
    _seen(result, at)  # every candidate counts, suppressed or not: the re-read cutoff
    if cutoff is not None and cutoff.is_old(record, native):
        return
    _compaction(result, verdict.compaction)
    if verdict.turn is None or own.consume(verdict.turn):
        return
    result.turns.append(Turn(offset=offset, native_id=native, text_hash=verdict.turn))
    result.latest_at = at or result.latest_at


def _compaction(result: ScanResult, compaction: str | None) -> None:
    if compaction is not None and compaction not in result.compactions:
        result.compactions.append(compaction)


def _seen(result: ScanResult, at: int | None) -> None:
    if at is not None:
        result.seen_at = max(result.seen_at or 0, at)


def _invalid(result: ScanResult, offset: int) -> None:
    result.invalid.append(offset)
    result.drift.invalid += 1
    result.drift.last_invalid_offset = offset
