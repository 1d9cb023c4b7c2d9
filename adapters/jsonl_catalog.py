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
from typing import Any, Literal

from adapters import forked, zst
from adapters.base import as_dict, as_text
from adapters.catalog import CatalogEntry, CatalogListing, catalog_id, id_digest, shown_path
from adapters.jsonl_format import JsonlFormat
from adapters.jsonl_scan import first_prompt, parse_line
from adapters.tailer import open_regular
from monitor.records import NamedTuple

TITLE_CHARS = 200
HEAD_BYTES = 64 * 1024
TAIL_BYTES = 16 * 1024
_TITLE_TYPES = {"custom-title": "customTitle", "ai-title": "aiTitle", "session_info": "name"}


def _complete(chunk: bytes, *, skip_first_partial: bool) -> bytes:
    """``chunk``'s complete lines: without a line cut at its end (or at its start)."""
    chunk = chunk[: chunk.rfind(b"\n") + 1]
    return chunk[chunk.find(b"\n") + 1 :] if skip_first_partial else chunk


def _marked(fmt: JsonlFormat[Any], chunk: bytes, *, head: bool) -> list[dict[str, Any]]:
    """The records of the lines of ``chunk`` (complete lines) that hold what an entry reads
    (the format's ``catalog_lines``, and in the ``head`` its ``catalog_first``), in file
    order; each looked for at C speed, no line split."""
    found = _Found(chunk, recover=not fmt.strict)
    for needle in fmt.catalog_lines:
        for start, stop in _lines_with(chunk, needle):
            found.keep(start, stop)
    for needle, key in fmt.catalog_first if head else ():
        found.keep_first(needle, key)
    return [found.records[start] for start in sorted(found.records)]


class _Found:
    """The records of a chunk's lines kept so far, by where each line starts (each line
    parsed once)."""

    def __init__(self, chunk: bytes, *, recover: bool) -> None:
        self.chunk, self.recover = chunk, recover
        self.records: dict[int, dict[str, Any]] = {}

    def read(self, start: int, stop: int) -> dict[str, Any] | None:
        known = self.records.get(start)
        return known or as_dict(parse_line(self.chunk[start:stop], recover=self.recover))

    def keep(self, start: int, stop: int) -> None:
        if (value := self.read(start, stop)) is not None:
            self.records[start] = value

    def keep_first(self, needle: bytes, key: str) -> None:
        """The first line holding ``needle`` whose record has text at ``key``."""
        for start, stop in _lines_with(self.chunk, needle):
            value = self.read(start, stop)
            if value is not None and isinstance(value.get(key), str):
                self.records[start] = value
                return


def _lines_with(chunk: bytes, needle: bytes) -> Iterator[tuple[int, int]]:
    """Where each of ``chunk``'s complete lines that holds ``needle`` starts and stops."""
    at = chunk.find(needle)
    while at >= 0:
        stop = chunk.find(b"\n", at)
        if stop < 0:
            return
        yield chunk.rfind(b"\n", 0, at) + 1, stop
        at = chunk.find(needle, stop)


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


def _head_and_tail(path: str, *, regular: bool) -> tuple[bytes, bytes, os.stat_result]:
    """The file's head and tail, and its ``fstat``. Only a regular file is opened, never in
    a way that can block (a FIFO is refused); ``regular``: its directory entry said it is
    one (no ``stat`` before the open, the ``fstat`` after it checks again)."""
    fd, stat = open_regular(path, checked=regular)
    try:
        head = os.pread(fd, HEAD_BYTES, 0)
        if stat.st_size <= HEAD_BYTES:
            return head, b"", stat
        return head, os.pread(fd, TAIL_BYTES, max(stat.st_size - TAIL_BYTES, HEAD_BYTES)), stat
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
        title = _harness_title(record) or title
        recap = _recap(record) or recap
    return title or recap


def _harness_title(record: dict[str, Any]) -> str | None:
    """The title a title record holds, on one line."""
    kind = record.get("type")
    key = _TITLE_TYPES.get(kind) if type(kind) is str else None
    value = as_text(record.get(key)) if key else None
    return " ".join(value.split())[:TITLE_CHARS] if value and value.strip() else None


def _recap(record: dict[str, Any]) -> str | None:
    """A recap's text as a title (without the line telling how to turn recaps off)."""
    if record.get("type") != "system" or record.get("subtype") != "away_summary":
        return None
    text = as_text(record.get("content"))
    if text is None:
        return None
    return " ".join(text.split()).removesuffix(RECAP_SUFFIX).strip()[:TITLE_CHARS] or None


def file_entry(
    fmt: JsonlFormat[Any], path: str, real: str | None = None, *, regular: bool = False
) -> CatalogEntry | None:
    """One file's entry; None when it is not adoptable. Raises ValueError when malformed,
    OSError when unreadable. ``real``: the file's resolved path, when the caller knows it;
    ``regular``: its directory entry said it is a regular file. A compressed file is
    listed as the plain file it stands for (its path and id), titled from its head."""
    if fmt.compressed and path.endswith(zst.SUFFIX):
        head, tail, stat = zst.head(path, HEAD_BYTES), b"", os.stat(path)
        real, path = zst.plain_of(real or os.path.realpath(path)), zst.plain_of(path)
    else:
        head, tail, stat = _head_and_tail(path, regular=regular)
    return _entry(fmt, path, real, head, tail, stat)


def _entry(
    fmt: JsonlFormat[Any],
    path: str,
    real: str | None,
    head: bytes,
    tail: bytes,
    stat: os.stat_result,
) -> CatalogEntry | None:
    """The entry of a file read at its head and tail."""
    first, rest = _first_and_rest(head)
    marked = _marked(fmt, rest, head=True)
    described = fmt.describe(first, [first, *marked])
    if described is None:
        return None
    native_id, cwd = described
    real = real or os.path.realpath(path)
    prompt = _first_prompt(fmt, first, rest)
    marked += _marked(fmt, _complete(tail, skip_first_partial=True), head=False)
    return CatalogEntry(
        catalog_id=catalog_id(fmt.kind, real),
        kind=fmt.kind,
        native_id=native_id or os.path.basename(path).removesuffix(".jsonl"),
        path=real,
        cwd=_text(cwd),
        title=_text(_title([first, *marked])) or prompt,
        updated_at=int(stat.st_mtime * 1000),
        size=stat.st_size,
        prompt=prompt,
    )


def _first_prompt(fmt: JsonlFormat[Any], first: dict[str, Any], rest: bytes) -> str | None:
    """The first human prompt in a file's head, as a title."""
    prompt = _text(first_prompt(fmt, [first], _prompts(fmt, rest)))
    return prompt[:TITLE_CHARS] if prompt else None


def _first_and_rest(head: bytes) -> tuple[dict[str, Any], bytes]:
    """A file head's first record (a ValueError when it is none), and the whole lines after
    it (only those an entry reads are parsed)."""
    first_nl = head.find(b"\n")
    first = parse_line(head[: first_nl if first_nl >= 0 else len(head)], recover=False)
    if first is None:
        raise ValueError("first line is not JSON")
    if not isinstance(first, dict):
        raise ValueError("first line is not a JSON object")
    rest = _complete(head[first_nl + 1 :], skip_first_partial=False) if first_nl >= 0 else b""
    return first, rest


def _text(text: str | None) -> str | None:
    """Text read from odd bytes as it can be shown and sent as JSON: a lone surrogate (a
    ``\\ud83d`` escape) becomes U+FFFD."""
    if text is None or text.isascii():
        return text
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


class _Candidate(NamedTuple):
    path: str
    linked: bool  # a symbolic link
    regular: bool  # not a link, and a regular file

    @classmethod
    def of(cls, item: os.DirEntry[str]) -> _Candidate:
        """What its directory entry says of a file (no ``lstat``)."""
        linked = item.is_symlink()
        return cls(item.path, linked, not linked and item.is_file(follow_symlinks=False))


class _Walk(NamedTuple):
    """What a walk of a root found: the files of the format (each with what its directory
    entry says of it), how many were not adoptable, and the folders it could not list."""

    found: list[_Candidate]
    skipped: int
    unreadable: list[dict[str, str]]  # {path, reason}


def _candidates(fmt: JsonlFormat[Any], root: str) -> _Walk:
    """Files of the format under its root, each with what its directory entry says of it
    (no ``lstat``), how many were skipped as not adoptable, and each folder that could not
    be listed, with its reason. A linked directory is not entered, as ``os.walk`` does not,
    so no tree (a symlink loop, a link to ``/``) makes the walk loop or raise."""
    found: list[_Candidate] = []
    skipped = 0
    unreadable: list[dict[str, str]] = []
    folders = [root]
    while folders:
        folder = folders.pop()
        items = _listing(folder, unreadable)
        names = {item.name for item in items}
        base = os.path.basename(folder)
        for item in items:
            kind = _kind(item)
            if kind != "linked folder" and not _utf8(item.name):
                if kind == "folder" or _a_session_file(fmt, item.name, names):
                    unreadable.append({"path": shown_path(item.path), "reason": NOT_UTF8})
            elif kind == "folder":
                folders.append(item.path)
            elif kind == "other" and _a_session_file(fmt, item.name, names):
                verdict = fmt.candidate(base, item.name)
                if verdict:
                    found.append(_Candidate.of(item))
                elif verdict is False:
                    skipped += 1
    return _Walk(sorted(found), skipped, unreadable)


NOT_UTF8 = "its name is not valid UTF-8, which no harness writes and JSON cannot carry"


def _utf8(name: str) -> bool:
    """A name read from the disk that is valid UTF-8 (else it holds ``surrogateescape``
    characters, which no JSON answer can carry)."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def _kind(item: os.DirEntry[str]) -> Literal["folder", "linked folder", "other"]:
    """A real directory, which the walk enters; a link to one, which it neither enters nor
    reads; or anything else (a link that leads nowhere, or round in a loop, may be a session
    file: reading it says why it cannot be read)."""
    try:
        if item.is_dir(follow_symlinks=False):
            return "folder"
        return "linked folder" if item.is_symlink() and item.is_dir() else "other"
    except OSError:  # a link in a loop, or a name that went while the walk ran
        return "other"


def _listing(folder: str, unreadable: list[dict[str, str]]) -> list[os.DirEntry[str]]:
    """A folder's entries; none when it is gone (said nowhere: it went while the walk ran),
    or when it cannot be listed (said in ``unreadable``, with its reason)."""
    try:
        with os.scandir(folder) as listing:
            return list(listing)
    except FileNotFoundError:
        return []
    except OSError as exc:
        unreadable.append({"path": folder, "reason": _reason(exc)})
        return []


def _a_session_file(fmt: JsonlFormat[Any], name: str, names: set[str]) -> bool:
    """A name a session file may have: ``.jsonl``, or its compressed form when the format
    has one and the plain file is not beside it (written back: the plain one is the
    session)."""
    if name.endswith(".jsonl"):
        return True
    compressed = fmt.compressed and name.endswith(".jsonl" + zst.SUFFIX)
    return compressed and zst.plain_of(name) not in names


PARALLEL_FILES = 1000  # a format with this many files is read on every core


def scan_files(fmt: JsonlFormat[Any], root: str, digest: str | None = None) -> CatalogListing:
    """The format's adoptable files under ``root``, newest first; with ``digest``, only
    those whose catalog id's digest starts with it (adoption by id: the files are listed,
    and only those read). Many files are read on every core (:func:`adapters.forked.split`)."""
    if not root or not os.path.lexists(root):  # a harness not installed here
        return CatalogListing()
    walk = _candidates(fmt, root)
    named = _resolved(root, walk.found)
    if digest is not None:
        named = [(c, real) for c, real in named if _digest(fmt, real).startswith(digest)]

    def read(part: list[tuple[_Candidate, str]]) -> CatalogListing:
        return _entries(fmt, part)

    catalog = forked.split(read, named) if len(named) >= PARALLEL_FILES else read(named)
    catalog.skipped += walk.skipped
    catalog.errors += walk.unreadable
    catalog.entries.sort(key=lambda e: (-e.updated_at, e.catalog_id))
    catalog.errors.sort(key=lambda e: e["path"])
    return catalog


def _resolved(root: str, paths: list[_Candidate]) -> list[tuple[_Candidate, str]]:
    """Each file with its resolved path. The walk never enters a linked directory, so below
    the resolved root only a file that is itself a link needs resolving: not one ``lstat``
    per path component."""
    real_root = os.path.realpath(root)
    return [
        (c, os.path.realpath(c.path) if c.linked else real_root + c.path[len(root) :])
        for c in paths
    ]


def _digest(fmt: JsonlFormat[Any], real: str) -> str:
    """The digest of the catalog id of the file at ``real`` (of the plain file, for a
    compressed one)."""
    named = zst.plain_of(real) if fmt.compressed and real.endswith(zst.SUFFIX) else real
    return id_digest(named)


def _entries(fmt: JsonlFormat[Any], named: list[tuple[_Candidate, str]]) -> CatalogListing:
    """The entries of these files (each with its resolved path), unsorted; the unreadable
    and malformed reported, the not adoptable counted."""
    catalog = CatalogListing()
    for found, real in named:
        try:
            entry = file_entry(fmt, found.path, real, regular=found.regular)
        except (OSError, ValueError) as exc:
            catalog.errors.append({"path": found.path, "reason": _reason(exc)})
            continue
        if entry is None:
            catalog.skipped += 1
        else:
            catalog.entries.append(entry)
    return catalog


def _reason(exc: OSError | ValueError) -> str:
    """Why a file could not be listed, in a few words."""
    reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
    return reason or "unreadable"
