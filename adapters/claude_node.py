"""Claude Code on a paired node: the node's items over HTTP, classified here with the same
Claude classifier as local transcripts.

ref ``{nodeId, threadId}``, marker ``{uuid, tail, pending, ...}``: the newest item with a
uuid (what OpenClaw's checker reads), how many uuid-less items (queue operations) after it
were already read, and the Claude queue state. Each tick reads forward from the marker,
oldest first, ``pages`` pages of 50 at most, and the next tick goes on from there: a burst of
any size is read whole, and nothing is skipped. A marker item the node no longer has (the
transcript was rewritten) is handled like a rotated file: the thread is read again and only
what is newer than the last record seen counts. A thread the node says it does not have is
``missing``; any other failure is inconclusive.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import aiohttp

from adapters.base import (
    Adapter,
    Marker,
    NodeAddress,
    Outcome,
    OwnPool,
    Probe,
    Ref,
    Settings,
    Source,
    non_negative_int,
)
from adapters.catalog import Catalog, CatalogEntry, catalog_id
from adapters.claude import ClaudeState
from adapters.jsonl_format import format_of
from adapters.jsonl_scan import Cutoff, classify_records, remembered, reread_from
from adapters.registry import NODE_SERVES
from adapters.tailer import open_regular
from monitor.errors import BadInput, Declined, NotFound, Unreachable, connection_reason

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0


def _token(node: NodeAddress) -> str:
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


class NodeError(Unreachable):
    """The node did not answer, or answered something unusable."""


def newest_anchor(items: list[dict[str, Any]]) -> tuple[str | None, int]:
    """The newest item with a uuid (items newest first) and how many come after it."""
    for index, item in enumerate(items):
        if isinstance(item.get("uuid"), str):
            return item["uuid"], index
    return None, len(items)


class ClaudeNodeAdapter:
    kind = "claude-node"

    def __init__(self, nodes: Mapping[str, NodeAddress], *, pages: int = 4) -> None:
        self.nodes = nodes
        self.pages = pages

    def resolve(self, path: str, thread: str | None) -> Source:
        """``path`` names a configured node; ``thread`` the thread on it."""
        if path not in self.nodes:
            known = ", ".join(sorted(self.nodes)) or "none configured"
            raise NotFound(
                f"unknown node {path!r} (known: {known}); a [nodes.{path}] section added"
                " after serve started needs a reload (SIGHUP) or a restart"
            )
        if not thread or not thread.strip():
            raise BadInput("a claude-node adoption needs the thread id (--thread)")
        return Source(ref={"nodeId": path, "threadId": thread.strip()}, thread_id=thread.strip())

    def catalog_key(self, ref: Ref) -> str:
        return f"{ref.get('nodeId', '')}\n{ref.get('threadId', '')}"

    def watched_paths(self, ref: Ref) -> list[str]:
        return []  # the transcript is on the node's machine: the tick reads it

    async def catalog(self) -> Catalog:
        """Every configured node's sessions; a node that does not answer is an error."""
        found = Catalog()
        for name in sorted(self.nodes):
            try:
                threads = await self.threads(name)
            except NodeError as exc:
                found.errors.append({"path": f"node {name}", "reason": str(exc)})
                continue
            for t in threads:
                thread = str(t.get("threadId") or "")
                if thread:
                    found.entries.append(_entry(name, thread, t))
        return found

    def replay(self, path: str, thread: str | None, own_texts: list[str]) -> list[dict[str, Any]]:
        raise BadInput("replay reads a local file: replay the transcript on the node itself")

    async def _items(
        self, http: aiohttp.ClientSession, ref: dict[str, Any], params: dict[str, str]
    ) -> dict[str, Any]:
        """One page of the thread's items; raises :class:`Gone` or :class:`NodeError`."""
        node = self.nodes.get(str(ref.get("nodeId")))
        if node is None:
            raise NodeError(
                f"unknown node {ref.get('nodeId')!r}: add [nodes.{ref.get('nodeId')}] to the"
                " configuration and reload serve (SIGHUP)"
            )
        url = f"{node.url.rstrip('/')}/v1/threads/{ref.get('threadId')}/items"
        headers = {"Authorization": f"Bearer {_token(node)}"}
        try:
            async with http.get(url, params={"limit": "50", **params}, headers=headers) as resp:
                body: dict[str, Any] = await resp.json(content_type=None)
                if resp.status == 404:
                    code = (body.get("error") or {}).get("code")
                    if code in ("no_such_thread", "no_such_item"):
                        raise Gone(code)
                if resp.status != 200:
                    raise NodeError(f"node answered {resp.status}")
                return body
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError) as exc:
            raise NodeError(connection_reason(exc)) from None

    async def threads(self, name: str) -> list[dict[str, Any]]:
        """The node's adoptable Claude sessions (its catalog); raises :class:`NodeError`."""
        node = self.nodes[name]
        url = f"{node.url.rstrip('/')}/v1/threads"
        headers = {"Authorization": f"Bearer {_token(node)}"}
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.get(url, headers=headers) as resp,
            ):
                body = await resp.json(content_type=None)
                if resp.status != 200 or not isinstance(body, dict):
                    raise NodeError(f"node answered {resp.status}")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise NodeError(connection_reason(exc)) from None
        threads = body.get("threads")
        return [t for t in threads if isinstance(t, dict)] if isinstance(threads, list) else []

    async def baseline(self, ref: Ref) -> Marker:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as http:
            try:
                page = await self._items(http, ref, {})
            except NodeError as exc:
                raise Declined(f"cannot read the thread from the node: {exc}") from None
        items = page.get("items") or []
        if items and not isinstance(items[0].get("uuid"), str):
            raise Declined("the newest item on the node has no uuid")
        uuid, tail = newest_anchor(items)
        return {"uuid": uuid, "tail": tail, "pending": []}

    async def check(self, probes: list[Probe]) -> list[Outcome]:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            return [await self._check_one(http, p) for p in probes]

    async def _check_one(
        self, http: aiohttp.ClientSession, probe: Probe, again: bool = False
    ) -> Outcome:
        marker = probe.marker
        raw_anchor, raw_tail = marker.get("uuid"), marker.get("tail")
        anchor = raw_anchor if isinstance(raw_anchor, str) else None
        tail = raw_tail if isinstance(raw_tail, int) else 0
        items: list[dict[str, Any]] = []
        try:
            for _ in range(self.pages):
                skip = {"skip": str(tail + len(items)), **({"after": anchor} if anchor else {})}
                page = await self._items(http, probe.ref, skip)
                items += [i for i in page.get("items") or [] if isinstance(i, dict)]
                if not page.get("more"):
                    break
        except Gone as exc:
            if str(exc) == "no_such_thread":
                return Outcome(status="missing", reason="the node has no such thread")
            if again:
                return Outcome(status="inconclusive", reason="the node keeps losing the marker")
            if marker.get("lost"):  # the anchor the last re-read gave is lost too: never quiet
                reason = (
                    f"the node cannot find the marker item {anchor!r} twice in a row"
                    " (an older node, or a transcript it cannot parse); the link waits"
                )
                return Outcome(status="inconclusive", reason=reason)
            reread = await self._check_one(http, _reread(probe), again=True)
            if reread.marker is not None:  # remembered until a check finds its anchor
                reread = dataclasses.replace(reread, marker={**reread.marker, "lost": True})
            return reread
        except NodeError as exc:
            return Outcome(status="inconclusive", reason=str(exc))
        return _classified(probe, anchor, tail, items)


class Gone(NodeError):
    """The node answered that the thread, or the marker's item, is not there."""


def _reread(probe: Probe) -> Probe:
    log.warning("%s: the node no longer has the marker item; re-reading", probe.session_key)
    carried = reread_from(probe.marker, probe.last_scanned_at, "rewritten")
    return dataclasses.replace(probe, marker={"uuid": None, "tail": 0, **carried})


def _classified(
    probe: Probe, anchor: str | None, tail: int, items: list[dict[str, Any]]
) -> Outcome:
    marker = probe.marker
    fmt = format_of(NODE_SERVES)
    state = ClaudeState.from_marker(marker)
    own = OwnPool(probe.own)
    result = classify_records(fmt, [(None, i) for i in items], state, own, Cutoff.of(marker))
    newest, after = newest_anchor(list(reversed(items)))
    if newest is None:  # only uuid-less items are new: keep the anchor
        newest, after = anchor, tail + len(items)
    new_marker = {"uuid": newest, "tail": after, **state.to_marker(), **remembered(marker, result)}
    return Outcome(
        status="activity" if result.turns else "quiet",
        marker=new_marker,
        turns=result.turns,
        dedupe_id=f"{newest}:{after}",
        latest_at=result.latest_at,
        compactions=result.compactions,
        consumed_own=own.consumed,
        drift=result.drift if result.drift else None,
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _entry(node: str, thread: str, t: dict[str, Any]) -> CatalogEntry:
    return CatalogEntry(
        catalog_id=catalog_id("claude-node", f"{node}\n{thread}"),
        kind="claude-node",
        native_id=thread,
        path=node,
        cwd=_text(t.get("cwd")),
        title=_text(t.get("title")),
        updated_at=non_negative_int(t.get("updatedAt")),
        size=non_negative_int(t.get("size")),
        prompt=_text(t.get("prompt")),
        node=node,
    )


def build(settings: Settings) -> Adapter:
    return ClaudeNodeAdapter(settings.nodes, pages=settings.node_pages)
