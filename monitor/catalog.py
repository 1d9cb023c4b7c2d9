"""The session catalog: native sessions found under the configured roots.

Each entry: a catalog id (stable across runs: the kind and a digest of the file's real
path), kind, native id, working directory, title where the tool keeps one, last update and
size. Prompt text is never read into an entry. What cannot be adopted (Claude sub-agent
files, Codex sub-agent rollouts) is skipped and counted; a malformed file is reported and
skipped.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from adapters.codex import is_subagent_meta
from adapters.opencode import open_readonly
from adapters.tailer import open_regular
from monitor.config import RootsConfig

HEAD_BYTES = 16 * 1024
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
    return CatalogEntry(
        catalog_id=catalog_id(kind, real),
        kind=kind,
        native_id=native_id,
        path=real,
        cwd=cwd if isinstance(cwd, str) else None,
        title=_title(head_records + tail_records),
        updated_at=int(stat.st_mtime * 1000),
        size=stat.st_size,
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


def print_catalog(catalog: Catalog) -> None:
    """The catalog as a table for people (``sessionwatch catalog``)."""
    table = Table(title="Native sessions", show_lines=False)
    for column in (
        "catalog id",
        "kind",
        "native id",
        "working directory",
        "title",
        "updated",
        "size",
    ):
        table.add_column(column, overflow="fold")
    for e in catalog.entries:
        updated = datetime.fromtimestamp(e.updated_at / 1000, UTC).strftime("%Y-%m-%d %H:%M")
        table.add_row(
            e.catalog_id, e.kind, e.native_id, e.cwd or "", e.title or "", updated, f"{e.size:,}"
        )
    console = Console()
    console.print(table)
    console.print(f"{len(catalog.entries)} sessions; {catalog.skipped} skipped (not adoptable)")
    for err in catalog.errors:
        console.print(f"[yellow]skipped {err['path']}: {err['reason']}[/yellow]")
