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

Both halves of the wire are here. On the node, :func:`serve` answers OpenClaw's item
protocol (``GET /v1/threads/{threadId}/items``, served as this format's ``items`` read):
``before=UUID&limit=N`` answers the thread's items newest first, at most 50 a page, with
``before`` naming the cursor of the next (older) page; ``after=UUID&skip=K&limit=N``
answers, oldest first, the items after the item ``UUID``, past the first ``K``, with
``more`` saying whether more follow. A thread that is not there is ``no_such_thread``; an
item paged from that the thread no longer has (it was rewritten) is ``no_such_item``.
Records the byte pre-filter says cannot be a human turn are sent as ``{"uuid", "type"}``
only.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson

from adapters import node_client
from adapters.base import (
    Adapter,
    Marker,
    NodeAddress,
    NodeRead,
    Outcome,
    OwnPool,
    Probe,
    Ref,
    Settings,
    as_list,
    as_text,
    member,
)
from adapters.catalog import CatalogListing
from adapters.claude import ClaudeState
from adapters.jsonl_format import format_of
from adapters.jsonl_scan import Cutoff, classify_records, remembered, reread_from, time_ms
from adapters.node_client import Gone, NodeError
from adapters.states import boundary_of
from monitor.errors import BadInput, Declined, ItemGone, NotFound

if TYPE_CHECKING:
    import aiohttp  # a node is called only once one is configured

log = logging.getLogger(__name__)

KIND = "claude-node"
PAGE = 50
SERVES = "claude"


# -- on the node ------------------------------------------------------------------------

NODE_READS: Mapping[str, Literal["GET", "POST"]] = {"items": "GET"}
BLOCK = 64 * 1024


def serve(asked: NodeRead) -> tuple[int, dict[str, Any]]:
    """One page of a thread's items (see the module docstring)."""
    query = asked.query
    limit = _limit(asked)
    forward = "after" in query or "skip" in query
    if "before" in query and forward:
        raise BadInput("before pages backwards; after and skip page forwards: not both")
    thread = str(asked.thread)
    path = find_thread(Path(asked.root), thread)
    if forward:
        page = read_forward(path, query.get("after"), asked.number("skip", 0) or 0, limit)
    else:
        page = read_page(path, query.get("before"), limit)
    return 200, {"threadId": thread, **page}


def _limit(asked: NodeRead) -> int:
    """How many items a page may hold, as asked (BadInput unless from 1 to PAGE)."""
    limit = asked.number("limit", PAGE)
    if limit is None or not 1 <= limit <= PAGE:
        raise BadInput(f"limit must be an integer from 1 to {PAGE}")
    return limit


def find_thread(root: Path, thread_id: str) -> Path:
    """The transcript of a thread under the Claude root (one project level down)."""
    real_root = os.path.realpath(root)
    for candidate in sorted(root.glob(f"*/{thread_id}.jsonl")):
        real = os.path.realpath(candidate)
        if os.path.commonpath([real_root, real]) == real_root and os.path.isfile(real):
            return Path(real)
    raise NotFound(f"no thread {thread_id!r} under the Claude root")


def lines_newest_first(path: Path) -> Iterator[bytes]:
    """Complete lines of a file from the last one back (a partial last line is left out)."""
    with path.open("rb") as f:
        pos = f.seek(0, os.SEEK_END)
        carry = b""
        first = True
        while pos > 0:
            start = max(0, pos - BLOCK)
            f.seek(start)
            chunk = f.read(pos - start) + carry
            pos = start
            pieces = chunk.split(b"\n")
            carry = pieces[0]
            tail = pieces[1:]
            if first:
                tail = tail[:-1]  # whatever follows the last newline is not complete yet
                first = False
            for line in reversed(tail):
                line = line.lstrip(b"\x00").strip()
                if line:
                    yield line
        if carry.strip() and not first:
            yield carry.lstrip(b"\x00").strip()


def project(line: bytes) -> dict[str, Any]:
    """What the paired adapter needs of one line."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return {"uuid": None, "type": "invalid"}
    if not isinstance(record, dict):
        return {"uuid": None, "type": "invalid"}
    prefilter = format_of(SERVES).prefilter
    if prefilter is None or prefilter(line, 0, len(line)):
        return record
    uuid = record.get("uuid")
    sent = {"uuid": as_text(uuid), "type": record.get("type")}
    message = record.get("message")
    stop = member(message, "stop_reason")
    if isinstance(stop, str):  # what a session is doing (adapters.states): never the text
        calls = [
            {"type": "tool_use", "name": member(b, "name")}
            for b in as_list(member(message, "content"))
            if member(b, "type") == "tool_use"
        ]
        flags = {k: record[k] for k in ("isSidechain", "isMeta") if k in record}
        said = {"stop_reason": stop, "content": calls}
        sent |= {"message": said, "timestamp": record.get("timestamp"), **flags}
    return sent


def _line_after(data: bytes, uuid: str) -> int | None:
    """The offset just past the complete line of the record whose uuid is ``uuid``: found
    by parsing records, however their JSON is spaced or escaped. Lines holding the quoted
    uuid are parsed first (the fast path); only when none is the record is every line."""
    quoted = orjson.dumps(uuid)
    found = _line_with(data, uuid, quoted)
    return found if found is not None else _line_with(data, uuid, None)


def _line_with(data: bytes, uuid: str, quoted: bytes | None) -> int | None:
    """:func:`_line_after`, among the lines that hold ``quoted`` (every line: None)."""
    pos = 0
    while (end := data.find(b"\n", pos)) >= 0:  # only a partial last line is left after
        line = data[pos:end]
        if (quoted is None or quoted in line) and _uuid_of(line) == uuid:
            return end + 1
        pos = end + 1
    return None


def _uuid_of(line: bytes) -> Any:
    try:
        record = orjson.loads(line.lstrip(b"\x00").strip() or b"null")
    except orjson.JSONDecodeError:
        return None
    return member(record, "uuid")


def read_forward(path: Path, after: str | None, skip: int, limit: int) -> dict[str, Any]:
    """Items after ``after``, oldest first, past the first ``skip``; at most ``limit``."""
    data = path.read_bytes()
    start = 0 if after is None else _after(data, after)
    end = data.rfind(b"\n") + 1  # a partial last line is not an item yet
    lines = (line.lstrip(b"\x00").strip() for line in data[start:end].split(b"\n"))
    items, more = _first_items(itertools.islice(filter(None, lines), skip, None), limit)
    return {"items": items, "more": more}


def _after(data: bytes, uuid: str) -> int:
    """Where the items after the item ``uuid`` start; ItemGone when there is no such item."""
    found = _line_after(data, uuid)
    if found is None:
        raise ItemGone(f"no item {uuid!r} in this thread")
    return found


def _first_items(lines: Iterator[bytes], limit: int) -> tuple[list[dict[str, Any]], bool]:
    """The items of the first ``limit`` lines, and whether more lines follow them."""
    items = [project(line) for line in itertools.islice(lines, limit)]
    return items, next(lines, None) is not None


def read_page(path: Path, before: str | None, limit: int) -> dict[str, Any]:
    """Items newest first, from just before the item ``before`` (the newest when None)."""
    lines = lines_newest_first(path)
    if before is not None:
        _skip_to(lines, before)
    items, more = _first_items(lines, limit)
    cursor = next((i["uuid"] for i in reversed(items) if i.get("uuid")), None)
    return {"items": items, "before": cursor if more else None}


def _skip_to(lines: Iterator[bytes], uuid: str) -> None:
    """``lines`` past the line of the item ``uuid`` (parsed: any spacing, any escape);
    ItemGone when there is no such item."""
    if not any(_uuid_of(line) == uuid for line in lines):
        raise ItemGone(f"no item {uuid!r} in this thread")


# -- on the sidecar ---------------------------------------------------------------------


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
        anchor = as_text(raw_anchor)
        tail = raw_tail if isinstance(raw_tail, int) else 0
        try:
            items = await self._forward(http, probe.ref, anchor, tail)
        except Gone as exc:
            return await self._gone(http, probe, str(exc), again)
        except NodeError as exc:
            return Outcome(status="inconclusive", reason=str(exc))
        return _classified(probe, anchor, tail, items)

    async def _forward(
        self, http: aiohttp.ClientSession, ref: Ref, anchor: str | None, tail: int
    ) -> list[dict[str, Any]]:
        """The items after the marker, oldest first: ``pages`` pages at most."""
        items: list[dict[str, Any]] = []
        after = {"after": anchor} if anchor else {}
        for _ in range(self.pages):
            page = await self._items(http, ref, {"skip": str(tail + len(items)), **after})
            items += [i for i in as_list(page.get("items")) if isinstance(i, dict)]
            if not page.get("more"):
                break
        return items

    async def _gone(
        self, http: aiohttp.ClientSession, probe: Probe, code: str, again: bool
    ) -> Outcome:
        """The node has no such thread (missing), or no longer the marker item: the thread
        is read again, once, and a marker lost twice in a row waits, said, never quiet."""
        if code == "no_such_thread":
            return Outcome(status="missing", reason="the node has no such thread")
        if again:
            return Outcome(status="inconclusive", reason="the node keeps losing the marker")
        if probe.marker.get("lost"):  # the anchor the last re-read gave is lost too
            reason = (
                f"the node cannot find the marker item {probe.marker.get('uuid')!r} twice in"
                " a row (an older node, or a transcript it cannot parse); the link waits"
            )
            return Outcome(status="inconclusive", reason=reason)
        reread = await self._check_one(http, _reread(probe), again=True)
        if reread.marker is not None:  # remembered until a check finds its anchor
            reread = dataclasses.replace(reread, marker={**reread.marker, "lost": True})
        return reread


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
    state_of = fmt.state_of or (lambda item: None)
    doing = boundary_of((s, time_ms(i)) for i in items if (s := state_of(i)) is not None)
    return Outcome(
        status="activity" if result.turns else "quiet",
        marker=new_marker,
        turns=result.turns,
        dedupe_id=f"{newest}:{after}",
        latest_at=result.latest_at,
        compactions=result.compactions,
        consumed_own=own.consumed,
        drift=result.drift if result.drift else None,
        boundary=doing,
    )


def remote(settings: Settings, kind: str = KIND, serves: str = SERVES) -> Adapter:
    return ClaudeNodeAdapter(settings.nodes, pages=settings.node_pages)
