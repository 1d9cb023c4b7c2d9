"""The session catalog: native sessions found under the configured roots.

Each entry: a catalog id (stable across runs: the kind and a digest of the file's real
path), kind, native id, working directory, title, last update and size. The title is the
one the harness keeps (Claude's summary or custom title, Pi's session name, OpenCode's
session title), else the first human prompt as the format's classifier finds it, on one
line: the only text an entry holds, shown and never written anywhere. What cannot be
adopted (Claude sub-agent files, Codex sub-agent rollouts) is skipped and counted; a
malformed file is reported and skipped.

:func:`select` filters (kind, working directory, age) and ranks by a fuzzy ``search``
(rapidfuzz: each word of the query against the best-matching word of the title, the
working directory and the first prompt, so typos and word order do not matter).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from adapters.codex import is_subagent_meta
from adapters.jsonl import FORMATS, first_prompt
from adapters.opencode import open_readonly
from adapters.tailer import open_regular
from monitor.config import RootsConfig
from monitor.errors import BadInput
from monitor.paths import expand_user

TITLE_CHARS = 200
HEAD_BYTES = 64 * 1024
TAIL_BYTES = 16 * 1024
KINDS = ("claude", "codex", "opencode", "pi")
_TITLE_TYPES = {"custom-title": "customTitle", "ai-title": "aiTitle", "session_info": "name"}


@dataclass(frozen=True, kw_only=True, slots=True)
class CatalogEntry:
    catalog_id: str
    kind: str
    native_id: str
    path: str
    cwd: str | None
    title: str | None
    updated_at: int
    size: int  # bytes of a file; messages of an OpenCode session
    prompt: str | None = None  # the first human prompt, for search; never in the answer
    session_key: str | None = None  # where the session is already adopted
    node: str | None = None  # the paired node it lives on (kind ``claude-node``)
    score: float | None = None  # the search's score, best first

    @property
    def short_id(self) -> str:
        """The first 8 hex digits of the id: what the table shows and ``adopt`` takes."""
        return self.catalog_id.partition(":")[2][:8]

    def as_json(self) -> dict[str, Any]:
        return {
            "catalogId": self.catalog_id,
            "kind": self.kind,
            "nativeId": self.native_id,
            "path": self.path,
            "cwd": self.cwd,
            "title": self.title,
            "updatedAt": self.updated_at,
            "size": self.size,
            "sessionKey": self.session_key,
            "node": self.node,
            "score": None if self.score is None else round(self.score, 1),
        }


@dataclass
class Catalog:
    entries: list[CatalogEntry] = field(default_factory=list)
    skipped: int = 0
    errors: list[dict[str, str]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "sessions": [e.as_json() for e in self.entries],
            "skipped": self.skipped,
            "errors": self.errors,
        }


def catalog_id(kind: str, real_path: str) -> str:
    return f"{kind}:{hashlib.sha256(real_path.encode()).hexdigest()[:16]}"


def _records(chunk: bytes, *, skip_first_partial: bool) -> list[dict[str, Any]]:
    lines = chunk.split(b"\n")
    if skip_first_partial:
        lines = lines[1:]
    out = []
    for line in lines[:-1] if not chunk.endswith(b"\n") else lines:
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


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


def _title(records: list[dict[str, Any]]) -> str | None:
    title = None
    for record in records:
        key = _TITLE_TYPES.get(str(record.get("type")))
        value = record.get(key) if key else None
        if isinstance(value, str) and value.strip():
            title = " ".join(value.split())[:200]
    return title


def _entry(kind: str, path: str, stat: os.stat_result) -> CatalogEntry | None:
    """One file's entry; None when it is not adoptable. Raises ValueError when malformed."""
    head, tail = _head_and_tail(path, stat.st_size)
    first_nl = head.find(b"\n")
    try:
        first = orjson.loads(head[: first_nl if first_nl >= 0 else len(head)])
    except orjson.JSONDecodeError:
        raise ValueError("first line is not JSON") from None
    if not isinstance(first, dict):
        raise ValueError("first line is not a JSON object")
    head_records = _records(head, skip_first_partial=False)
    tail_records = _records(tail, skip_first_partial=True) if tail else []
    native_id = Path(path).name.removesuffix(".jsonl")
    cwd: Any = None
    if kind == "codex":
        payload = first.get("payload") if first.get("type") == "session_meta" else first
        if not isinstance(payload, dict):
            raise ValueError("no session_meta")
        if is_subagent_meta(payload):
            return None
        native_id = str(payload.get("id") or native_id)
        cwd = payload.get("cwd")
    elif kind == "pi":
        if first.get("type") != "session":
            raise ValueError("no Pi session header")
        native_id = str(first.get("id") or native_id)
        cwd = first.get("cwd")
    else:
        cwd = next((r["cwd"] for r in head_records if isinstance(r.get("cwd"), str)), None)
        if any(r.get("isSidechain") is True for r in head_records[:1]):
            return None
    real = os.path.realpath(path)
    prompt = first_prompt(FORMATS[kind], head_records)
    title = _title(head_records + tail_records)
    return CatalogEntry(
        catalog_id=catalog_id(kind, real),
        kind=kind,
        native_id=native_id,
        path=real,
        cwd=cwd if isinstance(cwd, str) else None,
        title=title or (prompt[:TITLE_CHARS] if prompt else None),
        updated_at=int(stat.st_mtime * 1000),
        size=stat.st_size,
        prompt=prompt[:TITLE_CHARS] if prompt else None,
    )


def _candidates(kind: str, root: Path) -> tuple[list[str], int]:
    """Files of a kind under its root, and how many were skipped as sub-agent files."""
    found: list[str] = []
    skipped = 0
    for dirpath, dirnames, filenames in os.walk(root):
        if kind == "claude" and Path(dirpath).name == "subagents":
            skipped += sum(1 for f in filenames if f.endswith(".jsonl"))
            continue
        for name in filenames:
            if not name.endswith(".jsonl"):
                continue
            if kind == "claude" and name.startswith("agent-"):
                skipped += 1
                continue
            if kind == "codex" and not name.startswith("rollout-"):
                continue
            found.append(os.path.join(dirpath, name))
        dirnames.sort()
    return sorted(found), skipped


def _opencode(db: Path, catalog: Catalog) -> None:
    """Root OpenCode sessions (child sessions are sub-agent runs: skipped and counted)."""
    real = os.path.realpath(db)
    try:
        conn = open_readonly(real)
        try:
            rows = conn.execute(
                "SELECT s.id, s.parent_id, s.directory, s.title, s.time_updated,"
                " (SELECT count(*) FROM message m WHERE m.session_id = s.id) FROM session s"
            ).fetchall()
        finally:
            conn.close()
    except (OSError, sqlite3.Error) as exc:
        catalog.errors.append({"path": real, "reason": str(exc)})
        return
    for sid, parent, directory, title, updated, messages in rows:
        if parent:
            catalog.skipped += 1
            continue
        catalog.entries.append(
            CatalogEntry(
                catalog_id=catalog_id("opencode", f"{real}\n{sid}"),
                kind="opencode",
                native_id=sid,
                path=real,
                cwd=directory,
                title=title or None,
                updated_at=int(updated or 0),
                size=int(messages),
            )
        )


def scan_catalog(roots: RootsConfig, kinds: tuple[str, ...] = KINDS) -> Catalog:
    """List the native sessions under the roots, newest first."""
    catalog = Catalog()
    for kind in kinds:
        root = roots.path_of(kind)
        if kind == "opencode":
            if root.is_file():
                _opencode(root, catalog)
            continue
        if not root.is_dir():
            continue
        paths, skipped = _candidates(kind, root)
        catalog.skipped += skipped
        for path in paths:
            try:
                entry = _entry(kind, path, os.stat(path))
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


def _matches_cwd(entry: CatalogEntry, want: str) -> bool:
    have = entry.cwd or ""
    return have == want or have.startswith(want.rstrip("/") + "/")


_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now_ms: int) -> int:
    """``--since``: an age (``30m``, ``6h``, ``2d``, ``1w``) or a date (``2026-11-30``),
    as the earliest update time in ms."""
    raw = text.strip()
    unit = _AGE_UNITS.get(raw[-1:].lower())
    if unit is not None and raw[:-1].isdigit():
        return now_ms - int(raw[:-1]) * unit * 1000
    try:
        at = datetime.fromisoformat(raw)
    except ValueError:
        raise BadInput(
            f"since must be an age such as 30m, 6h, 2d or 1w, or a date, got {text!r}"
        ) from None
    return int((at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() * 1000)


def _word_score(word: str, candidate: str, **_: Any) -> float:
    from rapidfuzz import fuzz

    score = fuzz.ratio(word, candidate)
    if len(word) >= 3:  # a prefix or a part of a longer word is nearly as good
        score = max(score, fuzz.partial_ratio(word, candidate) * 0.95)
    return float(score)


def _search_score(query: str, text: str, **_: Any) -> float:
    """The mean, over the query's words, of each one's best match among the text's words."""
    from rapidfuzz import process

    words, candidates = query.split(), text.split()
    if not words or not candidates:
        return 0.0
    best = (process.extractOne(w, candidates, scorer=_word_score) for w in words)
    return float(sum(b[1] for b in best if b is not None)) / len(words)


SEARCH_CUTOFF = 75.0


def select(
    catalog: Catalog,
    *,
    cwd: str | None = None,
    since_ms: int | None = None,
    search: str | None = None,
    limit: int | None = None,
) -> Catalog:
    """The entries that pass the filters, newest first or (with ``search``) best first."""
    want = None if cwd is None else os.path.realpath(expand_user(cwd))
    entries = [
        e
        for e in catalog.entries
        if (want is None or _matches_cwd(e, want))
        and (since_ms is None or e.updated_at >= since_ms)
    ]
    if search is not None and search.strip():
        from rapidfuzz import process, utils

        texts = [" ".join(filter(None, (e.title, e.prompt, e.cwd))) for e in entries]
        ranked = process.extract(
            search,
            texts,
            scorer=_search_score,
            processor=utils.default_process,
            score_cutoff=SEARCH_CUTOFF,
            limit=None,
        )
        entries = [
            replace(entries[i], score=float(score))
            for _, score, i in sorted(ranked, key=lambda r: (-r[1], r[2]))
        ]
    return Catalog(entries=entries[:limit], skipped=catalog.skipped, errors=catalog.errors)


def _age(updated_ms: int, now_ms: int) -> str:
    seconds = max(0, (now_ms - updated_ms) // 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return "just now"


def _size(entry: CatalogEntry) -> str:
    if entry.kind == "opencode":
        return f"{entry.size} msg"
    value = float(entry.size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return ""  # pragma: no cover - the loop always returns


def _home(path: str | None) -> str:
    if not path:
        return ""
    home = str(Path.home())
    return "~" + path[len(home) :] if path == home or path.startswith(home + "/") else path


def print_catalog(catalog: Catalog, now_ms: int, *, width: int = 100) -> None:
    """The catalog as a table for people (``sessionwatch catalog``), ``width`` columns wide:
    a short id ``adopt`` takes, the title and working directory cut to fit."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=width)
    table = Table(box=None, pad_edge=False, expand=True, header_style="bold")
    table.add_column("id", no_wrap=True, min_width=8)
    table.add_column("kind", no_wrap=True, overflow="ellipsis", min_width=6, max_width=16)
    table.add_column("title", no_wrap=True, overflow="ellipsis", ratio=1)
    table.add_column("directory", no_wrap=True, overflow="ellipsis", max_width=28)
    table.add_column("age", no_wrap=True, justify="right", min_width=10)
    table.add_column("size", no_wrap=True, justify="right", min_width=8)
    table.add_column("session", no_wrap=True, overflow="ellipsis", max_width=24)
    for e in catalog.entries:
        kind = f"{e.kind}@{e.node}" if e.node else e.kind
        table.add_row(
            e.short_id,
            kind,
            e.title or "",
            _home(e.cwd),
            _age(e.updated_at, now_ms),
            _size(e),
            e.session_key or "",
        )
    console.print(table)
    console.print(f"{len(catalog.entries)} sessions; {catalog.skipped} skipped (not adoptable)")
    for err in catalog.errors:
        console.print(f"[yellow]skipped {err['path']}: {err['reason']}[/yellow]")
