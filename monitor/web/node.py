"""``sessionwatch node``: this machine's Claude transcripts, read-only, for a paired sidecar.

``GET /v1/threads/{threadId}/items?before=UUID&limit=N`` answers the thread's items newest
first, at most 50 a page, with ``before`` naming the cursor of the next (older) page.
``GET /v1/threads/{threadId}/items?after=UUID&skip=K&limit=N`` answers, oldest first, the
items that follow the item ``UUID`` (from the start without ``after``), leaving out the first
``K`` of them, with ``more`` saying whether more follow: a paired sidecar reads forward from
its marker, page by page, and never skips an item. A thread that is not there answers 404
``no_such_thread``; an ``after`` item the thread no longer has (it was rewritten) answers 404
``no_such_item``. Every request needs the bearer token; only threads under the configured
Claude root are served.
Records that cannot be a human turn (the byte pre-filter says so exactly) are sent as
``{"uuid", "type"}`` only, so tool output never crosses the wire.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from adapters.base import Adapter, Settings
from adapters.jsonl_format import format_of
from adapters.registry import NODE_SERVES, entry
from monitor.errors import BadInput, ItemGone, NotFound
from monitor.web.common import error, json_response, make_guard

PAGE_LIMIT = 50
BLOCK = 64 * 1024
_THREAD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
ROOT = web.AppKey("root", Path)
NODE_TOKEN = web.AppKey("node_token", str)
SERVED = web.AppKey("served", Adapter)
_PREFILTER = format_of(NODE_SERVES).prefilter


def find_thread(root: Path, thread_id: str) -> Path:
    """The transcript of a thread under the Claude root (one project level down)."""
    if not _THREAD.match(thread_id):
        raise BadInput(f"invalid thread id {thread_id!r}")
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
    if _PREFILTER is None or _PREFILTER(line):
        return record
    uuid = record.get("uuid")
    return {"uuid": uuid if isinstance(uuid, str) else None, "type": record.get("type")}


def _line_after(data: bytes, uuid: str) -> int | None:
    """The offset just past the complete line of the record whose uuid is ``uuid``: found
    by parsing records, however their JSON is spaced or escaped. Lines holding the quoted
    uuid are parsed first (the fast path); only when none is the record is every line."""
    quoted = orjson.dumps(uuid)
    for fast in (True, False):
        pos = 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            if end < 0:
                return None  # only a partial last line is left
            line = data[pos:end]
            if (not fast or quoted in line) and _uuid_of(line) == uuid:
                return end + 1
            pos = end + 1
        if not fast:
            break
    return None


def _uuid_of(line: bytes) -> Any:
    try:
        record = orjson.loads(line.lstrip(b"\x00").strip() or b"null")
    except orjson.JSONDecodeError:
        return None
    return record.get("uuid") if isinstance(record, dict) else None


def read_forward(path: Path, after: str | None, skip: int, limit: int) -> dict[str, Any]:
    """Items after ``after``, oldest first, past the first ``skip``; at most ``limit``."""
    data = path.read_bytes()
    start = 0
    if after is not None:
        found = _line_after(data, after)
        if found is None:
            raise ItemGone(f"no item {after!r} in this thread")
        start = found
    end = data.rfind(b"\n") + 1  # a partial last line is not an item yet
    items: list[dict[str, Any]] = []
    seen = 0
    more = False
    pos = start
    while pos < end:
        nl = data.index(b"\n", pos)
        line = data[pos:nl].lstrip(b"\x00").strip()
        pos = nl + 1
        if not line:
            continue
        seen += 1
        if seen <= skip:
            continue
        if len(items) == limit:
            more = True
            break
        items.append(project(line))
    return {"items": items, "more": more}


def read_page(path: Path, before: str | None, limit: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    seeking = before is not None
    more = False
    for line in lines_newest_first(path):
        if seeking:
            if _uuid_of(line) == before:  # parsed: any spacing, any escape
                seeking = False
            continue
        if len(items) == limit:
            more = True
            break
        items.append(project(line))
    if seeking:
        raise NotFound(f"no item {before!r} in this thread")
    cursor = next((i["uuid"] for i in reversed(items) if i.get("uuid")), None)
    return {"items": items, "before": cursor if more else None}


async def thread_items(request: web.Request) -> web.Response:
    query = request.query
    raw_limit = query.get("limit", str(PAGE_LIMIT))
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= PAGE_LIMIT:
        raise BadInput(f"limit must be an integer from 1 to {PAGE_LIMIT}")
    raw_skip = query.get("skip", "0")
    if not raw_skip.isdigit() or len(raw_skip) > 9:
        raise BadInput("skip must be a non-negative integer")
    if "before" in query and ("after" in query or "skip" in query):
        raise BadInput("before pages backwards; after and skip page forwards: not both")
    thread = request.match_info["thread"]
    try:
        path = find_thread(request.app[ROOT], thread)
    except NotFound as exc:
        return error(404, "no_such_thread", str(exc))
    try:
        if "after" in query or "skip" in query:
            page = read_forward(path, query.get("after"), int(raw_skip), int(raw_limit))
        else:
            page = read_page(path, query.get("before"), int(raw_limit))
    except ItemGone as exc:
        return error(404, "no_such_item", str(exc))
    return json_response({"threadId": thread, **page})


async def list_threads(request: web.Request) -> web.Response:
    """The Claude sessions under the node's root, as the gateway's catalog lists them."""
    found = await request.app[SERVED].catalog()
    threads = [
        {
            "threadId": e.native_id,
            "cwd": e.cwd,
            "title": e.title,
            "prompt": e.prompt,
            "updatedAt": e.updated_at,
            "size": e.size,
        }
        for e in found.entries
    ]
    return json_response({"threads": threads})


def build_node_app(root: Path, token: str) -> web.Application:
    app = web.Application(middlewares=[make_guard(NODE_TOKEN)])
    app[ROOT] = root
    app[NODE_TOKEN] = token
    app[SERVED] = entry(NODE_SERVES).build(Settings(roots={NODE_SERVES: str(root)}))
    app.router.add_get("/v1/threads", list_threads)
    app.router.add_get("/v1/threads/{thread}/items", thread_items)
    return app
