"""JSONL files a harness compressed with zstandard, read as the plain file they were.

Codex's rollout compression (``[features] local_thread_store_compression``) rewrites a
rollout idle for 7 days as ``rollout-….jsonl.zst`` and deletes the plain file; resuming the
session writes the plain file back and appends to it. The catalog lists compressed rollouts,
``replay`` reads them, ``adopt`` takes one, and a link whose file is compressed is idle,
never missing (:mod:`adapters.jsonl_adapter`).

Decompression is python-zstandard's streaming reader (the ``zstandard`` package, the
binding of the reference C library that pip installs as a wheel), so memory stays bounded
whatever the file's size; the files are opened as the tailer opens them, never blocking.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

from adapters.tailer import HEAD_BYTES, TAIL_BYTES, open_regular

SUFFIX = ".zst"
CHUNK = 1 << 20


def compressed_sibling(path: str) -> str:
    return path + SUFFIX


def plain_of(path: str) -> str:
    """The plain file a compressed one stands for (``….jsonl.zst`` -> ``….jsonl``)."""
    return path.removesuffix(SUFFIX)


def chunks(path: str) -> Iterator[bytes]:
    """The decompressed bytes of ``path``, a chunk at a time. Raises OSError (a file that is
    not zstandard data: ``OSError`` with the library's reason)."""
    import zstandard  # only where a compressed file is met

    fd, _ = open_regular(path)
    with os.fdopen(fd, "rb") as raw:
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        try:
            while True:
                chunk = reader.read(CHUNK)
                if not chunk:
                    return
                yield chunk
        except zstandard.ZstdError as exc:
            raise OSError(f"not readable zstandard data: {exc}") from None


def head(path: str, size: int) -> bytes:
    """The first ``size`` decompressed bytes."""
    out = bytearray()
    for chunk in chunks(path):
        out += chunk
        if len(out) >= size:
            break
    return bytes(out[:size])


def end_of_last_line(path: str) -> tuple[int, str | None, str | None]:
    """What :func:`adapters.tailer.end_of_last_line` gives for the plain file: the offset
    after its last complete line, its head digest and the tail fingerprint at that offset
    (the inode is the plain file's own, unknown until it is written back)."""
    first = bytearray()
    window = bytearray()  # the last bytes seen, at least TAIL_BYTES before any newline
    window_start = total = end = 0
    tail: str | None = None
    for chunk in chunks(path):
        if len(first) < HEAD_BYTES:
            first += chunk[: HEAD_BYTES - len(first)]
        window += chunk
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            end = total + nl + 1
            cut = end - window_start
            tail = hashlib.sha256(window[max(0, cut - TAIL_BYTES) : cut]).hexdigest()[:16]
        total += len(chunk)
        if len(window) > TAIL_BYTES:
            drop = len(window) - TAIL_BYTES
            del window[:drop]
            window_start += drop
    newline = first.find(b"\n")
    if newline < 0 and len(first) < HEAD_BYTES:
        digest = None
    else:
        digest = hashlib.sha256(first if newline < 0 else first[: newline + 1]).hexdigest()[:16]
    return end, digest, tail if end else None
