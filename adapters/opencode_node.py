"""OpenCode sessions on a paired node: the node queries its database read-only, the sidecar
classifies with the local adapter's own code.

Both halves of the wire are here. On the node, :func:`signals_answer` is the same batched
query a local tick runs (one per tick for every linked session: parent and change signal),
and :func:`export_answer` the same export, for a session whose signal advanced. An export
sends the session's user messages only, and of their parts only what the classifier reads
(:func:`projected`): each part's ``type``; a text part's ``text``, ``synthetic``,
``ignored``, its ``compaction_continue`` flag and its mention spans; a file part's ``mime``
and ``filename``. No assistant message, tool call or tool output crosses the wire.

On the sidecar, :class:`OpenCodeNodeAdapter` is :class:`~adapters.opencode.OpenCodeAdapter`
reading through :class:`NodeSessions`: the same markers (``seq``, ``lastHumanMessageId``),
the same replay suppression, the same drift, the same "missing" for a session or a database
that is gone, and an inconclusive check, with its reason, for a node that does not answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from adapters import node_client
from adapters.base import Adapter, NodeAddress, NodeRead, Ref, Settings, as_list, as_text, member
from adapters.catalog import CatalogListing
from adapters.node_client import Answered
from adapters.opencode import OpenCodeAdapter, message_state_wire
from adapters.opencode_reads import Export, QueryFailed, UserMessage, read_export, read_signals

NO_DATABASE = "no_such_database"
SCHEMA_DRIFT = "schema_drift"
QUERY_FAILED = "query_failed"
MAX_IDS = 1000  # one tick's batch per node


# -- on the node ------------------------------------------------------------------------


def _span(part: dict[str, Any]) -> dict[str, Any] | None:
    source = part.get("source")
    span = member(source, "text")
    if isinstance(span, dict):
        return {"text": {"start": span.get("start"), "end": span.get("end")}}
    return None


def projected(part: dict[str, Any]) -> dict[str, Any]:
    """What the classifier reads of a user message's part (see the module docstring)."""
    kind = part.get("type")
    out: dict[str, Any] = {"type": kind}
    if kind == "text":
        for key in ("text", "synthetic", "ignored"):
            if key in part:
                out[key] = part[key]
        metadata = part.get("metadata")
        if isinstance(metadata, dict) and "compaction_continue" in metadata:
            out["metadata"] = {"compaction_continue": metadata["compaction_continue"]}
    elif kind == "file":
        out.update({k: part[k] for k in ("mime", "filename") if k in part})
    source = _span(part)
    if source is not None:
        out["source"] = source
    return out


NODE_READS: Mapping[str, Literal["GET", "POST"]] = {"signals": "POST", "export": "GET"}


def serve(asked: NodeRead) -> tuple[int, dict[str, Any]]:
    """``signals``: a tick's batch (``{"ids": [...]}``); ``export``: one session's."""
    if asked.read == "signals":
        return signals_answer(asked.root, asked.ids(MAX_IDS))
    return export_answer(asked.root, str(asked.thread))


def signals_answer(db: str, ids: list[str]) -> tuple[int, dict[str, Any]]:
    """The status and body of the node's answer to a tick's signal query."""
    return _answer(db, lambda: _signals_body(read_signals(db, ids)))


def export_answer(db: str, session_id: str) -> tuple[int, dict[str, Any]]:
    """The status and body of the node's answer to one session's export."""
    return _answer(db, lambda: _export_body(read_export(db, session_id)))


def _signals_body(found: dict[str, tuple[Any, int]]) -> dict[str, Any]:
    return {"signals": {sid: [parent, seq] for sid, (parent, seq) in found.items()}}


def _export_body(export: Export) -> dict[str, Any]:
    messages = [{"id": m.id, "parts": [projected(p) for p in m.parts]} for m in export.messages]
    every = [[m, message_state_wire(data)] for m, data in export.every]  # what it is doing
    return {
        "messages": messages,
        "newest": export.newest,
        "version": export.version,
        "every": every,
    }


def _answer(db: str, body: Callable[[], dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """``body``'s answer, or the local reader's failure as the node's error answer."""
    try:
        return 200, body()
    except FileNotFoundError:
        return 404, _error(NO_DATABASE, f"no OpenCode database at {db}")
    except QueryFailed as exc:
        return 503, _error(SCHEMA_DRIFT if exc.drift else QUERY_FAILED, str(exc))


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


# -- on the sidecar ---------------------------------------------------------------------


def _raised(exc: Answered) -> BaseException:
    """The node's error as the local reader raises it."""
    if exc.code == NO_DATABASE:
        return FileNotFoundError(str(exc))
    if exc.code in (SCHEMA_DRIFT, QUERY_FAILED):
        reason = str(exc).partition(": ")[2] or str(exc)
        return QueryFailed(reason, drift=exc.code == SCHEMA_DRIFT)
    return exc


class NodeSessions:
    """OpenCode sessions read from the paired nodes (one batch per node and tick)."""

    def __init__(self, nodes: Mapping[str, NodeAddress]) -> None:
        self.nodes = nodes

    def where(self, ref: Ref) -> str:
        return str(ref.get("nodeId", ""))

    async def signals(self, where: str, ids: list[str]) -> dict[str, tuple[Any, int]]:
        found: dict[str, tuple[Any, int]] = {}
        async with node_client.session() as http:
            for start in range(0, len(ids), MAX_IDS):
                body = {"ids": ids[start : start + MAX_IDS]}
                path = "/v1/sources/opencode/signals"
                try:
                    answer = await node_client.call(http, self.nodes, where, path, body=body)
                except Answered as exc:
                    raise _raised(exc) from None
                raw = answer.get("signals")
                for sid, value in (raw if isinstance(raw, dict) else {}).items():
                    if isinstance(value, list) and len(value) == 2 and isinstance(value[1], int):
                        found[str(sid)] = (value[0], value[1])
        return found

    async def export(self, where: str, session_id: str) -> Export:
        path = f"/v1/sources/opencode/{session_id}/export"
        async with node_client.session() as http:
            try:
                answer = await node_client.call(http, self.nodes, where, path)
            except Answered as exc:
                raise _raised(exc) from None
        raw = answer.get("messages")
        messages = [
            UserMessage(
                id=str(m["id"]), parts=[p for p in m.get("parts") or [] if isinstance(p, dict)]
            )
            for m in as_list(raw)
            if isinstance(m, dict) and isinstance(m.get("id"), str)
        ]
        newest, version = answer.get("newest"), answer.get("version")
        every = [  # a node of an earlier release sends none: nothing is derived
            (str(m[0]), m[1])
            for m in as_list(answer.get("every"))
            if isinstance(m, list) and len(m) == 2 and isinstance(m[1], dict)
        ]
        return Export(
            messages=messages,
            newest=as_text(newest),
            version=as_text(version),
            every=every,
        )


class OpenCodeNodeAdapter(node_client.NodeSource, OpenCodeAdapter):
    kind = "opencode-node"

    def __init__(self, nodes: Mapping[str, NodeAddress], settings: Settings) -> None:
        super().__init__(
            concurrency=settings.export_concurrency,
            lookback=settings.replay_lookback,
            sessions=NodeSessions(nodes),
        )
        self.nodes = nodes

    async def catalog(self) -> CatalogListing:
        return await node_client.node_catalog(self.nodes, self.kind, "opencode")

    async def catalog_matching(self, digest: str) -> CatalogListing:
        """A node's sessions, listed whole: the node finds none by id (the local
        database's reading by id is not this adapter's)."""
        return await self.catalog()


def remote(settings: Settings, kind: str, serves: str) -> Adapter:
    return OpenCodeNodeAdapter(settings.nodes, settings)
