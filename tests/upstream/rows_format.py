"""A database format no harness writes, declared the way every format is: one module with
its ``build`` and, for a node, its node protocol (``serve`` on the node, ``remote`` on the
sidecar). ``test_new_format.py`` adds it with one registry line (:data:`ENTRY`) and one
``[roots]`` entry, touching no other file.

One SQLite file: ``session(id, parent_id, directory, title, time_updated)`` and
``message(id, session_id, role, text)``, ``id`` growing. A ``person`` message is a direct
human turn; a session with a parent is a sub-agent run, not adoptable. The marker is the
newest message id read (``lastId``).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping
from typing import Any, Literal

from adapters import node_client
from adapters.base import (
    Adapter,
    DatabaseSource,
    Marker,
    NodeAddress,
    NodeRead,
    Outcome,
    Probe,
    Ref,
    Settings,
    Source,
    Turn,
    session_key_in,
    text_hash,
)
from adapters.catalog import CatalogEntry, CatalogListing, catalog_id
from adapters.registry import Entry
from monitor.errors import BadInput, Declined, OutsideRoots

KIND = "rows"
ENTRY = Entry(
    name=KIND,
    module="tests.upstream.rows_format",
    upstream_kind="rows-cli",
    catalog_id=KIND,
    form="database",
    root_key="rows_db",
    root_default="~/.rows/rows.db",
    node="tests.upstream.rows_format",  # its node protocol: this module too
)
SCHEMA = (
    "CREATE TABLE session (id TEXT PRIMARY KEY, parent_id TEXT, directory TEXT, title TEXT,"
    " time_updated INTEGER);"
    "CREATE TABLE message (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, role TEXT,"
    " text TEXT);"
)
MAX_IDS = 100  # a node reader's batch


def _rows(db: str, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
    """A read-only query (raises OSError or sqlite3.Error)."""
    if not os.path.isfile(db):
        raise FileNotFoundError(db)
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute(sql, args).fetchall()


def messages_after(db: str, session: str, after: int) -> list[tuple[int, str, str]] | None:
    """``(id, role, text)`` of a session's messages after ``after``; None: no such session."""
    if not _rows(db, "SELECT 1 FROM session WHERE id = ?", (session,)):
        return None
    sql = "SELECT id, role, text FROM message WHERE session_id = ? AND id > ? ORDER BY id"
    return [(int(i), str(r), str(t)) for i, r, t in _rows(db, sql, (session, after))]


class RowsAdapter(DatabaseSource):
    kind = KIND

    def __init__(self, db: str) -> None:
        self.db = db

    def database(self, ref: Ref) -> str:
        return str(ref.get("dbPath") or self.db)

    def resolve(self, path: str, thread: str | None) -> Source:
        db = os.path.realpath(self.db)
        if os.path.realpath(path) != db:
            raise OutsideRoots(f"{path} is not the configured {KIND} database {db}")
        if not thread:
            raise BadInput(f"a {KIND} adoption needs the session id (--thread)")
        return Source(ref={"dbPath": db, "threadId": thread}, thread_id=thread)

    async def baseline(self, ref: Ref) -> Marker:
        try:
            found = messages_after(self.database(ref), str(ref["threadId"]), 0)
        except (OSError, sqlite3.Error) as exc:
            raise Declined(f"cannot read {self.database(ref)}: {exc}") from None
        if found is None:
            raise Declined(f"no session {ref['threadId']} in {self.database(ref)}")
        return {"lastId": found[-1][0] if found else 0}

    async def check(self, probes: list[Probe]) -> list[Outcome]:
        return [self._check(p) for p in probes]

    def _check(self, probe: Probe) -> Outcome:
        after = int(probe.marker.get("lastId") or 0)
        try:
            found = messages_after(self.database(probe.ref), str(probe.ref["threadId"]), after)
        except FileNotFoundError:
            return Outcome(status="missing", reason="no such database")
        except (OSError, sqlite3.Error) as exc:
            return Outcome(status="inconclusive", reason=str(exc))
        if found is None:
            return Outcome(status="missing", reason="no such session")
        if not found:
            return Outcome(status="quiet", marker=probe.marker)
        turns = [
            Turn(offset=None, native_id=str(i), text_hash=text_hash(text))
            for i, role, text in found
            if role == "person"
        ]
        return Outcome(
            status="activity",
            marker={"lastId": found[-1][0]},
            turns=turns,
            dedupe_id=str(found[-1][0]),
        )

    async def catalog(self) -> CatalogListing:
        listing = CatalogListing()
        db = os.path.realpath(self.db)
        try:
            rows = _rows(
                db,
                "SELECT s.id, s.parent_id, s.directory, s.title, s.time_updated,"
                " (SELECT count(*) FROM message m WHERE m.session_id = s.id) FROM session s",
            )
        except FileNotFoundError:
            return listing
        except (OSError, sqlite3.Error) as exc:
            listing.errors.append({"path": db, "reason": str(exc)})
            return listing
        for sid, parent, directory, title, updated, count in rows:
            if parent:
                listing.skipped += 1
                continue
            listing.entries.append(
                CatalogEntry(
                    catalog_id=catalog_id(KIND, session_key_in(db, sid)),
                    kind=KIND,
                    native_id=sid,
                    path=db,
                    cwd=directory,
                    title=title,
                    updated_at=int(updated or 0),
                    size=int(count),
                    size_unit="messages",
                )
            )
        return listing

    def replay(self, path: str, thread: str | None, own_texts: list[str]) -> list[dict[str, Any]]:
        outcome = self._check(Probe("replay", {"dbPath": path, "threadId": thread}, {}))
        if outcome.status in ("missing", "inconclusive"):
            raise BadInput(f"cannot read {path}: {outcome.reason}")
        turns = [{"type": "turn", "offset": None, "id": t.native_id} for t in outcome.turns]
        return [*turns, {"type": "summary", "humanTurns": len(turns)}]


def build(settings: Settings) -> Adapter:
    return RowsAdapter(settings.root(KIND))


# -- its node protocol (the registry's ``node``): on the node ------------------------------

NODE_READS: Mapping[str, Literal["GET", "POST"]] = {"signals": "POST", "export": "GET"}


def serve(asked: NodeRead) -> tuple[int, dict[str, Any]]:
    if asked.read == "signals":
        return signals_answer(asked.root, asked.ids(MAX_IDS))
    return export_answer(asked.root, str(asked.thread))


def signals_answer(db: str, ids: list[str]) -> tuple[int, dict[str, Any]]:
    """Each asked session's newest message id (absent: no such session)."""
    try:
        found = {
            sid: (messages_after(db, sid, 0) or [(0, "", "")])[-1][0]
            for sid in ids
            if messages_after(db, sid, 0) is not None
        }
    except (OSError, sqlite3.Error) as exc:
        return 503, {"error": {"code": "query_failed", "message": str(exc)}}
    return 200, {"signals": found}


def export_answer(db: str, session_id: str) -> tuple[int, dict[str, Any]]:
    """A session's person messages (ids and text hashes only: no text crosses the wire)."""
    try:
        found = messages_after(db, session_id, 0)
    except (OSError, sqlite3.Error) as exc:
        return 503, {"error": {"code": "query_failed", "message": str(exc)}}
    if found is None:
        return 404, {"error": {"code": "no_such_session", "message": session_id}}
    people = [{"id": i, "hash": text_hash(t)} for i, role, t in found if role == "person"]
    return 200, {"messages": people}


# -- its node protocol: on the sidecar ---------------------------------------------------


class RowsNodeAdapter(node_client.NodeSource):
    """Links of ``rows-node``: a session's person messages, as the node's export lists them
    (ids and hashes); the marker is the newest id read (``lastId``)."""

    def __init__(self, kind: str, nodes: Mapping[str, NodeAddress]) -> None:
        self.kind = kind
        self.nodes = nodes

    async def catalog(self) -> CatalogListing:
        return await node_client.node_catalog(self.nodes, self.kind, KIND)

    async def _people(self, ref: Ref) -> list[tuple[int, str]]:
        path = f"/v1/sources/{KIND}/{ref.get('threadId')}/export"
        async with node_client.session() as http:
            answer = await node_client.call(http, self.nodes, str(ref.get("nodeId")), path)
        return [(int(m["id"]), str(m["hash"])) for m in answer["messages"]]

    async def baseline(self, ref: Ref) -> Marker:
        try:
            found = await self._people(ref)
        except node_client.NodeError as exc:
            raise Declined(f"cannot read the session from the node: {exc}") from None
        return {"lastId": found[-1][0] if found else 0}

    async def check(self, probes: list[Probe]) -> list[Outcome]:
        return [await self._check(p) for p in probes]

    async def _check(self, probe: Probe) -> Outcome:
        after = int(probe.marker.get("lastId") or 0)
        try:
            found = [(i, h) for i, h in await self._people(probe.ref) if i > after]
        except node_client.Answered as exc:
            status = "missing" if exc.status == 404 else "inconclusive"
            return Outcome(status=status, reason=str(exc))
        except node_client.NodeError as exc:
            return Outcome(status="inconclusive", reason=str(exc))
        if not found:
            return Outcome(status="quiet", marker=probe.marker)
        turns = [Turn(offset=None, native_id=str(i), text_hash=h) for i, h in found]
        last = found[-1][0]
        return Outcome(status="activity", marker={"lastId": last}, turns=turns, dedupe_id=str(last))


def remote(settings: Settings, kind: str, serves: str) -> Adapter:
    return RowsNodeAdapter(kind, settings.nodes)
