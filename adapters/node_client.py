"""What every node-backed adapter shares: how a paired node is named, reached and trusted.

A node is a configured ``[nodes.NAME]``: its URL, the file holding its bearer token (read at
each use: it may be rotated), and for ``https`` the SHA-256 fingerprint of the certificate
the node made for itself, which is pinned: the TLS handshake checks it and no certificate
authority is asked. A wrong pin fails closed with one line naming both fingerprints. A
node's sources are named by node and native thread id (``{nodeId, threadId}``); a failed
call is a :class:`NodeError` with its reason, never an exception out of a tick.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from adapters.base import (
    NodeAddress,
    Outcome,
    Probe,
    Ref,
    Source,
    as_list,
    as_text,
    non_negative_int,
)
from adapters.catalog import CatalogEntry, CatalogListing, catalog_id
from adapters.tailer import open_regular
from monitor.errors import BadInput, NotFound, Unreachable, connection_reason

if TYPE_CHECKING:
    import aiohttp  # imported where a node is called: a listing or a tick without nodes
    # never pays for it (a third of a second of a one-shot command)

TIMEOUT_S = 10.0


class NodeError(Unreachable):
    """The node did not answer, or answered something unusable."""


class Answered(NodeError):
    """The node answered with an error: its status and its error ``code``."""

    def __init__(self, reason: str, status: int, code: str | None) -> None:
        super().__init__(reason)
        self.status = status
        self.code = code


class Gone(Answered):
    """The node answered that the thread (``no_such_thread``), or the item paged from
    (``no_such_item``), is not there."""


def token(node: NodeAddress) -> str:
    """The node's token, read at each use (it may be rotated)."""
    try:
        fd, _ = open_regular(os.path.expanduser(node.token_file))  # never a FIFO's wait
        try:
            return os.read(fd, 65536).decode("utf-8", "replace").strip()
        finally:
            os.close(fd)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise NodeError(f"cannot read the node token {node.token_file}: {reason}") from None


def pin_of(node: NodeAddress) -> aiohttp.Fingerprint | None:
    """The certificate pin of an ``https`` node (the configuration requires one)."""
    if not node.fingerprint:
        return None
    import aiohttp

    return aiohttp.Fingerprint(bytes.fromhex(node.fingerprint))


def failure(name: str, url: str, exc: BaseException) -> str:
    """A failed call to node ``name`` in one line; a wrong pin names both fingerprints."""
    import aiohttp

    if isinstance(exc, aiohttp.ServerFingerprintMismatch):
        return (
            f"certificate pin mismatch for node {name}: [nodes.{name}] fingerprint is"
            f" sha256:{exc.expected.hex()}, the node presented sha256:{exc.got.hex()}"
        )
    reason = connection_reason(exc)
    if url.startswith("http:") and isinstance(exc, aiohttp.ServerDisconnectedError):
        return f"{reason} (a node that serves TLS closes plain http://: is it https://?)"
    return reason


def session() -> aiohttp.ClientSession:
    import aiohttp

    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))


CONCURRENT = 8  # a tick's calls in flight to the nodes at once: a far node costs its RTT once


async def each(
    probes: list[Probe], check: Callable[[aiohttp.ClientSession, Probe], Awaitable[Outcome]]
) -> list[Outcome]:
    """``check`` of every probe on one session, a few at a time, outcomes in order."""
    import asyncio

    gate = asyncio.Semaphore(CONCURRENT)

    async def one(http: aiohttp.ClientSession, probe: Probe) -> Outcome:
        async with gate:
            return await check(http, probe)

    async with session() as http:
        return list(await asyncio.gather(*(one(http, p) for p in probes)))


async def call(
    http: aiohttp.ClientSession,
    nodes: Mapping[str, NodeAddress],
    name: str,
    path: str,
    *,
    params: Mapping[str, str] | None = None,
    body: Any = None,
) -> dict[str, Any]:
    """One call to node ``name``: its JSON answer. A 404 with ``no_such_thread`` or
    ``no_such_item`` is :class:`Gone`; anything else unusable is :class:`NodeError`."""
    node = nodes.get(name)
    if node is None:
        raise NodeError(
            f"unknown node {name!r}: add [nodes.{name}] to the configuration and reload"
            " serve (SIGHUP)"
        )
    import aiohttp

    url = f"{node.url.rstrip('/')}{path}"
    headers = {"Authorization": f"Bearer {token(node)}"}
    method = "GET" if body is None else "POST"
    try:
        async with http.request(
            method, url, params=params, json=body, headers=headers, ssl=pin_of(node) or True
        ) as resp:
            answer = await resp.json(content_type=None)
            status = resp.status
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise NodeError(failure(name, node.url, exc)) from None
    if not isinstance(answer, dict):
        raise NodeError(f"node answered {status} without a JSON object")
    if status != 200:
        raise _refusal(status, answer, path)
    return answer


def _refusal(status: int, answer: dict[str, Any], path: str) -> Answered:
    """What a node's error answer says: :class:`Gone`, or why it refused."""
    err = answer.get("error")
    fields = err if isinstance(err, dict) else {}
    code = fields.get("code") if isinstance(fields.get("code"), str) else None
    message = fields.get("message")
    if status == 404 and code in ("no_such_thread", "no_such_item"):
        return Gone(str(code), status, code)
    if status == 404 and (code is None or (code == "not_found" and message == "Not Found")):
        # no such route (aiohttp's own words): a node from before the route
        return Answered(f"node answered 404 at {path}: {OLDER_NODE}", status, code)
    return Answered(f"node answered {status}" + (f": {message}" if message else ""), status, code)


def resolve(nodes: Mapping[str, NodeAddress], kind: str, path: str, thread: str | None) -> Source:
    """A node's source: ``path`` names a configured node, ``thread`` the thread on it."""
    if path not in nodes:
        known = ", ".join(sorted(nodes)) or "none configured"
        raise NotFound(
            f"unknown node {path!r} (known: {known}); a [nodes.{path}] section added"
            " after serve started needs a reload (SIGHUP) or a restart"
        )
    if not thread or not thread.strip():
        raise BadInput(f"a {kind} adoption needs the thread id (--thread)")
    return Source(ref={"nodeId": path, "threadId": thread.strip()}, thread_id=thread.strip())


def catalog_key(ref: Ref) -> str:
    return f"{ref.get('nodeId', '')}\n{ref.get('threadId', '')}"


class NodeSource:
    """What every node form's adapter shares: an adoption names a configured node and a
    thread on it, which key its catalog entry; nothing is watched here (the source is on
    the node's machine: the node's change feed and the tick read it), and nothing replays
    here."""

    kind: str
    nodes: Mapping[str, NodeAddress]

    def resolve(self, path: str, thread: str | None) -> Source:
        """``path`` names a configured node; ``thread`` the thread on it."""
        return resolve(self.nodes, self.kind, path, thread)

    def catalog_key(self, ref: Ref) -> str:
        return catalog_key(ref)

    def watched_paths(self, ref: Ref) -> list[str]:
        return []

    def replay(self, path: str, thread: str | None, own_texts: list[str]) -> list[dict[str, Any]]:
        raise BadInput("replay reads a local source: replay the session on the node itself")


def _text(value: Any) -> str | None:
    return as_text(value) or None


def entry(kind: str, node: str, t: dict[str, Any]) -> CatalogEntry | None:
    """One session a node lists, as the catalog entry of our node kind ``kind``."""
    thread = _text(t.get("threadId"))
    if thread is None:
        return None
    return CatalogEntry(
        catalog_id=catalog_id(kind, f"{node}\n{thread}"),
        kind=kind,
        native_id=thread,
        path=node,
        cwd=_text(t.get("cwd")),
        title=_text(t.get("title")),
        updated_at=non_negative_int(t.get("updatedAt")),
        size=non_negative_int(t.get("size")),
        size_unit="messages" if t.get("sizeUnit") == "messages" else "bytes",
        prompt=_text(t.get("prompt")),
        node=node,
    )


OLDER_NODE = "an older sessionwatch node?"


async def node_catalog(
    nodes: Mapping[str, NodeAddress], kind: str, serves: str, legacy: str | None = None
) -> CatalogListing:
    """The ``serves`` sessions of every configured node, as entries of ``kind``; a node
    that does not answer is an error of the catalog, never an exception. ``legacy``: where a
    node older than ``/v1/catalog`` lists them (under ``threads``)."""
    found = CatalogListing()
    if not nodes:
        return found  # no node configured: no client made (aiohttp is not even imported)
    async with session() as http:
        for name in sorted(nodes):
            try:
                answer = await _listing(http, nodes, name, serves, legacy)
            except NodeError as exc:
                found.errors.append({"path": f"node {name}", "reason": str(exc)})
                continue
            _listed(found, kind, name, answer)
    return found


async def _listing(
    http: aiohttp.ClientSession,
    nodes: Mapping[str, NodeAddress],
    name: str,
    serves: str,
    legacy: str | None,
) -> dict[str, Any]:
    """A node's catalog answer (``sessions``, ``errors``), from an older node's ``legacy``
    listing when it has no ``/v1/catalog``."""
    try:
        return await call(http, nodes, name, "/v1/catalog", params={"kind": serves})
    except NodeError as exc:
        if legacy is None or OLDER_NODE not in str(exc):
            raise
    answer = await call(http, nodes, name, legacy)
    return {**answer, "sessions": answer.get("threads")}


def _listed(found: CatalogListing, kind: str, name: str, answer: dict[str, Any]) -> None:
    """Node ``name``'s sessions and errors, added to ``found``."""
    sessions = answer.get("sessions")
    for t in as_list(sessions):
        made = entry(kind, name, t) if isinstance(t, dict) else None
        if made is not None:
            found.entries.append(made)
    errors = answer.get("errors")
    for e in as_list(errors):
        if isinstance(e, dict):
            where = f"node {name}: {e.get('path', '')}"
            found.errors.append({"path": where, "reason": str(e.get("reason", ""))})
