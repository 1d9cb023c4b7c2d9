"""``sessionwatch node``: this machine's harness sessions, read-only, for a paired sidecar.

It serves every kind whose root it has (Claude Code, Codex, Pi, OpenCode), never writes, and
answers only from below the configured roots. Every request needs the bearer token. The
sidecar classifies what it is sent with the same classifiers as local sources; the node
sends only what those read (see each kind's module for what crosses the wire):

- ``GET /v1/catalog?kind=K``: the adoptable sessions of every served kind (or of ``K``),
  each with its kind, thread id, working directory, title, age and size.
- Claude Code (:mod:`adapters.claude_node`, OpenClaw's item protocol):
  ``GET /v1/threads/{threadId}/items?before=UUID&limit=N`` answers the thread's items newest
  first, at most 50 a page, with ``before`` naming the cursor of the next (older) page;
  ``GET /v1/threads/{threadId}/items?after=UUID&skip=K&limit=N`` answers, oldest first, the
  items after the item ``UUID``, past the first ``K``, with ``more`` saying whether more
  follow. A thread that is not there answers 404 ``no_such_thread``; an ``after`` item the
  thread no longer has (it was rewritten) answers 404 ``no_such_item``. Records the byte
  pre-filter says cannot be a human turn are sent as ``{"uuid", "type"}`` only.
  ``GET /v1/threads`` is the Claude catalog of older sidecars.
- A format of the file form (Codex and Pi, through :mod:`adapters.jsonl_node`):
  ``GET /v1/sources/{kind}/{threadId}/baseline`` and
  ``GET /v1/sources/{kind}/{threadId}/lines?offset=…`` (the local tailer's read).
- A format of the database form (OpenCode, through :mod:`adapters.opencode_node`):
  ``POST /v1/sources/{kind}/signals`` and ``GET /v1/sources/{kind}/{sessionId}/export``;
  the database is opened read-only.
- ``GET /v1/changes?after=CURSOR&wait=S``: a long poll on the node's change feed, which
  watches the served roots (:class:`ChangeFeed`): it answers the feed's cursor (and the
  kinds whose root exists) at once when it is not ``after``, else when something under a
  root changes, or after ``S`` seconds; ``wait=0`` is the cheap "are you there".
  Only the cursor crosses the wire; a sidecar checks the node's links when it moves, as
  file watching checks local links early. The ticks stay the truth.

Each format's reader is the module its registry entry names (``Entry.node_reader``): these
routes dispatch through the registry, and a new format served by a node adds no code here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import secrets
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from adapters.base import Adapter, FileNodeReader, Settings
from adapters.jsonl_format import JsonlFormat, format_of
from adapters.registry import ITEMS_SERVES, entry, node_served
from monitor.errors import BadInput, ItemGone, NotFound
from monitor.pulse import Pulse
from monitor.web.common import error, json_response, make_guard

log = logging.getLogger(__name__)

PAGE_LIMIT = 50
BLOCK = 64 * 1024
_THREAD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^[0-9a-f]{1,64}$")
ROOT = web.AppKey("root", Path)  # the Claude root
ROOTS = web.AppKey("roots", dict[str, str])  # each served format's root, by format name
NODE_TOKEN = web.AppKey("node_token", str)
SERVED = web.AppKey("served", dict[str, Adapter])  # each served format's local adapter
_PREFILTER = format_of(ITEMS_SERVES).prefilter
MAX_WAIT_S = 25.0
DEBOUNCE_MS = 300  # as file watching groups a sidecar's own changes
# the quiet that ends a group: only a cursor moves, so it may be short (the checks it wakes
# follow the harness's own writes, never a harness's start)
STEP_MS = 10
REARM_MS = 30_000  # how often a root that did not exist yet is looked for


class ChangeFeed:
    """A cursor that moves when anything under a served root changes: ``epoch:seq``, with
    an epoch of its own for each start, so that a sidecar sees a restarted node as moved."""

    def __init__(self, roots: Mapping[str, str]) -> None:
        self.roots = dict(roots)
        self.epoch = secrets.token_hex(6)
        self.pulse = Pulse()
        self.watching: list[str] = []

    @property
    def cursor(self) -> str:
        return f"{self.epoch}:{self.pulse.count}"

    def bump(self) -> None:
        self.pulse.beat()

    def close(self) -> None:
        """Answer every poll now: a node that stops does not wait for them."""
        self.pulse.close()

    async def moved_after(self, cursor: str, wait: float) -> str:
        """The cursor, once it is not ``cursor`` or ``wait`` seconds passed."""
        if cursor == self.cursor:
            await self.pulse.after(self.pulse.count, wait)
        return self.cursor

    def _targets(self) -> tuple[list[str], set[str], tuple[str, ...]]:
        """What exists to watch: directories, the database files among them, and the
        prefixes under which any change counts."""
        dirs: set[str] = set()
        files: set[str] = set()
        prefixes: list[str] = []
        for kind, root in self.roots.items():
            real = os.path.realpath(root)
            if entry(kind).form == "database":
                if os.path.isdir(os.path.dirname(real)):
                    dirs.add(os.path.dirname(real))
                    files |= {real, f"{real}-wal"}
            elif os.path.isdir(real):
                dirs.add(real)
                prefixes.append(real + os.sep)
        return sorted(dirs), files, tuple(prefixes)

    async def run(self) -> None:
        """Watch until cancelled; a watch that fails is said once and tried again (the
        sidecar's ticks read the node meanwhile)."""
        logging.getLogger("watchfiles").setLevel(logging.WARNING)
        failed = False
        while True:
            try:
                await self._watch()
            except Exception as exc:  # no inotify watches left, a root gone mid-watch
                if not failed:
                    log.warning("the change feed cannot watch the roots (%s): retrying", exc)
                failed = True
                await asyncio.sleep(REARM_MS / 1000)

    async def _watch(self) -> None:
        from watchfiles import awatch

        while True:
            dirs, files, prefixes = self._targets()
            self.watching = dirs
            if not dirs:
                await asyncio.sleep(REARM_MS / 1000)
                continue

            def counts(_: Any, path: str, files: set[str] = files, under: Any = prefixes) -> bool:
                return path in files or path.startswith(under)

            async for changes in awatch(
                *dirs,
                watch_filter=counts,
                debounce=DEBOUNCE_MS,
                step=STEP_MS,
                rust_timeout=REARM_MS,
                yield_on_timeout=True,
            ):
                if changes:
                    self.bump()
                elif self._targets()[0] != dirs:
                    break  # a root appeared or went: watch what exists now


FEED = web.AppKey("feed", ChangeFeed)


def _thread_id(thread_id: str) -> str:
    if not _THREAD.match(thread_id):
        raise BadInput(f"invalid thread id {thread_id!r}")
    return thread_id


def find_thread(root: Path, thread_id: str) -> Path:
    """The transcript of a thread under the Claude root (one project level down)."""
    _thread_id(thread_id)
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
    if _PREFILTER is None or _PREFILTER(line, 0, len(line)):
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


def _listed(kind: str, found: Any) -> list[dict[str, Any]]:
    return [
        {
            "kind": kind,
            "threadId": e.native_id,
            "cwd": e.cwd,
            "title": e.title,
            "prompt": e.prompt,
            "updatedAt": e.updated_at,
            "size": e.size,
            "sizeUnit": e.size_unit,
        }
        for e in found.entries
    ]


async def list_threads(request: web.Request) -> web.Response:
    """The Claude sessions under the node's root (the catalog of older sidecars)."""
    served = request.app[SERVED]
    if ITEMS_SERVES not in served:
        return json_response({"threads": []})
    return json_response({"threads": _listed(ITEMS_SERVES, await served[ITEMS_SERVES].catalog())})


def present(roots: Mapping[str, str]) -> list[str]:
    """The formats whose root exists now (a directory; a database form's file): what a node
    serves sessions of, as it says at start and in its catalog's ``kinds``."""
    found = []
    for kind, root in sorted(roots.items()):
        exists = os.path.isfile if entry(kind).form == "database" else os.path.isdir
        if exists(root):
            found.append(kind)
    return found


async def catalog(request: web.Request) -> web.Response:
    """The adoptable sessions of every kind this node serves (``kind``: of one)."""
    served = request.app[SERVED]
    wanted = request.query.get("kind")
    roots: dict[str, str] = request.app[ROOTS]
    kinds = present(roots)
    if wanted is not None and wanted not in served:
        return json_response({"sessions": [], "errors": [], "kinds": kinds})
    sessions: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    for kind in [wanted] if wanted else sorted(served):
        found = await served[kind].catalog()
        sessions += _listed(kind, found)
        errors += found.errors
    return json_response({"sessions": sessions, "errors": errors, "kinds": kinds})


def _jsonl(request: web.Request, root: str) -> tuple[JsonlFormat[Any], str]:
    """The format and session file a JSONL source route names."""
    kind = request.match_info["kind"]
    fmt, thread = format_of(kind), _thread_id(request.match_info["thread"])
    return fmt, entry(kind).file_reader().find_file(fmt, root, thread, request.query.get("file"))


def _file_reader(request: web.Request) -> FileNodeReader:
    """The node reader of the file form a source route names (once it is served)."""
    kind = request.match_info["kind"]
    _root(request, kind, "file")
    return entry(kind).file_reader()


def _root(request: web.Request, kind: str, form: str) -> str:
    """The root of a served format of ``form``; else NotFound, naming what is served."""
    root = request.app[ROOTS].get(kind)
    if root is None or entry(kind).form != form:
        served = ", ".join(sorted(request.app[ROOTS].keys())) or "none"
        raise NotFound(f"this node serves no {kind!r} sessions this way (served: {served})")
    return root


def _count(query: Mapping[str, str], key: str, default: int | None = None) -> int | None:
    raw = query.get(key)
    if raw is None:
        return default
    if not raw.isdigit() or len(raw) > 18:
        raise BadInput(f"{key} must be a non-negative integer")
    return int(raw)


def _digest(query: Mapping[str, str], key: str) -> str | None:
    raw = query.get(key)
    if raw is not None and not _DIGEST.match(raw):
        raise BadInput(f"{key} must be a hex digest")
    return raw


async def _located(
    request: web.Request, read: Callable[[JsonlFormat[Any], str, str], dict[str, Any]]
) -> web.Response:
    """``read(format, root, file)`` of the session a JSONL source route names, in a thread;
    a kind not served is refused as such (never "missing"), a session not there is
    ``no_such_thread``."""
    root = _root(request, request.match_info["kind"], "file")
    try:
        fmt, path = await asyncio.to_thread(_jsonl, request, root)
    except NotFound as exc:
        return error(404, "no_such_thread", str(exc))
    return json_response(await asyncio.to_thread(read, fmt, root, path))


async def source_baseline(request: web.Request) -> web.Response:
    reader = _file_reader(request)
    return await _located(request, reader.read_baseline)


async def source_lines(request: web.Request) -> web.Response:
    query = request.query
    marker = {
        "offset": _count(query, "offset", 0),
        "ino": _count(query, "ino"),
        "head": _digest(query, "head"),
        "tail": _digest(query, "tail"),
    }
    reader = _file_reader(request)
    cap = _count(query, "cap", reader.MAX_CAP) or 1
    max_line = _count(query, "maxLine", reader.MAX_CAP) or 1
    return await _located(
        request,
        lambda fmt, root, path: reader.read_lines(fmt, root, path, marker, cap, max_line),
    )


async def database_signals(request: web.Request) -> web.Response:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        raise BadInput('the body must be JSON: {"ids": [...]}') from None
    ids = body.get("ids") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise BadInput("ids must be a list of session ids")
    kind = request.match_info["kind"]
    db = _root(request, kind, "database")
    reader = entry(kind).database_reader()
    if len(ids) > reader.MAX_IDS:
        raise BadInput(f"at most {reader.MAX_IDS} ids a request")
    status, answer = await asyncio.to_thread(reader.signals_answer, db, ids)
    return json_response(answer, status)


async def database_export(request: web.Request) -> web.Response:
    kind, thread = request.match_info["kind"], _thread_id(request.match_info["thread"])
    db = _root(request, kind, "database")
    reader = entry(kind).database_reader()
    status, answer = await asyncio.to_thread(reader.export_answer, db, thread)
    return json_response(answer, status)


async def changes(request: web.Request) -> web.Response:
    raw = request.query.get("wait", "0")
    try:
        wait = float(raw)
    except ValueError:
        wait = math.nan
    if not math.isfinite(wait):
        raise BadInput("wait must be a number of seconds")
    wait = min(max(wait, 0.0), MAX_WAIT_S)
    feed = request.app[FEED]
    cursor = await feed.moved_after(request.query.get("after", ""), wait)
    roots: dict[str, str] = request.app[ROOTS]
    return json_response(
        {"cursor": cursor, "watching": len(feed.watching), "kinds": present(roots)}
    )


async def _polls_answered(app: web.Application) -> None:
    app[FEED].close()


async def _feed_running(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.ensure_future(app[FEED].run())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def build_node_app(roots: Mapping[str, str] | Path, token: str) -> web.Application:
    """The node's app, serving each format of ``roots`` (by format name; a bare path is a
    Claude root, as older callers gave it) whose root exists now or later."""
    given = {ITEMS_SERVES: str(roots)} if isinstance(roots, Path) else dict(roots)
    served_formats = set(node_served())
    known = {
        kind: os.path.expanduser(root) for kind, root in given.items() if kind in served_formats
    }
    app = web.Application(middlewares=[make_guard(NODE_TOKEN)])
    app[ROOT] = Path(known.get(ITEMS_SERVES, os.devnull))
    app[ROOTS] = known
    app[NODE_TOKEN] = token
    settings = Settings(roots=known)
    app[SERVED] = {kind: entry(kind).build(settings) for kind in sorted(known)}
    app[FEED] = ChangeFeed(known)
    app.cleanup_ctx.append(_feed_running)
    app.on_shutdown.append(_polls_answered)
    app.router.add_get("/v1/changes", changes)
    app.router.add_get("/v1/catalog", catalog)
    app.router.add_get("/v1/threads", list_threads)
    app.router.add_get("/v1/threads/{thread}/items", thread_items)
    app.router.add_post("/v1/sources/{kind}/signals", database_signals)
    app.router.add_get("/v1/sources/{kind}/{thread}/export", database_export)
    app.router.add_get("/v1/sources/{kind}/{thread}/baseline", source_baseline)
    app.router.add_get("/v1/sources/{kind}/{thread}/lines", source_lines)
    return app
