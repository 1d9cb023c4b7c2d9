"""The HTTP API the gateway calls (aiohttp; JSON in and out).

Every route but ``/healthz`` and ``/openapi.json`` needs ``Authorization: Bearer <token>``.
Bodies and queries are checked against the typed models of :mod:`monitor.web.models`, which
also generate the published OpenAPI document (``GET /openapi.json``). A client's mistake
answers 400/403/404/405/413/415 with ``{"error": {"code", "message"}}`` and writes nothing; a
database failure answers 503 (``POST /v1/events`` with ``{"recorded": false}``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any, TypeVar

import msgspec
import orjson
from aiohttp import web

from adapters.base import own_text_hash
from adapters.states import STATES
from monitor.errors import BadInput, NotFound, SessionwatchError, StoreError
from monitor.kernel import Kernel, NewEvent
from monitor.kernel.bus import NOTICE_CHANGES, Bus, notices_may_differ
from monitor.kernel.changes import KEEPALIVE_S
from monitor.kernel.events import EventKind, lacks_via, refuse_a_mistyped_via
from monitor.kernel.feed import NoticeFeed
from monitor.metrics import CONTENT_TYPE, Metrics
from monitor.upstream import UpstreamMonitor
from monitor.web import models, wire
from monitor.web.common import (
    MAX_BODY,
    QUERY_PARAMS,
    STORE_TROUBLE,
    StoreTrouble,
    make_guard,
    store_refused,
    unavailable,
)
from monitor.web.models import (
    AgentQuery,
    CatalogQuery,
    EventIn,
    LinkIn,
    NoticesQuery,
    OwnMessage,
    Payload,
    SessionsQuery,
    SessionUpsert,
    SpawnIn,
    StatusQuery,
    WatchIn,
    convert_query,
    decode,
    given,
    whole,
)
from monitor.web.openapi import declared_query_params, document_bytes
from monitor.web.page_state import PageState
from monitor.web.status_page import StatusPage

log = logging.getLogger(__name__)

T = TypeVar("T")

KERNEL = web.AppKey("kernel", Kernel)
MONITOR = web.AppKey("monitor", UpstreamMonitor)
METRICS = web.AppKey("metrics", Metrics)
TOKEN = web.AppKey("token", str)


async def decoded(request: web.Request, model: type[T]) -> T:
    """The request's JSON body as ``model`` (see :mod:`monitor.web.models`)."""
    if request.content_type != "application/json":
        raise web.HTTPUnsupportedMediaType(reason="send Content-Type: application/json")
    return decode(model, await request.read())


async def no_body(request: web.Request) -> None:
    """A route that takes no body refuses one with fields (named), as the routes that take
    one refuse fields they do not know."""
    body = await request.read()
    if body.strip():
        decode(models.NoBody, body)


def query(request: web.Request, model: type[T]) -> T:
    """The query as ``model``; a parameter given twice is refused (the second would be
    dropped without a word)."""
    given = request.query
    if len(given) != len(set(given)):
        twice = next(k for k in given if len(given.getall(k)) > 1)
        raise BadInput(f"{twice} is given more than once: give it once (a list is a,b,c)")
    return convert_query(model, dict(given))


# -- routes ------------------------------------------------------------------------------

routes = web.RouteTableDef()


def respond(model: type[msgspec.Struct], data: Any, status: int = 200) -> web.Response:
    """An answer in the shape of ``model`` (see :func:`monitor.web.models.answer`)."""
    body = models.answer(model, data)
    return web.Response(body=body, status=status, content_type="application/json")


OK = {"ok": True}


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return respond(models.Ok, OK)


@routes.get("/openapi.json")
async def openapi_document(request: web.Request) -> web.Response:
    return web.Response(body=document_bytes(), content_type="application/json")


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    m, monitor = request.app[METRICS], request.app[MONITOR]
    m.blocked_links.set(await monitor.blocked_count())
    now, found = monitor.now().at, await monitor.doing(frozenset())
    counted = Counter(d.state for d in found)
    longest = {d.state: max(now - d.since, 0) for d in reversed(found) if d.since is not None}
    for state in STATES:  # ``found`` is the longest first: the first of each state stays
        m.sessions_doing.labels(state).set(counted[state])
        m.doing_longest.labels(state).set(longest.get(state, 0) / 1000)
    resp = web.Response(body=m.render())
    resp.headers["Content-Type"] = CONTENT_TYPE
    return resp


@routes.put("/v1/sessions/{key}")
async def put_session(request: web.Request) -> web.Response:
    data = await decoded(request, SessionUpsert)
    info = await request.app[KERNEL].gateway_sessions.upsert(
        request.match_info["key"],
        agent_id=data.agent_id,
        session_id=data.session_id,
        store_path=data.store_path,
        run_active=data.run_active,
    )
    return respond(models.SessionInfo, wire.session_info(info))


@routes.post("/v1/sessions/{key}/reset")
async def reset(request: web.Request) -> web.Response:
    await no_body(request)
    await request.app[KERNEL].gateway_sessions.reset(request.match_info["key"])
    return respond(models.Ok, OK)


@routes.delete("/v1/sessions/{key}")
async def delete(request: web.Request) -> web.Response:
    q = query(request, AgentQuery)
    await request.app[KERNEL].gateway_sessions.delete(
        request.match_info["key"], agent_id=given(q.agent_id)
    )
    return respond(models.Ok, OK)


@routes.post("/v1/sessions/{key}/own-messages")
async def own_message(request: web.Request) -> web.Response:
    data = await decoded(request, OwnMessage)
    await request.app[KERNEL].gateway_sessions.remember_own_message(
        request.match_info["key"], own_text_hash(data.text), agent_id=data.agent_id
    )
    return respond(models.Ok, OK)


def _payload(payload: Payload | None) -> dict[str, Any] | None:
    if payload is None:
        return None
    out: dict[str, Any] = msgspec.to_builtins(payload)
    if "turns" in out:
        out["turns"] = whole(out["turns"])
    return out


def _mistyped_via(kind: EventKind, body: bytes) -> None:
    """The kernel's typo check on the payload as sent (the model keeps known keys only)."""
    payload = orjson.loads(body).get("payload")
    if isinstance(payload, dict):
        refuse_a_mistyped_via(kind, payload)


@routes.post("/v1/events")
async def post_event(request: web.Request) -> web.Response:
    e = await decoded(request, EventIn)
    given = msgspec.structs.asdict(e)  # the kernel's own field names: EventIn is derived
    given.update(payload=_payload(given["payload"]), occurred_at=whole(given["occurred_at"]))
    kind = EventKind(given["kind"])
    if lacks_via(kind, given["payload"]):  # rare: what the model dropped may be a typo
        _mistyped_via(kind, await request.read())
    try:
        result = await request.app[KERNEL].record(NewEvent(**given))
    except StoreError as exc:
        store_refused(request, exc)  # best-effort: the gateway's turn goes on
        failed = {"recorded": False, "error": {"code": "store_unavailable", "message": str(exc)}}
        return unavailable(respond(models.NotRecorded, failed, 503))
    recorded = wire.event_record(result.event, duplicate=result.duplicate)
    return respond(models.EventRecorded, {"recorded": True, **recorded})


@routes.post("/v1/spawns")
async def post_spawn(request: web.Request) -> web.Response:
    data = await decoded(request, SpawnIn)
    result = await request.app[KERNEL].spawn(
        parent=data.parent, child=data.child, run_id=data.run_id
    )
    return respond(models.EventRecord, wire.event_record(result.event, duplicate=result.duplicate))


@routes.post("/v1/watches")
async def post_watch(request: web.Request) -> web.Response:
    data = await decoded(request, WatchIn)
    kernel = request.app[KERNEL]
    watched = await kernel.watch(
        watcher=data.watcher, target=data.target, store_path=data.store_path
    )
    if watched:
        return respond(models.Watched, {"watched": True})
    reason = kernel.why_not_watched(data.watcher, data.target)
    return respond(models.Watched, {"watched": False, "reason": reason})


@routes.get("/v1/sessions/{key}/status")
async def status(request: web.Request) -> web.Response:
    q = query(request, StatusQuery)
    key, agent, since = request.match_info["key"], given(q.agent_id), given(q.changes_since)
    if since is not None:  # the events' JSON is built by the database
        body = await request.app[KERNEL].changes_answer(key, agent_id=agent, since=since)
        return web.Response(body=body, content_type="application/json")
    found = await request.app[KERNEL].status(key, agent_id=agent)
    return respond(models.Status, wire.status(found))


@routes.get("/v1/sessions")
async def sessions(request: web.Request) -> web.Response:
    q = query(request, SessionsQuery)
    keys = [k for k in (given(q.keys) or "").split(",") if k.strip()]
    states = given(q.state)
    if states is not None:  # what adopted sessions are doing, of these keys (all: none)
        found = await request.app[MONITOR].doing_versions(frozenset(states.split(",")))
        shown = [wire.doing(d, v) for d, v in found if not keys or d.session_key in keys]
        return respond(models.Sessions, {"sessions": shown})
    versions = await request.app[KERNEL].state_versions(keys)
    return respond(models.Sessions, {"sessions": wire.state_versions(versions)})


async def _pending(request: web.Request, drain: bool) -> list[dict[str, Any]]:
    q = query(request, NoticesQuery)
    inbox = await request.app[KERNEL].inbox(
        watcher=request.match_info["key"], store_path=given(q.store_path), drain=drain
    )
    return inbox.as_json()


async def _notices(request: web.Request, drain: bool) -> web.Response:
    return respond(models.Notices, {"notices": await _pending(request, drain)})


@routes.get("/v1/watchers/{key}/notices")
async def peek_notices(request: web.Request) -> web.Response:
    return await _notices(request, drain=False)


@routes.post("/v1/watchers/{key}/notices/drain")
async def drain_notices(request: web.Request) -> web.Response:
    await no_body(request)
    return await _notices(request, drain=True)


async def _follow(request: web.Request, after: int | None) -> tuple[list[dict[str, Any]], int]:
    q = query(request, NoticesQuery)
    return await request.app[KERNEL].follow(
        watcher=request.match_info["key"], store_path=given(q.store_path), after=after
    )


STREAMS = web.AppKey("streams", asyncio.Event)  # set when the service stops
BUS = web.AppKey("bus", Bus)  # the service's, handed to the site at its start


@routes.get("/v1/watchers/{key}/notices/stream")
async def stream_notices(request: web.Request) -> web.StreamResponse:
    """Server-Sent Events: every notice that opens for the watcher (``event: notice``, data
    ``{"target", "text"}``), pending ones first, and a keep-alive comment every 15 s. It
    peeks; draining stays an explicit call (see :mod:`monitor.kernel.feed`)."""
    await _pending(request, drain=False)  # a bad key or query is a 400 before the stream
    stopping, bus = request.app[STREAMS], request.app[BUS]
    feed = NoticeFeed()
    loop = asyncio.get_running_loop()
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    changed, written = True, loop.time()
    try:
        async with bus.listen(NOTICE_CHANGES) as heard:  # from before the first read
            while not stopping.is_set():
                if changed:
                    heard.pending()  # what the read below sees
                    for notice in feed.fresh(await _follow(request, feed.after)):
                        await response.write(
                            b"event: notice\ndata: " + orjson.dumps(notice) + b"\n\n"
                        )
                        written = loop.time()
                if loop.time() - written >= KEEPALIVE_S:
                    await response.write(b": keep-alive\n\n")
                    written = loop.time()
                wait = KEEPALIVE_S - (loop.time() - written)
                change = await heard.next(wait, unless=stopping)
                changed = change is not None and notices_may_differ(change)
    except (ConnectionResetError, SessionwatchError):
        pass  # the client went away, or the database did: the stream ends
    return response


@routes.get("/v1/catalog")
async def catalog(request: web.Request) -> web.Response:
    q = query(request, CatalogQuery)
    found = await request.app[MONITOR].sessions.find(
        kind=given(q.kind),
        cwd=given(q.cwd),
        since=given(q.since),
        search=given(q.search),
        limit=given(q.limit),
    )
    return respond(models.Catalog, found.as_json())


@routes.post("/v1/links")
async def post_link(request: web.Request) -> web.Response:
    data = await decoded(request, LinkIn)
    adopted = await request.app[MONITOR].adoption.adopt_source(
        session_key=data.session_key,
        agent_id=data.agent_id,
        session_id=data.session_id,
        catalog_id=data.catalog_id,
        kind=data.kind,
        path=data.path,
        node=data.node,
        thread=data.thread,
    )
    return respond(models.Adopted, wire.adopted(adopted))


@routes.get("/v1/links")
async def get_links(request: web.Request) -> web.Response:
    views = await request.app[MONITOR].links()
    return respond(models.Links, {"links": wire.links(views)})


@routes.delete("/v1/links/{key}")
async def delete_link(request: web.Request) -> web.Response:
    q = query(request, AgentQuery)
    removed = await request.app[MONITOR].unlink(
        request.match_info["key"], agent_id=given(q.agent_id)
    )
    if not removed:
        raise NotFound(f"no link for session {request.match_info['key']!r}")
    return respond(models.Ok, OK)


def build_app(
    kernel: Kernel,
    monitor: UpstreamMonitor,
    metrics: Metrics,
    token: str,
    page: PageState | None = None,
) -> web.Application:
    """The API; with ``page``, the status page too (:mod:`monitor.web.status_page`), whose
    routes check their own admission (the bearer token, or the page's cookie)."""
    open_paths = {"/healthz", "/openapi.json"} | ({"/", "/favicon.ico"} if page else set())
    app = web.Application(
        middlewares=[
            make_guard(TOKEN, frozenset(open_paths), ("/ui/", "/static/") if page else ())
        ],
        client_max_size=MAX_BODY,
    )
    app[QUERY_PARAMS] = declared_query_params()
    app[KERNEL] = kernel
    app[MONITOR] = monitor
    app[METRICS] = metrics
    app[TOKEN] = token
    app[STREAMS] = asyncio.Event()
    app[STORE_TROUBLE] = StoreTrouble()

    async def end_streams(app: web.Application) -> None:
        app[STREAMS].set()

    app.on_shutdown.append(end_streams)
    app.add_routes(routes)
    if page is not None:
        app.add_routes(StatusPage(page, token, app[STREAMS]).routes())
    return app
