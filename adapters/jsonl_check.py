"""One check of a linked JSONL file (Claude, Codex, Pi), as a tick runs it per link.

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
import os
import stat
from typing import TYPE_CHECKING, Any

from adapters import zst
from adapters.base import (
    DEFAULT_MAX_LINE,
    DEFAULT_SCAN_CAP,
    Drift,
    Marker,
    Outcome,
    OwnPool,
    Probe,
    as_text,
    non_negative_int,
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
from adapters.states import last_boundary
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
from monitor.errors import BadInput, Declined, OutsideRoots
from monitor.lazylog import LazyLogger
from monitor.records import NamedTuple

if TYPE_CHECKING:
    pass  # built only by the catalog

log = LazyLogger(__name__)  # ``replay`` is a one-shot command, and rarely logs


READ_TIMEOUT_S = 10.0
OUTSIDE_ROOTS = "outside the configured roots"

HeldLines = dict[tuple[str, int | None, int], bytearray]


class TailSettings(NamedTuple):
    cap: int = DEFAULT_SCAN_CAP
    max_line: int = DEFAULT_MAX_LINE
    root: str = ""  # the configured root the file must resolve inside ("" checks nothing)
    # each read says what the session is doing (``Outcome.boundary``); a replay, which
    # reads a whole file, finds it once, at its end
    doing: bool = True


class RootCheck:
    """Where a linked path really leads, and whether that is inside the root.

    Resolved at every read; directories are resolved once per batch (many links share a
    project directory), the file itself with one ``lstat`` unless it is a symlink."""

    def __init__(self, root: str) -> None:
        self.base = os.path.realpath(os.path.expanduser(root)) if root else ""
        self._dirs: dict[str, str] = {}

    def resolve(self, path: str) -> str | None:
        """The real path of ``path`` when it resolves inside the root, else None."""
        folder, name = os.path.split(os.path.expanduser(path))
        real_dir = self._dirs.get(folder)
        if real_dir is None:
            real_dir = self._dirs[folder] = os.path.realpath(folder)
        real = _unlinked(os.path.join(real_dir, name))
        if not self.base or real == self.base or real.startswith(self.base + os.sep):
            return real
        return None


def _unlinked(path: str) -> str:
    """Where ``path`` leads when it is a symbolic link; else ``path`` (missing or
    unreadable too: the read says which)."""
    try:
        linked = stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return path
    return os.path.realpath(path) if linked else path


def resolve_file(kind: str, path: str, root: str) -> str:
    """The real path of a file ref, which must lie inside the kind's root (``path`` is
    already expanded)."""
    base = os.path.realpath(root) if root else ""
    real = os.path.realpath(path)
    if not base or os.path.commonpath([base, real]) != base:
        raise OutsideRoots(f"{path} is not inside the configured {kind} root {base}")
    mode = _mode(path, real)
    if not stat.S_ISREG(mode):
        raise Declined(f"cannot read {path}: not a regular file ({describe(mode)})")
    return real


def _mode(path: str, real: str) -> int:
    """The mode of the file at ``real`` (given as ``path``). Raises BadInput when there is
    none (a mistyped path: refused, nothing is adopted), Declined when it is unreadable."""
    try:
        return os.stat(real).st_mode
    except FileNotFoundError:
        raise BadInput(f"no such file: {path}") from None
    except OSError as exc:
        raise Declined(f"cannot read {path}: {exc.strerror or exc}") from None


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
            return _packed_end(packed)
        offset, head, ino, tail = end_of_last_line(path)
    except NotRegularFile as exc:
        raise Declined(str(exc)) from None
    first = first_line(path) if offset > 0 else None
    return {"offset": offset, "head": head, "ino": ino, "tail": tail}, first


def _packed_end(packed: str) -> tuple[Marker, bytes | None]:
    """:func:`file_end` of a file the harness compressed, read in its compressed form; no
    inode (the plain file's own, once the harness writes it back)."""
    offset, head, tail = zst.end_of_last_line(packed)
    first = _first_line(zst.head(packed, DEFAULT_SCAN_CAP)) if offset > 0 else None
    return {"offset": offset, "head": head, "ino": None, "tail": tail}, first


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
        read = _read(real, offset, resume, marker, settings)
        if (unchanged := _nothing_new(fmt, probe, read, resume, settings, held)) is not None:
            return unchanged
        capped = read.size - read.start > settings.cap  # more written than this read took
        if read.status in ("long", "waiting"):
            return _more(_hold(real, offset, resume, read, marker, settings, held), capped)
        pick, read = _picked(fmt, real, offset, resume, read, settings, held)
        if pick.long_at is not None and pick.long_at == pick.first:
            return _blocked_by_a_long_line(read, settings)
        state = fmt.state_from_marker(marker)
        own = OwnPool(probe.own)
        result = scan(fmt, pick.lines, state, own, Cutoff.of(marker), prefiltered=True)
        outcome = settled(fmt, probe, read, pick.first, result, state, own)
        if outcome.status == "activity" and settings.doing:
            outcome = _with_boundary(fmt, real, outcome, read, offset if resume else None)
    except OSError as exc:
        return _unread(fmt, real, settings.root, marker, exc)
    except Declined as exc:
        return Outcome(status="inconclusive", reason=str(exc))
    return _more(outcome, capped)


def _with_boundary(
    fmt: JsonlFormat[Any], real: str, outcome: Outcome, read: TailRead, long_at: int | None
) -> Outcome:
    """``outcome`` with the last boundary among the lines it read (:mod:`adapters.states`):
    in the chunk, or, when the read completed a long line begun at ``long_at``, read again
    from there (the chunk holds only the line's end)."""
    if fmt.state_of is None:
        return outcome
    assert outcome.marker is not None
    end = non_negative_int(outcome.marker.get("offset"))
    if long_at is None:
        chunk, base = read.chunk, read.start
    else:
        chunk, base = read_at(real, long_at, end - long_at), long_at
    boundary = last_boundary(fmt, chunk, 0, end - base)
    return outcome if boundary is None else dataclasses.replace(outcome, boundary=boundary)


def _read(real: str, offset: int, resume: int, marker: Marker, settings: TailSettings) -> TailRead:
    """What the file holds after ``offset`` (resuming a long line at ``resume``), checked
    against the fingerprints the marker took."""
    mtime = non_negative_int(marker.get("mtime")) or None
    head, ino, tail = marker.get("head"), marker.get("ino"), as_text(marker.get("tail"))
    return read_tail(real, offset, settings.cap, head, ino, resume, tail, mtime)


def _nothing_new(
    fmt: JsonlFormat[Any],
    probe: Probe,
    read: TailRead,
    resume: int,
    settings: TailSettings,
    held: HeldLines,
) -> Outcome | None:
    """The outcome of a read with nothing new to scan: the file was rotated or truncated
    (read again from its start), or nothing was written (or only a long line's first bytes
    that are not held yet). None: there is."""
    if read.status in ("rotated", "truncated"):
        return _reread(fmt, probe, read, settings, held)
    if read.status == "idle" or (read.status == "waiting" and not resume):
        return idle(probe.marker, read)
    return None


def _blocked_by_a_long_line(read: TailRead, settings: TailSettings) -> Outcome:
    reason = f"a line longer than max_line_bytes ({settings.max_line}) starts at {read.end}"
    return Outcome(status="blocked", blocked_offset=read.end, reason=reason)


def _picked(
    fmt: JsonlFormat[Any],
    real: str,
    offset: int,
    resume: int,
    read: TailRead,
    settings: TailSettings,
    held: HeldLines,
) -> tuple[Selection, TailRead]:
    """What the scan reads of this read: its complete lines, or, resuming a long line,
    that line joined whole with what was held of it (too long whole: none, blocked)."""
    if not resume:
        return complete_lines(fmt, real, read, settings.max_line)
    joined = _join(real, offset, resume, read, held)
    joined, read = up_to_a_long_line(real, joined, read, settings.max_line)
    whole = Selection(selected(fmt, joined), joined[0][0]) if joined else None
    return whole or Selection([], read.end, long_at=read.end), read


def _unread(fmt: JsonlFormat[Any], real: str, root: str, marker: Marker, exc: OSError) -> Outcome:
    """A check whose file could not be read: only "no such file" is a miss (unless the
    harness compressed or archived it: idle, not gone); anything else is inconclusive."""
    if isinstance(exc, FileNotFoundError):
        kept = kept_elsewhere(fmt, real, root)
        if kept:
            return Outcome(status="quiet", marker=marker, reason=kept)
        return Outcome(status="missing", reason="no such file")
    if isinstance(exc, NotRegularFile):
        return Outcome(status="inconclusive", reason=str(exc))
    return Outcome(status="inconclusive", reason=exc.strerror or type(exc).__name__)


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
    ended = "reread" in marker and not rereading(marker, read.end, read.size)
    if ended or _fingerprints_moved(marker, read):
        done = _without(marker, ("reread",) if ended else ())
        fingerprints = {"head": read.head, "ino": read.ino, "tail": read.tail}
        return Outcome(status="quiet", marker={**done, **fingerprints, "mtime": read.mtime})
    # a file only touched (or rewritten as it was) keeps its marker: no write for that, and
    # each check opens it until the next write moves the marker
    return Outcome(status="quiet", marker=marker)


def _without(marker: Marker, keys: tuple[str, ...]) -> Marker:
    return {k: v for k, v in marker.items() if k not in keys}


def _fingerprints_moved(marker: Marker, read: TailRead) -> bool:
    """The same bytes under a new inode, or fingerprints the marker has not taken yet."""
    moved = read.ino is not None and marker.get("ino") != read.ino
    return moved or bool(read.head and not marker.get("head")) or "mtime" not in marker


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
    return Outcome(
        status="activity",
        marker=_scanned(marker, read, end, result, old, state),
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


def _scanned(
    marker: Marker, read: TailRead, end: int, result: ScanResult, old: Drift, state: Any
) -> Marker:
    """The marker after a scan that read up to ``end``."""
    scanned = {
        **_without(marker, ("size", "long", "reread", "seenAt")),
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
        scanned["reread"] = marker["reread"]  # not caught up yet
    return scanned


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
    record, a newer declared version, the first line that is not JSON (the later ones are
    counted, in ``links`` and ``sessionwatch_invalid_lines_total``: junk appended by the
    megabyte must not grow the log by the line)."""
    new = found.drift
    for record_type in new.unknown_types:
        if record_type not in old.unknown_types:
            log.warning("%s: %s record of unknown type %r (format drift?)", key, kind, record_type)
    if new.unclassified and not old.unclassified:
        log.warning("%s: a %s record looks like a user's but no rule classifies it", key, kind)
    if new.newer and new.version != old.version:
        log.warning("%s: %s format version %s is newer than tested", key, kind, new.version)
    if found.invalid and not old.invalid:
        log.warning(
            "%s: %s line at offset %d is not JSON; skipped (%d such lines in this read; the"
            " next are counted, not said: sessionwatch links shows the count)",
            key,
            kind,
            found.invalid[0],
            len(found.invalid),
        )


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
