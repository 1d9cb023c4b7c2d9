"""Tailing linked JSONL files (Claude, Codex, Pi): one check per link and tick.

The marker of a JSONL link: ``offset`` (after the last complete line read), ``head`` and
``ino`` (the file's identity), ``tail`` (a fingerprint of the bytes before the offset) and
``mtime`` (when the file was read: a file of the same size, inode and mtime is idle after
one stat), ``seenAt`` (the newest record time read), ``recent`` (native
ids of the last turns reported), ``drift`` (see :class:`adapters.base.Drift`), ``changes``
(how often the file was rotated or truncated), the format's own state, and while they last:

- ``long``: bytes of a line longer than the scan cap read so far. Such a line (a prompt with
  a pasted screenshot) is read a cap's worth per tick, held aside unparsed, and classified
  once its newline arrives; only a line longer than ``max_line_bytes`` blocks the link.
- ``reread``: a rotated or truncated file is read again from its start, and only records
  newer than ``after`` (the newest record time read before) and not among ``recent`` count,
  so nothing written since the last check is lost and nothing from before is repeated. The
  filter lasts until a read has reached both the file's end and ``upto``, the offset read
  before the change: a file rewritten in place, in chunks, is seen mid-rewrite as a short
  file, and the rest of its old content arrives after that as if appended.

The path is resolved at every read: one that now leads outside the configured root (a
symlink swapped in, a moved directory) is not read. Only regular files are opened.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import stat
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from adapters import zst
from adapters.base import (
    DEFAULT_MAX_LINE,
    DEFAULT_SCAN_CAP,
    Drift,
    FileSource,
    Marker,
    Outcome,
    OwnPool,
    Probe,
    Ref,
    Settings,
    Source,
    non_negative_int,
    text_hash,
)
from adapters.jsonl_format import JsonlFormat
from adapters.jsonl_scan import (
    Cutoff,
    ScanResult,
    Selection,
    parse_line,
    remembered,
    reread_from,
    scan,
    select,
    selected,
)
from adapters.tailer import (
    NotRegularFile,
    TailRead,
    describe,
    end_of_last_line,
    open_regular,
    read_at,
    read_tail,
    split_lines,
    tail_digest,
)
from adapters.threads import DaemonReads, SourceBusy
from monitor.errors import BadInput, Declined, OutsideRoots
from monitor.lazylog import LazyLogger
from monitor.records import NamedTuple

if TYPE_CHECKING:
    from adapters.catalog import CatalogEntry, CatalogListing  # built only by the catalog

log = LazyLogger(__name__)  # ``replay`` is a one-shot command, and rarely logs

READ_TIMEOUT_S = 10.0
OUTSIDE_ROOTS = "outside the configured roots"

HeldLines = dict[tuple[str, int | None, int], bytearray]


class TailSettings(NamedTuple):
    cap: int = DEFAULT_SCAN_CAP
    max_line: int = DEFAULT_MAX_LINE
    root: str = ""  # the configured root the file must resolve inside ("" checks nothing)


class RootCheck:
    """Where a linked path really leads, and whether that is inside the root.

    Resolved at every read; directories are resolved once per batch (many links share a
    project directory), the file itself with one ``lstat`` unless it is a symlink."""

    def __init__(self, root: str) -> None:
        self.base = os.path.realpath(os.path.expanduser(root)) if root else ""
        self._dirs: dict[str, str] = {}

    def resolve(self, path: str) -> str | None:
        """The real path of ``path`` when it resolves inside the root, else None."""
        path = os.path.expanduser(path)
        folder, name = os.path.split(path)
        real_dir = self._dirs.get(folder)
        if real_dir is None:
            real_dir = self._dirs[folder] = os.path.realpath(folder)
        real = os.path.join(real_dir, name)
        try:
            if stat.S_ISLNK(os.lstat(real).st_mode):
                real = os.path.realpath(real)
        except OSError:
            pass  # missing or unreadable: the read says which
        if not self.base or real == self.base or real.startswith(self.base + os.sep):
            return real
        return None


def resolve_file(kind: str, path: str, root: str) -> str:
    """The real path of a file ref, which must lie inside the kind's root (``path`` is
    already expanded)."""
    base = os.path.realpath(root) if root else ""
    real = os.path.realpath(path)
    if not base or os.path.commonpath([base, real]) != base:
        raise OutsideRoots(f"{path} is not inside the configured {kind} root {base}")
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:  # a mistyped path: refused, nothing is adopted
        raise BadInput(f"no such file: {path}") from None
    except OSError as exc:
        raise Declined(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise Declined(f"cannot read {path}: not a regular file ({describe(mode)})")
    return real


def first_line(path: str, cap: int = DEFAULT_SCAN_CAP) -> bytes | None:
    """The file's first complete line (None when there is none within ``cap``)."""
    lines = read_tail(path, 0, cap, None).lines()
    return lines[0][1] if lines else None


def first_record(path: str, cap: int = DEFAULT_SCAN_CAP) -> Any:
    """The file's first complete line, parsed; None when there is none or it is not JSON."""
    line = first_line(path, cap)
    return parse_line(line, recover=False) if line is not None else None


def _first_line(chunk: bytes) -> bytes | None:
    lines = split_lines(chunk, 0, chunk.find(b"\n") + 1)
    return lines[0][1] if lines else None


def file_end(fmt: JsonlFormat[Any], path: str) -> tuple[Marker, bytes | None]:
    """Where the file's last complete line ends (``offset``, ``head``, ``ino``, ``tail``: of
    the plain file a compressed one stands for, when only that is left), and its first
    complete line. Raises Declined / OSError. A local baseline and a node's both read it."""
    packed = zst.compressed_sibling(path)
    try:
        if fmt.compressed and not os.path.exists(path) and os.path.exists(packed):
            offset, head, tail = zst.end_of_last_line(packed)
            ino = None  # the plain file's own, once the harness writes it back
            first = _first_line(zst.head(packed, DEFAULT_SCAN_CAP)) if offset > 0 else None
        else:
            offset, head, ino, tail = end_of_last_line(path)
            first = first_line(path) if offset > 0 else None
    except NotRegularFile as exc:
        raise Declined(str(exc)) from None
    return {"offset": offset, "head": head, "ino": ino, "tail": tail}, first


def baseline_file(fmt: JsonlFormat[Any], path: str) -> Marker:
    """The marker at the end of the file's last complete line. Raises Declined / OSError."""
    where, first = file_end(fmt, path)
    state = fmt.state_from_first(parse_line(first, recover=False) if first else None)
    reason = fmt.declines(state)
    if reason:
        raise Declined(reason)
    return {**where, **state.to_marker()}


def check_file(
    fmt: JsonlFormat[Any],
    probe: Probe,
    settings: TailSettings,
    held: HeldLines,
    roots: RootCheck | None = None,
) -> Outcome:
    """One link, one tick. Only "no such file" is a miss; other failures are inconclusive."""
    check = roots if roots is not None else RootCheck(settings.root)
    real = check.resolve(str(probe.ref.get("filePath", "")))
    if real is None:
        return Outcome(status="inconclusive", reason=OUTSIDE_ROOTS)
    marker = probe.marker
    offset = non_negative_int(marker.get("offset", marker.get("size", 0)))
    resume = non_negative_int(marker.get("long"))
    try:
        tail = marker.get("tail")
        read = read_tail(
            real,
            offset,
            settings.cap,
            marker.get("head"),
            marker.get("ino"),
            resume,
            tail if isinstance(tail, str) else None,
            non_negative_int(marker.get("mtime")) or None,
        )
        if read.status in ("rotated", "truncated"):
            return _reread(fmt, probe, read, settings, held)
        if read.status == "idle" or (read.status == "waiting" and not resume):
            return idle(marker, read)
        capped = read.size - read.start > settings.cap  # more written than this read took
        if read.status in ("long", "waiting"):
            return _more(_hold(real, offset, resume, read, marker, settings, held), capped)
        if resume:
            joined = _join(real, offset, resume, read, held)
            joined, read = up_to_a_long_line(real, joined, read, settings.max_line)
            whole = Selection(selected(fmt, joined), joined[0][0]) if joined else None
            pick = whole or Selection([], read.end, long_at=read.end)  # too long whole
        else:
            pick, read = complete_lines(fmt, real, read, settings.max_line)
        if pick.long_at is not None and pick.long_at == pick.first:
            reason = f"a line longer than max_line_bytes ({settings.max_line}) starts at {read.end}"
            return Outcome(status="blocked", blocked_offset=read.end, reason=reason)
        state = fmt.state_from_marker(marker)
        own = OwnPool(probe.own)
        result = scan(fmt, pick.lines, state, own, Cutoff.of(marker), prefiltered=True)
    except FileNotFoundError:
        kept = kept_elsewhere(fmt, real, settings.root)
        if kept:  # compressed or archived by the harness: idle, not gone
            return Outcome(status="quiet", marker=marker, reason=kept)
        return Outcome(status="missing", reason="no such file")
    except (NotRegularFile, Declined) as exc:
        return Outcome(status="inconclusive", reason=str(exc))
    except OSError as exc:
        return Outcome(status="inconclusive", reason=exc.strerror or type(exc).__name__)
    return _more(settled(fmt, probe, read, pick.first, result, state, own), capped)


def _more(outcome: Outcome, capped: bool) -> Outcome:
    """``outcome``, saying that more is to read now when the read stopped at the cap and
    the check moved on (a block waits for what unblocks it, not for a check)."""
    if capped and outcome.status in ("activity", "quiet"):
        return dataclasses.replace(outcome, more=True)
    return outcome


def kept_elsewhere(fmt: JsonlFormat[Any], real: str, root: str) -> str | None:
    """Why a file gone from its path is not gone: the harness compressed it beside itself
    (followed when it is written back) or moved it to its archive. None: really gone."""
    if fmt.compressed and os.path.isfile(zst.compressed_sibling(real)):
        name = os.path.basename(zst.compressed_sibling(real))
        return f"compressed by the harness to {name}; followed when the session is resumed"
    return fmt.moved(real, root)


def up_to_a_long_line(
    path: str, lines: list[tuple[int, bytes]], read: TailRead, max_line: int
) -> tuple[list[tuple[int, bytes]], TailRead]:
    """The lines before the first longer than ``max_line`` (its newline came within this
    read), and the read ending where it starts: the next check blocks on it."""
    for i, (offset, line) in enumerate(lines):
        if len(line) > max_line:
            return lines[:i], ending_at(path, read, offset)
    return lines, read


def complete_lines(
    fmt: JsonlFormat[Any], path: str, read: TailRead, max_line: int
) -> tuple[Selection, TailRead]:
    """What the scan reads of the read's complete lines (:func:`select`), up to the first
    longer than ``max_line``, and the read ending where that one starts."""
    pick = select(fmt, read.chunk, read.start, read.end - read.start, max_line)
    if pick.long_at is None:
        return pick, read
    return pick, ending_at(path, read, pick.long_at)


def ending_at(path: str, read: TailRead, offset: int) -> TailRead:
    """``read`` ending at ``offset``, a line's start, with the fingerprint taken there."""
    fd, _ = open_regular(path)
    try:
        tail = tail_digest(fd, offset)
    finally:
        os.close(fd)
    return read._replace(end=offset, tail=tail)


def idle(marker: Marker, read: TailRead) -> Outcome:
    moved = read.ino is not None and marker.get("ino") != read.ino  # the same bytes, anew
    ended = "reread" in marker and not rereading(marker, read.end, read.size)
    unknown = (read.head and not marker.get("head")) or "mtime" not in marker  # taken now
    if ended or unknown or moved:
        done = {k: v for k, v in marker.items() if k != "reread" or not ended}
        return Outcome(
            status="quiet",
            marker={
                **done,
                "head": read.head,
                "ino": read.ino,
                "tail": read.tail,
                "mtime": read.mtime,
            },
        )
    # a file only touched (or rewritten as it was) keeps its marker: no write for that, and
    # each check opens it until the next write moves the marker
    return Outcome(status="quiet", marker=marker)


def rereading(marker: Marker, end: int, size: int) -> bool:
    """Whether ``marker``'s re-read still filters after a read that reached ``end`` of a
    file of ``size`` bytes: until it has reached both the end and the offset read before
    the file changed (a rewrite in place may be only partly written yet)."""
    reread = marker.get("reread")
    if not isinstance(reread, dict):
        return False
    return end < size or end < non_negative_int(reread.get("upto"))


def settled(
    fmt: JsonlFormat[Any],
    probe: Probe,
    read: TailRead,
    first: int | None,
    result: ScanResult,
    state: Any,
    own: OwnPool,
) -> Outcome:
    """The outcome of a read whose lines were scanned; ``first``: the offset of its first
    line that is not blank (None: there is none)."""
    marker = probe.marker
    first = read.end if first is None else first
    if result.stopped_at is not None and result.stopped_at == first:
        reason = f"invalid row at offset {first}"
        return Outcome(status="blocked", blocked_offset=first, reason=reason)
    end = read.end if result.stopped_at is None else result.stopped_at
    old = Drift.from_json(marker.get("drift"))
    _log_drift(probe.session_key, fmt.kind, old, result)
    new_marker = {
        **{k: v for k, v in marker.items() if k not in ("size", "long", "reread", "seenAt")},
        "offset": end,
        "head": read.head,
        "ino": read.ino,
        "tail": read.tail if end == read.end else None,  # stopped early: no fingerprint
        "mtime": read.mtime,
        **remembered(marker, result),
        "drift": old.merged(result.drift).to_json(),
        **state.to_marker(),
    }
    if rereading(marker, end, read.size):
        new_marker["reread"] = marker["reread"]  # not caught up yet
    return Outcome(
        status="activity",
        marker=new_marker,
        turns=result.turns,
        dedupe_id=dedupe_id(marker, end),
        latest_at=result.latest_at,
        invalid_lines=len(result.invalid),
        compactions=result.compactions,
        consumed_own=own.consumed,
        drift=result.drift if result.drift else None,
        reason=_reread_reason(marker),
        read_from=_read_from(marker),
    )


def _read_from(marker: Marker) -> int | None:
    """Where a plain read of a file never rotated nor truncated began (another checker's
    offsets are then in the same file as ours); else None."""
    if "reread" in marker or marker.get("changes"):
        return None
    return non_negative_int(marker.get("offset"))


def dedupe_id(marker: Marker, end: int) -> str:
    """The dedupe id of turns read up to ``end``: the offset, as the gateway's monitor
    writes it; once the file was rotated or truncated, with the count of those changes
    (``4096r1``), since its offsets start again and an end may be one recorded before."""
    changes = marker.get("changes")
    n = sum(non_negative_int(v) for v in changes.values()) if isinstance(changes, dict) else 0
    return f"{end}r{n}" if n else str(end)


def _reread_reason(marker: Marker) -> str | None:
    reread = marker.get("reread")
    return f"re-reading a {reread.get('reason')} file" if isinstance(reread, dict) else None


def _log_drift(key: str, kind: str, old: Drift, found: ScanResult) -> None:
    """Once per link and kind of drift: a new record type, the first unclassified user
    record, a newer declared version, and every invalid line (each is read once)."""
    new = found.drift
    for record_type in new.unknown_types:
        if record_type not in old.unknown_types:
            log.warning("%s: %s record of unknown type %r (format drift?)", key, kind, record_type)
    if new.unclassified and not old.unclassified:
        log.warning("%s: a %s record looks like a user's but no rule classifies it", key, kind)
    if new.newer and new.version != old.version:
        log.warning("%s: %s format version %s is newer than tested", key, kind, new.version)
    for offset in found.invalid:
        log.warning("%s: %s line at offset %d is not JSON; skipped", key, kind, offset)


def reread_marker(probe: Probe, reason: str, where: str) -> Marker:
    """The marker that reads a rotated or truncated file (``where``, as the log names it)
    again from its start, counting the change; said once, in the log."""
    marker = probe.marker
    carried = reread_from(marker, probe.last_scanned_at, reason)
    old = marker.get("reread")  # changed again mid-re-read: what was old then still is
    if isinstance(old, dict):
        after = max(non_negative_int(old.get("after")), carried["reread"]["after"])
        upto = max(non_negative_int(old.get("upto")), non_negative_int(marker.get("offset")))
    else:
        after, upto = carried["reread"]["after"], non_negative_int(marker.get("offset"))
    carried["reread"].update(after=after, upto=upto)
    changes = dict(marker.get("changes") or {})
    changes[reason] = non_negative_int(changes.get(reason)) + 1
    log.warning(
        "%s: %s was %s; re-reading it for what was written after %d",
        probe.session_key,
        where,
        reason,
        carried["reread"]["after"],
    )
    return {"offset": 0, **carried, "drift": marker.get("drift"), "changes": changes}


def _reread(
    fmt: JsonlFormat[Any], probe: Probe, read: TailRead, settings: TailSettings, held: HeldLines
) -> Outcome:
    fresh = reread_marker(probe, read.status, str(probe.ref.get("filePath")))
    return check_file(fmt, probe._replace(marker=fresh), settings, held, None)


def _hold(
    path: str,
    offset: int,
    resume: int,
    read: TailRead,
    marker: Marker,
    settings: TailSettings,
    held: HeldLines,
) -> Outcome:
    """A line longer than the cap: hold this tick's piece aside until its newline comes."""
    key = (path, read.ino, offset)
    buffer = held.get(key)
    if buffer is None or len(buffer) != resume:
        buffer = bytearray(read_at(path, offset, resume)) if resume else bytearray()
    buffer += read.chunk
    total = resume + len(read.chunk)
    if total > settings.max_line:
        held.pop(key, None)
        reason = f"a line longer than max_line_bytes ({settings.max_line}) starts at {offset}"
        return Outcome(status="blocked", blocked_offset=offset, reason=reason)
    held[key] = buffer
    return Outcome(
        status="quiet",
        marker={**marker, "long": total, "head": read.head, "ino": read.ino, "mtime": read.mtime},
        reason=f"reading a long line at offset {offset}: {total} bytes so far",
    )


def _join(
    path: str, offset: int, resume: int, read: TailRead, held: HeldLines
) -> list[tuple[int, bytes]]:
    """The long line at ``offset`` completed by this read, then the lines after it."""
    buffer = held.pop((path, read.ino, offset), None)
    if buffer is None or len(buffer) != resume:
        buffer = bytearray(read_at(path, offset, resume))  # after a restart: read it again
    newline = read.chunk.find(b"\n")
    line = (bytes(buffer) + read.chunk[:newline]).lstrip(b"\x00").strip()
    complete = read.end - (offset + resume)  # the chunk's bytes up to its last newline
    rest = split_lines(read.chunk[newline + 1 : complete], offset + resume + newline + 1)
    return ([(offset, line)] if line else []) + rest


class JsonlAdapter(FileSource):
    """Tails linked JSONL files, each link's read in its own daemon thread."""

    def __init__(
        self, fmt: JsonlFormat[Any], settings: Settings, *, read_timeout: float = READ_TIMEOUT_S
    ) -> None:
        self.kind = fmt.kind
        self.format = fmt
        self.root = settings.root(fmt.kind)
        self.settings = TailSettings(
            cap=settings.scan_cap, max_line=settings.max_line, root=self.root
        )
        self.reads = DaemonReads(fmt.kind, timeout=read_timeout)
        self.held: HeldLines = {}

    @property
    def scan_cap(self) -> int:
        return self.settings.cap

    @scan_cap.setter
    def scan_cap(self, cap: int) -> None:
        self.settings = self.settings._replace(cap=cap)

    def resolve(self, path: str, thread: str | None) -> Source:
        """A file inside the kind's root; its thread id comes from its name. A compressed
        file (or a plain path only its compressed sibling is left of) names the plain file,
        which the harness writes back when the session is resumed."""
        real = self._resolve_plain(path) if self.format.compressed else None
        real = real or resolve_file(self.kind, path, self.root)
        thread_id = self.format.thread_id(os.path.basename(real).removesuffix(".jsonl"))
        ref: Marker = {"filePath": real}
        if self.format.ref_thread:
            ref["threadId"] = thread_id
        return Source(ref=ref, thread_id=thread_id)

    def _resolve_plain(self, path: str) -> str | None:
        plain = zst.plain_of(path)
        packed = zst.compressed_sibling(plain)
        if os.path.exists(plain) or not os.path.exists(packed):
            return None
        return zst.plain_of(resolve_file(self.kind, packed, self.root))

    async def catalog(self) -> CatalogListing:
        from adapters.jsonl_catalog import scan_files

        return await _scanned(scan_files, self.format, self.root)

    def entry_of(self, ref: Ref) -> CatalogEntry | None:
        """The catalog entry of one linked file (its title), read from its head and tail
        only; None when it cannot be read now."""
        from adapters.jsonl_catalog import file_entry

        path = ref.get("filePath")
        if not isinstance(path, str) or not path:
            return None
        try:
            return file_entry(self.format, path)
        except (OSError, ValueError):
            return None

    async def catalog_matching(self, digest: str) -> CatalogListing:
        """The entries whose id's digest starts with ``digest``: only their files are read."""
        from adapters.jsonl_catalog import scan_files

        return await _scanned(scan_files, self.format, self.root, digest)

    def replay(
        self, path: str, thread: str | None, own_texts: list[str]
    ) -> Iterator[dict[str, Any]]:
        return replay_file(self.format, path, own_texts, self.settings)

    async def baseline(self, ref: Ref) -> Marker:
        path = str(ref.get("filePath", ""))
        try:
            return await self.reads.run(f"baseline:{path}", baseline_file, self.format, path)
        except (SourceBusy, TimeoutError):
            raise Declined(f"cannot read {path}: the read did not return") from None
        except OSError as exc:
            raise Declined(f"cannot read {path}: {exc.strerror or exc}") from None

    async def check(self, probes: list[Probe]) -> list[Outcome]:
        settings, held = self.settings, self.held
        roots = RootCheck(settings.root)  # directories resolved once per batch
        jobs = [
            (p.session_key, functools.partial(check_file, self.format, p, settings, held, roots))
            for p in probes
        ]
        results = await self.reads.run_batch(jobs)
        return [self._outcome(p, r) for p, r in zip(probes, results, strict=True)]

    def _outcome(self, probe: Probe, result: Outcome | BaseException) -> Outcome:
        if isinstance(result, Outcome):
            return result
        if isinstance(result, SourceBusy):
            reason = "the previous read of this source has not returned"
        elif isinstance(result, TimeoutError):
            reason = str(result)
        else:  # one link's failure is its own
            log.error("%s: check failed: %r", probe.session_key, result)
            reason = type(result).__name__
        return Outcome(status="inconclusive", reason=reason)


MAX_TICKS = 10_000_000
_BOOKKEEPING = (
    *("pending", "head", "tail", "ino", "recent", "drift", "echo", "seenAt", "changes"),
)


def replay_file(
    fmt: JsonlFormat[Any], path: str, own_texts: list[str], settings: TailSettings
) -> Iterator[dict[str, Any]]:
    """``sessionwatch replay``: the file read from offset 0, tick by tick, through the same
    check as the monitor (tailer, long lines, tolerant parsing, classifier, self-echo),
    writing nothing anywhere. Yields one ``turn`` object per detected turn, then the
    ``summary``: turns, compactions, where the monitor would block, the drift it met."""
    if settings.cap < 1 or settings.max_line < 1:
        raise BadInput("--scan-cap and --max-line-bytes must be positive")
    if fmt.compressed and path.endswith(zst.SUFFIX):
        yield from _replay_compressed(fmt, path, own_texts, settings)
        return
    try:
        fmt.state_from_first(first_record(path, settings.cap))
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    except Declined as exc:
        raise BadInput(str(exc)) from None
    settings = settings._replace(root="")
    own = list(enumerate(text_hash(t) for t in own_texts))
    held: HeldLines = {}
    marker: Marker = {"offset": 0}
    ticks = turns = compactions = 0
    blocked: dict[str, Any] | None = None
    while ticks < MAX_TICKS:
        ticks += 1
        probe = Probe(session_key="replay", ref={"filePath": path}, marker=marker, own=tuple(own))
        outcome = check_file(fmt, probe, settings, held)
        if outcome.status in ("missing", "inconclusive"):
            raise BadInput(f"cannot read {path}: {outcome.reason}")
        if outcome.status == "blocked":
            blocked = {"offset": outcome.blocked_offset, "reason": _short(outcome.reason)}
            break
        own = [o for o in own if o[0] not in outcome.consumed_own]
        compactions += len(outcome.compactions)
        for turn in outcome.turns:
            turns += 1
            yield {"type": "turn", "offset": turn.offset, "id": turn.native_id}
        if outcome.marker is None or outcome.marker == marker:
            break
        marker = outcome.marker
    yield {
        "type": "summary",
        "humanTurns": turns,
        "compactions": compactions,
        "ticks": ticks,
        "blocked": blocked,
        "drift": Drift.from_json(marker.get("drift")).to_json(),
        "marker": {k: v for k, v in marker.items() if k not in _BOOKKEEPING},
    }


def _replay_compressed(
    fmt: JsonlFormat[Any], path: str, own_texts: list[str], settings: TailSettings
) -> Iterator[dict[str, Any]]:
    """A compressed file, replayed as the plain file it stands for: decompressed into a
    private temporary file (bounded memory), which is removed afterwards."""
    import tempfile

    with tempfile.NamedTemporaryFile(prefix="sessionwatch-replay-", suffix=".jsonl") as out:
        try:
            for chunk in zst.chunks(path):
                out.write(chunk)
        except OSError as exc:
            raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
        out.flush()
        yield from replay_file(fmt, out.name, own_texts, settings)


def _short(reason: str | None) -> str:
    """The blocking reason without its offset (the summary gives the offset)."""
    text = reason or "blocked"
    return text.split(" at offset ")[0].split(" starts at ")[0]


_SCANS: Any = None  # the one thread the formats' catalog scans take turns on


async def _scanned(fn: Callable[..., CatalogListing], *args: Any) -> CatalogListing:
    """``fn(*args)`` on the catalog's own thread, one scan at a time: scans are CPU-bound
    Python, and three formats' at once on three threads took half as long again as one
    after the other (the lock they contend for), 1.6 s against 1.0 s for 10,000 files."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    global _SCANS
    if _SCANS is None:
        _SCANS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="catalog")
    found: CatalogListing = await asyncio.get_running_loop().run_in_executor(_SCANS, fn, *args)
    return found
