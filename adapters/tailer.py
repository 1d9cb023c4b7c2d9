"""The one JSONL tailer Claude, Codex and Pi share.

From a byte offset it reads at most the scan cap per tick, up to the last complete line. A
partial last line waits for its newline. A file that did not grow is only stat'ed. A file
that is no longer the one the marker was taken on (another inode, another first line) was
``rotated``; one that shrank below the offset, whose byte before the offset is no longer a
line end, or whose bytes just before the offset are not the ones read there (the ``tail``
fingerprint, as log tailers keep one) was ``truncated`` (rewritten). The fingerprint sees a
rewrite even when the old offset happens to fall on a line end of the new bytes.

Only regular files are opened, and never in a way that can block: the type is checked with
``stat`` first, the open is ``O_NONBLOCK``, and the opened file is checked again. A FIFO,
socket, device or directory raises :class:`NotRegularFile`.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import Literal

from monitor.records import NamedTuple

HEAD_BYTES = 4096
TAIL_BYTES = 256  # the fingerprint of what was read: the bytes just before the offset

ReadStatus = Literal["lines", "idle", "waiting", "long", "rotated", "truncated"]

_TYPES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class NotRegularFile(OSError):
    """The path is not a regular file; it is never opened."""


def describe(mode: int) -> str:
    return next((name for test, name in _TYPES if test(mode)), "not a regular file")


def stat_regular(path: str) -> os.stat_result:
    """``stat`` a path that must be a regular file; raises :class:`NotRegularFile`."""
    found = os.stat(path)
    if not stat.S_ISREG(found.st_mode):
        raise NotRegularFile(f"not a regular file ({describe(found.st_mode)})")
    return found


def open_regular(path: str, *, checked: bool = False) -> tuple[int, os.stat_result]:
    """Open a regular file for reading without ever blocking; its fd and ``fstat``.
    ``checked``: the caller has just ``stat_regular``-ed it."""
    if not checked:
        stat_regular(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        after = os.fstat(fd)
        if not stat.S_ISREG(after.st_mode):
            raise NotRegularFile(f"not a regular file ({describe(after.st_mode)})")
    except BaseException:
        os.close(fd)
        raise
    return fd, after


class TailRead(NamedTuple):
    status: ReadStatus
    start: int = 0  # the offset ``chunk`` was read from
    end: int = 0  # the offset after the last complete line read
    size: int = 0
    head: str | None = None  # the file's head digest
    tail: str | None = None  # the digest of the bytes just before ``end``
    ino: int | None = None
    chunk: bytes = b""  # the bytes read (its complete lines end at ``end``); "long": of a
    # line longer than the cap
    mtime: int | None = None  # the file's st_mtime_ns when it was read

    def lines(self) -> list[tuple[int, bytes]]:
        """The complete lines read, with their offsets (:func:`split_lines`)."""
        return split_lines(self.chunk, self.start, self.end - self.start)


def head_digest(fd: int) -> str | None:
    """Identity of a file: a digest of its first line (or of its first 4 KiB); None while
    the first line is not complete, since its bytes may still change."""
    chunk = os.pread(fd, HEAD_BYTES, 0)
    newline = chunk.find(b"\n")
    if newline < 0 and len(chunk) < HEAD_BYTES:
        return None
    return hashlib.sha256(chunk if newline < 0 else chunk[: newline + 1]).hexdigest()[:16]


def tail_digest(fd: int, offset: int) -> str | None:
    """The fingerprint of the bytes just before ``offset`` (None at the file's start)."""
    if offset <= 0:
        return None
    start = max(0, offset - TAIL_BYTES)
    return hashlib.sha256(os.pread(fd, offset - start, start)).hexdigest()[:16]


def split_lines(chunk: bytes, base: int, end: int | None = None) -> list[tuple[int, bytes]]:
    """Complete lines of ``chunk[:end]`` (which ends in a newline) with their file offsets.

    Leading NUL padding is dropped; blank lines carry nothing and are left out.
    """
    out: list[tuple[int, bytes]] = []
    append = out.append
    pos = 0
    stop = len(chunk) if end is None else end
    find = chunk.find
    while pos < stop:
        nl = find(b"\n", pos)
        line = chunk[pos:nl]
        if line and (line[0] in _PAD or line[-1] in _PAD):
            line = line.lstrip(b"\x00").strip()
        if line:
            append((base + pos, line))
        pos = nl + 1
    return out


_PAD = frozenset(b"\x00 \t\r\x0b\x0c")


def _changed(
    fd: int,
    offset: int,
    head: str | None,
    ino: int | None,
    st: os.stat_result,
    tail: str | None = None,
) -> str:
    """Why the file is not the one the marker was taken on, or "" when it is."""
    if ino is not None and st.st_ino != ino and not _same_bytes(fd, offset, head, tail, st):
        return "rotated"
    if st.st_size < offset:
        return "truncated"
    if offset > 0 and head is not None and head_digest(fd) != head:
        return "rotated"
    if offset > 0 and os.pread(fd, 1, offset - 1) != b"\n":
        return "truncated"  # rewritten: the marker no longer sits at a line end
    if tail is not None and tail_digest(fd, offset) != tail:
        return "truncated"  # rewritten, though the offset still falls on a line end
    return ""


def _same_bytes(
    fd: int, offset: int, head: str | None, tail: str | None, st: os.stat_result
) -> bool:
    """A new inode that holds the same bytes up to ``offset`` (the same first line, the same
    bytes before the offset, a line end there) is the same file written again: a harness
    restoring it (Codex decompressing a resumed rollout) or an editor's save by rename. It
    continues from the offset; a rotated file starts with another first line."""
    if offset <= 0 or head is None or tail is None or st.st_size < offset:
        return False
    return (
        head_digest(fd) == head
        and os.pread(fd, 1, offset - 1) == b"\n"
        and tail_digest(fd, offset) == tail
    )


def read_tail(
    path: str,
    offset: int,
    cap: int,
    head: str | None,
    ino: int | None = None,
    resume: int = 0,
    tail: str | None = None,
    mtime: int | None = None,
) -> TailRead:
    """One tick's read of at most ``cap`` bytes from ``offset + resume`` (``resume``: bytes
    of a long line at ``offset`` already read; ``tail``: the fingerprint taken at
    ``offset``; ``mtime``: the file's st_mtime_ns when the marker was taken). Raises
    ``OSError`` (FileNotFoundError: missing; NotRegularFile: never opened).

    A file of the marker's size, inode and mtime is idle after one stat. One rewritten to
    its old size moved its mtime: it is opened, and its fingerprints tell (as they do for
    a marker that has none yet: the gateway's)."""
    start = offset + resume
    before = stat_regular(path)
    if (
        before.st_size == start
        and (ino is None or ino == before.st_ino)
        and mtime == before.st_mtime_ns  # none known: opened, for the fingerprints
    ):  # a stat, no open
        return TailRead(
            status="idle",
            end=offset,
            size=start,
            ino=before.st_ino,
            head=head,
            tail=tail,
            mtime=before.st_mtime_ns,
        )
    fd, st = open_regular(path, checked=True)
    try:
        size = st.st_size
        changed = _changed(fd, offset, head, ino, st, tail)
        changed = changed or ("truncated" if size < start else "")
        if changed:
            return TailRead(status=changed, size=size, ino=st.st_ino)  # type: ignore[arg-type]
        chunk = os.pread(fd, min(cap, size - start), start)
        current_head = head if head is not None else head_digest(fd)
        last_nl = chunk.rfind(b"\n")
        end = start + last_nl + 1 if last_nl >= 0 else offset
        if last_nl >= 0:
            current_tail = tail_digest(fd, end)
        else:
            current_tail = tail if tail is not None else tail_digest(fd, offset)
    finally:
        os.close(fd)
    status: ReadStatus = "lines" if last_nl >= 0 else "long" if len(chunk) >= cap else "waiting"
    return TailRead(
        status=status,
        start=start,
        end=end,  # ``offset`` when no line ended in the chunk
        size=size,
        head=current_head,
        tail=current_tail,
        ino=st.st_ino,
        chunk=chunk,  # may run past ``end``: a partial line that waits
        mtime=st.st_mtime_ns,
    )


def read_at(path: str, start: int, length: int) -> bytes:
    """``length`` bytes from ``start``: a long line's beginning, re-read after a restart."""
    fd, _ = open_regular(path)
    try:
        return os.pread(fd, length, start)
    finally:
        os.close(fd)


def end_of_last_line(path: str) -> tuple[int, str | None, int, str | None]:
    """Baseline: the offset after the last complete line, the head digest, the inode and
    the tail fingerprint at that offset."""
    fd, st = open_regular(path)
    try:
        pos = st.st_size
        step = 64 * 1024
        while pos > 0:
            start = max(0, pos - step)
            chunk = os.pread(fd, pos - start, start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                end = start + nl + 1
                return end, head_digest(fd), st.st_ino, tail_digest(fd, end)
            pos = start
        return 0, head_digest(fd), st.st_ino, None
    finally:
        os.close(fd)
