"""The one JSONL tailer Claude, Codex and Pi share.

From a byte offset it reads at most the scan cap per tick, up to the last complete line. A
partial last line waits for its newline; a single line longer than the cap blocks at its
offset (it is never skipped). A file that did not grow is only stat'ed. A file that shrank
below the offset, or whose first line changed, was replaced.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Literal

HEAD_BYTES = 4096

ReadStatus = Literal["lines", "idle", "waiting", "blocked", "replaced"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TailRead:
    status: ReadStatus
    lines: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, line)
    end: int = 0  # the offset after the last complete line read
    size: int = 0
    head: str | None = None  # the file's head digest, when it was opened


def head_digest(fd: int) -> str | None:
    """Identity of a file: a digest of its first line (or of its first 4 KiB); None while
    the first line is not complete, since its bytes may still change."""
    chunk = os.pread(fd, HEAD_BYTES, 0)
    newline = chunk.find(b"\n")
    if newline < 0 and len(chunk) < HEAD_BYTES:
        return None
    return hashlib.sha256(chunk if newline < 0 else chunk[: newline + 1]).hexdigest()[:16]


def split_lines(chunk: bytes, base: int) -> list[tuple[int, bytes]]:
    """Complete lines of ``chunk`` (which ends in a newline) with their file offsets.

    Leading NUL padding is dropped; blank lines carry nothing and are left out.
    """
    out = []
    pos = 0
    end = len(chunk)
    while pos < end:
        nl = chunk.index(b"\n", pos)
        line = chunk[pos:nl].lstrip(b"\x00").strip()
        if line:
            out.append((base + pos, line))
        pos = nl + 1
    return out


def read_tail(path: str, offset: int, cap: int, head: str | None) -> TailRead:
    """One tick's read from ``offset``. Raises ``OSError`` (FileNotFoundError: missing)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size < offset:
            return TailRead(status="replaced", size=size)
        if size == offset:
            return TailRead(status="idle", end=offset, size=size)
        if head is not None and offset > 0 and head_digest(fd) != head:
            return TailRead(status="replaced", size=size)
        chunk = os.pread(fd, min(cap + 1, size - offset), offset)
    finally:
        os.close(fd)
    last_nl = chunk.rfind(b"\n")
    if last_nl < 0:
        status: ReadStatus = "blocked" if len(chunk) > cap else "waiting"
        return TailRead(status=status, end=offset, size=size)
    complete = chunk[: last_nl + 1]
    return TailRead(
        status="lines", lines=split_lines(complete, offset), end=offset + len(complete), size=size
    )


def end_of_last_line(path: str) -> tuple[int, str | None]:
    """Baseline: the offset after the last complete line, and the file's head digest."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        pos = size
        step = 64 * 1024
        while pos > 0:
            start = max(0, pos - step)
            chunk = os.pread(fd, pos - start, start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                return start + nl + 1, head_digest(fd)
            pos = start
        return 0, head_digest(fd)
    finally:
        os.close(fd)
