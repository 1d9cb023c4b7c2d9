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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from adapters import node_client
from adapters.base import (
    Adapter,
    Marker,
    NodeAddress,
    Outcome,
    OwnPool,
    Probe,
    Ref,
    Settings,
)
from adapters.catalog import CatalogListing
from adapters.claude import ClaudeState
from adapters.jsonl_format import format_of
from adapters.jsonl_scan import Cutoff, classify_records, remembered, reread_from
from adapters.node_client import Gone, NodeError
from monitor.errors import Declined

if TYPE_CHECKING:
    import aiohttp  # a node is called only once one is configured

log = logging.getLogger(__name__)

KIND = "claude-node"
PAGE = 50
SERVES = "claude"


def newest_anchor(items: list[dict[str, Any]]) -> tuple[str | None, int]:
    """The newest item with a uuid (items newest first) and how many come after it."""
    for index, item in enumerate(items):
        if isinstance(item.get("uuid"), str):
            return item["uuid"], index
    return None, len(items)


class ClaudeNodeAdapter(node_client.NodeSource):
    kind = KIND

    def __init__(self, nodes: Mapping[str, NodeAddress], *, pages: int = 4) -> None:
        self.nodes = nodes
        self.pages = pages

    async def catalog(self) -> CatalogListing:
        """Every configured node's Claude sessions; a node that does not answer is an error."""
        return await node_client.node_catalog(self.nodes, KIND, SERVES, legacy="/v1/threads")

    async def _items(
        self, http: aiohttp.ClientSession, ref: dict[str, Any], params: dict[str, str]
    ) -> dict[str, Any]:
        """One page of the thread's items; raises :class:`Gone` or :class:`NodeError`."""
        path = f"/v1/threads/{ref.get('threadId')}/items"
        name = str(ref.get("nodeId"))
        return await node_client.call(
            http, self.nodes, name, path, params={"limit": str(PAGE), **params}
        )

    async def baseline(self, ref: Ref) -> Marker:
        async with node_client.session() as http:
            try:
                page = await self._items(http, ref, {})
            except NodeError as exc:
                raise Declined(f"cannot read the thread from the node: {exc}") from None
        items = [i for i in page.get("items") or [] if isinstance(i, dict)]
        uuid, tail = newest_anchor(items)  # Claude Code ends a turn with uuid-less records
        if uuid is None and len(items) >= PAGE:  # older items may follow: nowhere to start
            raise Declined("none of the newest 50 items on the node has a uuid to start from")
        return {"uuid": uuid, "tail": tail, "pending": []}

    async def check(self, probes: list[Probe]) -> list[Outcome]:
        return await node_client.each(probes, self._check_one)

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


def _reread(probe: Probe) -> Probe:
    log.warning("%s: the node no longer has the marker item; re-reading", probe.session_key)
    carried = reread_from(probe.marker, probe.last_scanned_at, "rewritten")
    return probe._replace(marker={"uuid": None, "tail": 0, **carried})


def _classified(
    probe: Probe, anchor: str | None, tail: int, items: list[dict[str, Any]]
) -> Outcome:
    marker = probe.marker
    fmt = format_of(SERVES)
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


def build(settings: Settings, kind: str = KIND, serves: str = SERVES) -> Adapter:
    return ClaudeNodeAdapter(settings.nodes, pages=settings.node_pages)
