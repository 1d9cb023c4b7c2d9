"""The catalog of a JSONL format (Claude, Codex, Pi): the adoptable files under its root.

Each file is read at its head (64 KiB) and tail (16 KiB) only, through a descriptor that
cannot block (a FIFO is refused). The title is the one the harness keeps (Claude's summary or
custom title, Pi's session name), else the first human prompt as the format's classifier
finds it, on one line: the only text an entry holds, shown and never written anywhere. What
cannot be adopted (Claude sub-agent files, Codex sub-agent rollouts) is skipped and counted;
a malformed file is reported and skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from adapters import zst
from adapters.catalog import CatalogEntry, CatalogListing, catalog_id
from adapters.jsonl_format import JsonlFormat
from adapters.jsonl_scan import first_prompt, parse_line
from adapters.tailer import open_regular

TITLE_CHARS = 200
HEAD_BYTES = 64 * 1024
TAIL_BYTES = 16 * 1024
_TITLE_TYPES = {"custom-title": "customTitle", "ai-title": "aiTitle", "session_info": "name"}


def _complete(chunk: bytes, *, skip_first_partial: bool) -> bytes:
    """``chunk``'s complete lines: without a line cut at its end (or at its start)."""
    chunk = chunk[: chunk.rfind(b"\n") + 1]
    return chunk[chunk.find(b"\n") + 1 :] if skip_first_partial else chunk


def _marked(fmt: JsonlFormat[Any], chunk: bytes) -> list[dict[str, Any]]:
    """The records of the lines of ``chunk`` (complete lines) that hold what an entry reads
    (the format's ``catalog_lines``), in file order; each looked for at C speed, no line
    split."""
    starts: set[int] = set()
    for needle in fmt.catalog_lines:
        at = chunk.find(needle)
        while at >= 0:
            starts.add(chunk.rfind(b"\n", 0, at) + 1)
            end = chunk.find(b"\n", at)
            at = chunk.find(needle, end) if end >= 0 else -1
    found = []
    for start in sorted(starts):
        value = parse_line(chunk[start : chunk.find(b"\n", start)], recover=not fmt.strict)
        if isinstance(value, dict):
            found.append(value)
    return found


def _prompts(fmt: JsonlFormat[Any], chunk: bytes) -> Iterator[dict[str, Any]]:
    """The records of ``chunk``'s complete lines that may be a prompt (those the format's
    pre-filter lets through, as in the monitor), one at a time: read only as far as the
    first prompt."""
    prefilter, recover, start = fmt.prefilter, not fmt.strict, 0
    while (stop := chunk.find(b"\n", start)) >= 0:
        if stop > start and (prefilter is None or prefilter(chunk, start, stop)):
            value = parse_line(chunk[start:stop], recover=recover)
            if isinstance(value, dict):
                yield value
        start = stop + 1


def _head_and_tail(path: str, size: int) -> tuple[bytes, bytes]:
    """Only a regular file is opened, never in a way that can block (a FIFO is refused)."""
    fd, _ = open_regular(path)
    try:
        head = os.pread(fd, HEAD_BYTES, 0)
        if size <= HEAD_BYTES:
            return head, b""
        return head, os.pread(fd, TAIL_BYTES, max(size - TAIL_BYTES, HEAD_BYTES))
    finally:
        os.close(fd)


RECAP_SUFFIX = "(disable recaps in /config)"


def _title(records: list[dict[str, Any]]) -> str | None:
    """The harness's own title (the latest custom or AI title, Pi's name), else the latest
    recap Claude Code writes when a person comes back (``away_summary``, from 2.1.108): a
    better title than the first prompt. Older ``summary`` records may describe another
    branch and are left out."""
    title = recap = None
    for record in records:
        kind = record.get("type")
        if type(kind) is not str:
            continue
        key = _TITLE_TYPES.get(kind)
        value = record.get(key) if key else None
        if isinstance(value, str) and value.strip():
            title = " ".join(value.split())[:TITLE_CHARS]
        elif kind == "system" and record.get("subtype") == "away_summary":
            text = record.get("content")
            if isinstance(text, str):
                text = " ".join(text.split()).removesuffix(RECAP_SUFFIX).strip()
                recap = text[:TITLE_CHARS] or recap
    return title or recap


def file_entry(
    fmt: JsonlFormat[Any], path: str, stat: os.stat_result, real: str | None = None
) -> CatalogEntry | None:
    """One file's entry; None when it is not adoptable. Raises ValueError when malformed.
    ``real``: the file's resolved path, when the caller knows it. A compressed file is
    listed as the plain file it stands for (its path and id), titled from its head."""
    packed = fmt.compressed and path.endswith(zst.SUFFIX)
    if packed:
        head, tail = zst.head(path, HEAD_BYTES), b""
        real = zst.plain_of(real or os.path.realpath(path))
        path = zst.plain_of(path)
    else:
        head, tail = _head_and_tail(path, stat.st_size)
    first_nl = head.find(b"\n")
    first = parse_line(head[: first_nl if first_nl >= 0 else len(head)], recover=False)
    if first is None:
        raise ValueError("first line is not JSON")
    if not isinstance(first, dict):
        raise ValueError("first line is not a JSON object")
    # the lines after the first, whole; only those an entry reads are parsed
    rest = _complete(head[first_nl + 1 :], skip_first_partial=False) if first_nl >= 0 else b""
    marked = _marked(fmt, rest)
    described = fmt.describe(first, [first, *marked])
    if described is None:
        return None
    native_id, cwd = described
    real = real or os.path.realpath(path)
    prompt = _text(first_prompt(fmt, [first], _prompts(fmt, rest)))
    if tail:
        marked += _marked(fmt, _complete(tail, skip_first_partial=True))
    title = _text(_title([first, *marked]))
    cwd = _text(cwd)
    return CatalogEntry(
        catalog_id=catalog_id(fmt.kind, real),
        kind=fmt.kind,
        native_id=native_id or Path(path).name.removesuffix(".jsonl"),
        path=real,
        cwd=cwd,
        title=title or (prompt[:TITLE_CHARS] if prompt else None),
        updated_at=int(stat.st_mtime * 1000),
        size=stat.st_size,
        prompt=prompt[:TITLE_CHARS] if prompt else None,
    )


def _text(text: str | None) -> str | None:
    """Text read from odd bytes as it can be shown and sent as JSON: a lone surrogate (a
    ``\\ud83d`` escape) becomes U+FFFD."""
    if text is None or text.isascii():
        return text
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def _candidates(fmt: JsonlFormat[Any], root: str) -> tuple[list[str], int]:
    """Files of the format under its root, and how many were skipped as not adoptable."""
    found: list[str] = []
    skipped = 0
    for dirpath, dirnames, filenames in os.walk(root):
        folder = os.path.basename(dirpath)
        names = set(filenames)
        for name in filenames:
            if not name.endswith(".jsonl"):
                if not (fmt.compressed and name.endswith(".jsonl" + zst.SUFFIX)):
                    continue
                if zst.plain_of(name) in names:
                    continue  # written back: the plain file is the session
            verdict = fmt.candidate(folder, name)
            if verdict is False:
                skipped += 1
            elif verdict:
                found.append(os.path.join(dirpath, name))
        dirnames.sort()
    return sorted(found), skipped


def scan_files(fmt: JsonlFormat[Any], root: str, digest: str | None = None) -> CatalogListing:
    """The format's adoptable files under ``root``, newest first; with ``digest``, only
    those whose catalog id's digest starts with it (adoption by id: the files are listed,
    and only those read)."""
    catalog = CatalogListing()
    if not root or not os.path.isdir(root):
        return catalog
    paths, catalog.skipped = _candidates(fmt, root)
    # os.walk never enters a linked directory, so below the resolved root only a file that
    # is itself a link needs resolving: one lstat each, not one per path component.
    real_root = os.path.realpath(root)
    for path in paths:
        try:
            linked = os.path.islink(path)  # os.walk's paths start with root
            real = os.path.realpath(path) if linked else real_root + path[len(root) :]
            if digest is not None:
                named = zst.plain_of(real) if fmt.compressed and real.endswith(zst.SUFFIX) else real
                if not catalog_id(fmt.kind, named).partition(":")[2].startswith(digest):
                    continue
            entry = file_entry(fmt, path, os.stat(path), real)
        except (OSError, ValueError) as exc:
            reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
            catalog.errors.append({"path": path, "reason": reason or "unreadable"})
            continue
        if entry is None:
            catalog.skipped += 1
        else:
            catalog.entries.append(entry)
    catalog.entries.sort(key=lambda e: (-e.updated_at, e.catalog_id))
    return catalog
