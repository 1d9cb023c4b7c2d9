"""Claude Code on a paired node: the node's latest items over HTTP, classified here with the
same Claude classifier.

ref ``{nodeId, threadId}``, marker ``{uuid, tail, pending}``: the newest item with a uuid,
how many uuid-less items (queue operations) after it were already read, and the Claude
queue state. When the marker's uuid is not on the first page the adapter pages back, up to
``pages`` pages, so a burst of more than 50 items loses no turn; if even that does not reach
it, what was seen is recorded and the gap is logged. A remote read never says "not found"
for sure, so this adapter never reports ``missing``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import aiohttp

from adapters.base import Declined, Marker, Outcome, Probe, Turn
from adapters.claude import ClaudeState, classify_claude_record

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Node:
    """A paired node: its base URL and the file holding its token (read on use)."""

    url: str
    token_file: str

    def token(self) -> str:
        try:
            with open(os.path.expanduser(self.token_file), encoding="utf-8") as f:
                return f.read().strip()
        except OSError as exc:
            raise NodeError(
                f"cannot read the node token {self.token_file}: {exc.strerror}"
            ) from None


class NodeError(Exception):
    pass


def newest_anchor(items: list[dict[str, Any]]) -> tuple[str | None, int]:
    """The newest item with a uuid (items newest first) and how many come after it."""
    for index, item in enumerate(items):
        if isinstance(item.get("uuid"), str):
            return item["uuid"], index
    return None, len(items)


class ClaudeNodeAdapter:
    kind = "claude-node"

    def __init__(self, nodes: dict[str, Node], *, pages: int = 4) -> None:
        self.nodes = nodes
        self.pages = pages

    async def _page(
        self, http: aiohttp.ClientSession, ref: dict[str, Any], before: str | None
    ) -> dict[str, Any]:
        node = self.nodes.get(str(ref.get("nodeId")))
        if node is None:
            raise NodeError(f"unknown node {ref.get('nodeId')!r}")
        params = {"limit": "50", **({"before": before} if before else {})}
        url = f"{node.url.rstrip('/')}/v1/threads/{ref.get('threadId')}/items"
        headers = {"Authorization": f"Bearer {node.token()}"}
        try:
            async with http.get(url, params=params, headers=headers) as resp:
                if resp.status != 200:
                    raise NodeError(f"node answered {resp.status}")
                body: dict[str, Any] = await resp.json()
                return body
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise NodeError(str(exc) or type(exc).__name__) from None

    async def baseline(self, ref: dict[str, Any]) -> Marker:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as http:
            try:
                page = await self._page(http, ref, None)
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

    async def _check_one(self, http: aiohttp.ClientSession, probe: Probe) -> Outcome:
        marker_uuid = probe.marker.get("uuid")
        seen: list[dict[str, Any]] = []  # newest first
        before: str | None = None
        found = False
        try:
            for _ in range(self.pages):
                page = await self._page(http, probe.ref, before)
                items = page.get("items") or []
                for item in items:
                    if marker_uuid is not None and item.get("uuid") == marker_uuid:
                        found = True
                        break
                    seen.append(item)
                before = page.get("before")
                if found or not before:
                    break
        except NodeError as exc:
            return Outcome(status="inconclusive", reason=str(exc))
        if marker_uuid is not None and not found and before:
            log.warning(
                "%s: the marker is more than %d pages back on the node; recording what"
                " was seen, earlier turns may be missed",
                probe.session_key,
                self.pages,
            )
        newer = list(reversed(seen))  # chronological
        tail = probe.marker.get("tail")
        if found and isinstance(tail, int):
            newer = newer[tail:]
        state = ClaudeState.from_marker(probe.marker)
        turns = []
        for item in newer:
            digest = classify_claude_record(item, state)
            if digest is not None and digest not in probe.own_hashes:
                uuid = item.get("uuid")
                turns.append(
                    Turn(
                        offset=None,
                        native_id=uuid if isinstance(uuid, str) else None,
                        text_hash=digest,
                    )
                )
        anchor, after = newest_anchor(seen) if seen else (marker_uuid, 0)
        if not seen:
            after = tail if isinstance(tail, int) else 0
        elif anchor is None:  # only uuid-less items are new: keep the old anchor
            anchor, after = marker_uuid, (tail if isinstance(tail, int) else 0) + len(newer)
        marker = {"uuid": anchor, "tail": after, **state.to_marker()}
        return Outcome(status="activity", marker=marker, turns=turns, dedupe_id=f"{anchor}:{after}")
