"""The JSONL adapters (Claude, Codex, Pi): one tailer, three classifiers.

A :class:`JsonlFormat` names a format's classifier, its cheap pre-filter and its per-file
state; :class:`JsonlAdapter` tails each linked file from its marker and classifies what it
reads. :func:`scan` is the part both the monitor and ``sessionwatch replay`` run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from adapters import claude, codex, pi
from adapters.base import Declined, Marker, Outcome, Probe, Turn
from adapters.pi import parse_time
from adapters.tailer import end_of_last_line, read_tail

log = logging.getLogger(__name__)

DEFAULT_SCAN_CAP = 1_048_576


@dataclass(frozen=True, kw_only=True)
class JsonlFormat:
    kind: str
    classify: Callable[[dict[str, Any], Any], str | None]
    native_id: Callable[[dict[str, Any]], str | None]
    state_from_marker: Callable[[Marker], Any]
    state_from_first: Callable[[Any], Any]  # the first record (None for an empty file)
    prefilter: Callable[[bytes], bool] | None  # False: cannot matter; None: parse every line
    strict: bool  # stop at the first invalid row instead of counting it
    declines: Callable[[Any], str | None] = lambda state: None  # why a source is not adoptable


def _claude_first(_: Any) -> claude.ClaudeState:
    return claude.ClaudeState()


def _codex_first(record: Any) -> codex.CodexState:
    return codex.state_from_first_record(record) if isinstance(record, dict) else codex.CodexState()


def _codex_declines(state: Any) -> str | None:
    return "a Codex sub-agent rollout is not adoptable" if state.subagent else None


def _pi_first(record: Any) -> pi.PiState:
    return pi.state_from_header(record)


FORMATS = {
    "claude": JsonlFormat(
        kind="claude",
        classify=claude.classify_claude_record,
        native_id=claude.claude_native_id,
        state_from_marker=claude.ClaudeState.from_marker,
        state_from_first=_claude_first,
        prefilter=claude.may_be_turn,
        strict=False,
    ),
    "codex": JsonlFormat(
        kind="codex",
        classify=codex.classify_codex_record,
        native_id=lambda record: None,
        state_from_marker=codex.CodexState.from_marker,
        state_from_first=_codex_first,
        prefilter=codex.may_be_turn,
        strict=False,
        declines=_codex_declines,
    ),
    "pi": JsonlFormat(
        kind="pi",
        classify=pi.classify_pi_record,
        native_id=pi.pi_native_id,
        state_from_marker=pi.PiState.from_marker,
        state_from_first=_pi_first,
        prefilter=None,
        strict=True,
    ),
}


@dataclass
class ScanResult:
    turns: list[Turn] = field(default_factory=list)
    invalid: list[int] = field(default_factory=list)  # offsets of invalid complete lines
    stopped_at: int | None = None  # strict formats: the first invalid row
    latest_at: int | None = None


def _time_ms(record: dict[str, Any]) -> int | None:
    at = parse_time(record.get("timestamp"))
    return int(at.timestamp() * 1000) if at else None


def scan(
    fmt: JsonlFormat, lines: list[tuple[int, bytes]], state: Any, own: frozenset[str]
) -> ScanResult:
    """Classify complete lines in order; updates ``state``."""
    result = ScanResult()
    prefilter = fmt.prefilter
    for offset, line in lines:
        if prefilter is not None and not prefilter(line):
            if not (line[:1] == b"{" and line[-1:] == b"}"):
                result.invalid.append(offset)
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            if fmt.strict:
                result.stopped_at = offset
                return result
            result.invalid.append(offset)
            continue
        digest = fmt.classify(record, state)
        if digest is None or digest in own:
            continue
        result.turns.append(Turn(offset=offset, native_id=fmt.native_id(record), text_hash=digest))
        result.latest_at = _time_ms(record) or result.latest_at
    return result


def first_record(path: str, cap: int = DEFAULT_SCAN_CAP) -> Any:
    """The file's first complete line, parsed; None when there is none or it is not JSON."""
    read = read_tail(path, 0, cap, None)
    if not read.lines:
        return None
    try:
        return orjson.loads(read.lines[0][1])
    except orjson.JSONDecodeError:
        return None


def baseline_file(fmt: JsonlFormat, path: str) -> Marker:
    """The marker at the end of the file's last complete line. Raises Declined / OSError."""
    offset, head = end_of_last_line(path)
    state = fmt.state_from_first(first_record(path) if offset > 0 else None)
    reason = fmt.declines(state)
    if reason:
        raise Declined(reason)
    return {"offset": offset, "head": head, **state.to_marker()}


def check_file(fmt: JsonlFormat, probe: Probe, cap: int) -> Outcome:
    """One link, one tick. Only "no such file" is a miss; other OS errors are inconclusive."""
    path = str(probe.ref.get("filePath", ""))
    marker = probe.marker
    offset = int(marker.get("offset", marker.get("size", 0)) or 0)
    try:
        read = read_tail(path, offset, cap, marker.get("head"))
        if read.status == "replaced":
            log.info("%s: %s was replaced; re-baselined at its end", probe.session_key, path)
            return Outcome(status="quiet", marker=baseline_file(fmt, path), reason="replaced")
    except FileNotFoundError:
        return Outcome(status="missing", reason="no such file")
    except Declined as exc:
        return Outcome(status="inconclusive", reason=str(exc))
    except OSError as exc:
        return Outcome(status="inconclusive", reason=exc.strerror or type(exc).__name__)
    if read.status in ("idle", "waiting"):
        return Outcome(status="quiet", marker=marker)
    if read.status == "blocked":
        reason = f"a line longer than the scan cap ({cap} bytes) starts at offset {offset}"
        return Outcome(status="blocked", blocked_offset=offset, reason=reason)
    state = fmt.state_from_marker(marker)
    result = scan(fmt, read.lines, state, probe.own_hashes)
    for bad in result.invalid:
        log.warning("%s: invalid line at offset %d of %s", probe.session_key, bad, path)
    end = read.end if result.stopped_at is None else result.stopped_at
    if result.stopped_at is not None and result.stopped_at == offset:
        reason = f"invalid row at offset {offset}"
        return Outcome(status="blocked", blocked_offset=offset, reason=reason)
    new_marker = {
        **marker,
        "offset": end,
        "head": marker.get("head") or read.head,
        **state.to_marker(),
    }
    new_marker.pop("size", None)
    return Outcome(
        status="activity",
        marker=new_marker,
        turns=result.turns,
        dedupe_id=str(end),
        latest_at=result.latest_at,
        invalid_lines=len(result.invalid),
    )


class JsonlAdapter:
    """Tails linked JSONL files; the whole batch runs in one worker thread."""

    def __init__(self, fmt: JsonlFormat, *, scan_cap: int = DEFAULT_SCAN_CAP) -> None:
        self.kind = fmt.kind
        self.format = fmt
        self.scan_cap = scan_cap

    async def baseline(self, ref: dict[str, Any]) -> Marker:
        path = str(ref.get("filePath", ""))
        try:
            return await asyncio.to_thread(baseline_file, self.format, path)
        except OSError as exc:
            raise Declined(f"cannot read {path}: {exc.strerror or exc}") from None

    async def check(self, probes: list[Probe]) -> list[Outcome]:
        return await asyncio.to_thread(self._check_all, probes)

    def _check_all(self, probes: list[Probe]) -> list[Outcome]:
        out = []
        for probe in probes:
            try:
                out.append(check_file(self.format, probe, self.scan_cap))
            except Exception as exc:  # one link's failure is its own
                log.exception("%s: check failed", probe.session_key)
                out.append(Outcome(status="inconclusive", reason=type(exc).__name__))
        return out
