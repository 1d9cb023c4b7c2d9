"""``sessionwatch node``: this machine's harness sessions, read-only, for a paired sidecar.

It serves every kind whose root it has (Claude Code, Codex, Pi, OpenCode), never writes, and
answers only from below the configured roots. Every request needs the bearer token. The
sidecar classifies what it is sent with the same classifiers as local sources; the node
sends only what those read (see each kind's module for what crosses the wire):

- ``GET /v1/catalog?kind=K``: the adoptable sessions of every served kind (or of ``K``),
  each with its kind, thread id, working directory, title, age and size.
- Each format's reads, through its node protocol (the module its registry entry names,
  ``Entry.node``, beside the format in ``adapters/``; :class:`adapters.base.NodeProtocol`):
  ``GET /v1/sources/{kind}/{threadId}/{read}`` for a thread's, ``POST
  /v1/sources/{kind}/{read}`` for a batch. Codex and Pi (:mod:`adapters.jsonl_node`) serve
  ``baseline`` and ``lines`` (the local tailer's read); OpenCode
  (:mod:`adapters.opencode_node`) ``signals`` and ``export``, its database opened
  read-only; Claude Code (:mod:`adapters.claude_node`) ``items``, OpenClaw's item protocol,
  also served at its own paths: ``GET /v1/threads/{threadId}/items`` and the Claude
  catalog of older sidecars, ``GET /v1/threads``. A thread that is not there answers 404
  ``no_such_thread``; an item paged from that is gone, 404 ``no_such_item``; a kind the
  node does not serve, or a read its format does not have, 404 naming what is served.
- ``GET /v1/changes?after=CURSOR&wait=S``: a long poll on the node's change feed, which
  watches the served roots (:class:`ChangeFeed`): it answers the feed's cursor (and the
  kinds whose root exists) at once when it is not ``after``, else when something under a
  root changes, or after ``S`` seconds; ``wait=0`` is the cheap "are you there".
  Only the cursor crosses the wire; a sidecar checks the node's links when it moves, as
  file watching checks local links early. The ticks stay the truth.

These routes dispatch through the registry and import no format: a new format served by a
node adds no code here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import secrets
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiohttp import web

from adapters.base import Adapter, NodeRead, Settings
from adapters.registry import ITEMS_SERVES, entry, node_served
from monitor.errors import BadInput, ItemGone, NotFound
from monitor.pulse import Pulse
from monitor.web.common import error, json_response, make_guard

log = logging.getLogger(__name__)

_THREAD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
ROOTS = web.AppKey("roots", dict[str, str])  # each served format's root, by format name
NODE_TOKEN = web.AppKey("node_token", str)
SERVED = web.AppKey("served", dict[str, Adapter])  # each served format's local adapter
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


def _root(request: web.Request, kind: str) -> str:
    """The root of a served format; else NotFound, naming what is served."""
    root = request.app[ROOTS].get(kind)
    if root is None:
        served = ", ".join(sorted(request.app[ROOTS].keys())) or "none"
        raise NotFound(f"this node serves no {kind!r} sessions this way (served: {served})")
    return root


async def _answer(request: web.Request, kind: str, read: str, thread: str | None) -> web.Response:
    """``read`` of a served format's sources (of ``thread``, else a batch), answered by the
    format's node protocol in a thread; a kind not served, or a read it does not have, is
    refused as such (never "missing")."""
    root = _root(request, kind)
    protocol = entry(kind).node_protocol()
    if protocol.NODE_READS.get(read) != request.method:  # a thread's: GET; a batch: POST
        raise NotFound(f"{kind} sessions have no {read!r} read this way on this node")
    body = await request.read() if request.method == "POST" else b""
    asked = NodeRead(kind, root, read, thread, request.query, body)
    try:
        status, answer = await asyncio.to_thread(protocol.serve, asked)
    except ItemGone as exc:
        return error(404, "no_such_item", str(exc))
    except NotFound as exc:
        return error(404, "no_such_thread", str(exc))
    return json_response(answer, status)


async def thread_read(request: web.Request) -> web.Response:
    thread = _thread_id(request.match_info["thread"])
    return await _answer(request, request.match_info["kind"], request.match_info["read"], thread)


async def batch_read(request: web.Request) -> web.Response:
    return await _answer(request, request.match_info["kind"], request.match_info["read"], None)


async def thread_items(request: web.Request) -> web.Response:
    """OpenClaw's item protocol, at its own path: the Claude format's ``items`` read."""
    thread = _thread_id(request.match_info["thread"])
    if ITEMS_SERVES not in request.app[ROOTS]:
        return error(404, "no_such_thread", f"this node serves no {ITEMS_SERVES} sessions")
    return await _answer(request, ITEMS_SERVES, "items", thread)


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


def build_node_app(roots: Mapping[str, str], token: str) -> web.Application:
    """The node's app, serving each format of ``roots`` (by format name) whose root exists
    now or later."""
    given = dict(roots)
    served_formats = set(node_served())
    known = {
        kind: os.path.expanduser(root) for kind, root in given.items() if kind in served_formats
    }
    app = web.Application(middlewares=[make_guard(NODE_TOKEN)])
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
    app.router.add_post("/v1/sources/{kind}/{read}", batch_read)
    app.router.add_get("/v1/sources/{kind}/{thread}/{read}", thread_read)
    return app
