"""The HTTP API the gateway calls (aiohttp; JSON in and out through orjson).

Every route but ``/healthz`` needs ``Authorization: Bearer <token>``. A client's mistake
answers 400/404/405/413/415 with ``{"error": {"code", "message"}}`` and writes nothing; a
database failure answers 503 (``POST /v1/events`` with ``{"recorded": false}``).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web, web_protocol
from aiohttp.web_request import BaseRequest

from monitor.errors import BadInput, NotFound, SessionwatchError, StoreError
from monitor.events import MAX_INT64, parse_actor, parse_kind
from monitor.kernel import Kernel
from monitor.metrics import CONTENT_TYPE, Metrics
from monitor.notices import Notice
from monitor.upstream import UpstreamMonitor, check_kind

log = logging.getLogger(__name__)

MAX_BODY = 1024 * 1024
RETRY_AFTER_S = "1"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

KERNEL = web.AppKey("kernel", Kernel)
MONITOR = web.AppKey("monitor", UpstreamMonitor)
METRICS = web.AppKey("metrics", Metrics)
TOKEN = web.AppKey("token", str)


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def error(status: int, code: str, message: str) -> web.Response:
    return json_response({"error": {"code": code, "message": message}}, status)


def unavailable(response: web.Response) -> web.Response:
    """A 503 tells the client when to try again."""
    response.headers["Retry-After"] = RETRY_AFTER_S
    return response


def token_matches(header: str, expected: str) -> bool:
    """Constant-time comparison of a bearer token; any malformed header is just wrong."""
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    presented = given.strip().encode("utf-8", "surrogateescape")
    return hmac.compare_digest(presented, expected.encode())


_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    415: "unsupported_media_type",
    400: "bad_request",
}


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except NotFound as exc:
        return error(404, "not_found", str(exc))
    except BadInput as exc:
        return error(400, "bad_request", str(exc))
    except StoreError as exc:
        log.warning("%s %s: %s", request.method, request.path, exc)
        return unavailable(error(503, "store_unavailable", str(exc)))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _HTTP_CODES.get(exc.status, "http_error")
        message = exc.text if exc.status == 400 and exc.text else exc.reason
        if exc.status == 413:
            message = f"request body is larger than {MAX_BODY} bytes"
        return error(exc.status, code, message or code)
    except SessionwatchError as exc:
        return error(400, "bad_request", str(exc))


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path == "/healthz":
        return await handler(request)
    if not token_matches(request.headers.get("Authorization", ""), request.app[TOKEN]):
        return error(401, "unauthorized", "a valid Authorization: Bearer <token> is required")
    return await handler(request)


async def body(request: web.Request, allowed: set[str]) -> dict[str, Any]:
    """The request's JSON object; unknown fields are refused by name."""
    if request.content_type != "application/json":
        raise web.HTTPUnsupportedMediaType(reason="send Content-Type: application/json")
    raw = await request.read()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadInput("request body must be a JSON object")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise BadInput(f"unknown field {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")
    return data


def field(data: dict[str, Any], name: str, kind: type, *, required: bool = False) -> Any:
    value = data.get(name)
    if value is None:
        if required:
            raise BadInput(f"{name} is required")
        return None
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise BadInput(f"{name} must be an integer")
    if kind is int and not -MAX_INT64 - 1 <= value <= MAX_INT64:
        raise BadInput(f"{name} is out of range (a 64-bit integer)")
    if not isinstance(value, kind):
        raise BadInput(f"{name} must be a {kind.__name__ if kind is not str else 'string'}")
    return value


def query_int(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"{name} must be a non-negative integer, got {raw!r}") from None
    if not 0 <= value <= MAX_INT64:
        raise BadInput(f"{name} must be a non-negative 64-bit integer, got {raw!r}")
    return value


# -- routes ------------------------------------------------------------------------------

routes = web.RouteTableDef()


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return json_response({"ok": True})


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    m = request.app[METRICS]
    m.blocked_links.set(await request.app[MONITOR].blocked_count())
    resp = web.Response(body=m.render())
    resp.headers["Content-Type"] = CONTENT_TYPE
    return resp


@routes.put("/v1/sessions/{key}")
async def put_session(request: web.Request) -> web.Response:
    data = await body(request, {"agentId", "sessionId", "storePath", "runActive"})
    info = await request.app[KERNEL].upsert_session(
        request.match_info["key"],
        agent_id=field(data, "agentId", str),
        session_id=field(data, "sessionId", str),
        store_path=field(data, "storePath", str),
        run_active=field(data, "runActive", bool),
    )
    return json_response(info)


@routes.post("/v1/sessions/{key}/reset")
async def reset(request: web.Request) -> web.Response:
    await request.app[KERNEL].reset(request.match_info["key"])
    return json_response({"ok": True})


@routes.delete("/v1/sessions/{key}")
async def delete(request: web.Request) -> web.Response:
    await request.app[KERNEL].delete(
        request.match_info["key"], agent_id=request.query.get("agentId")
    )
    return json_response({"ok": True})


@routes.post("/v1/sessions/{key}/own-messages")
async def own_message(request: web.Request) -> web.Response:
    data = await body(request, {"text", "agentId"})
    limit = request.app[MONITOR].config.monitor.own_text_limit
    text = field(data, "text", str, required=True)
    await request.app[KERNEL].remember_own_message(
        request.match_info["key"], text, agent_id=field(data, "agentId", str), limit=limit
    )
    return json_response({"ok": True})


EVENT_FIELDS = {
    "sessionKey",
    "kind",
    "actorType",
    "actorId",
    "agentId",
    "runId",
    "sessionId",
    "summary",
    "dedupeKey",
    "payload",
    "occurredAt",
}


@routes.post("/v1/events")
async def post_event(request: web.Request) -> web.Response:
    data = await body(request, EVENT_FIELDS)
    fields = {
        "session_key": field(data, "sessionKey", str, required=True),
        "kind": parse_kind(field(data, "kind", str, required=True)),
        "actor_type": parse_actor(field(data, "actorType", str, required=True)),
        "actor_id": field(data, "actorId", str),
        "agent_id": field(data, "agentId", str),
        "run_id": field(data, "runId", str),
        "session_id": field(data, "sessionId", str),
        "summary": field(data, "summary", str),
        "dedupe_key": field(data, "dedupeKey", str),
        "payload": data.get("payload"),
        "occurred_at": field(data, "occurredAt", int),
    }
    try:
        result = await request.app[KERNEL].record(**fields)
    except StoreError as exc:
        log.warning("event not recorded: %s", exc)  # best-effort: the gateway's turn goes on
        failed = {"recorded": False, "error": {"code": "store_unavailable", "message": str(exc)}}
        return unavailable(json_response(failed, 503))
    return json_response({"recorded": True, **result.event.record_json(duplicate=result.duplicate)})


@routes.post("/v1/spawns")
async def post_spawn(request: web.Request) -> web.Response:
    data = await body(request, {"parent", "child", "runId"})
    result = await request.app[KERNEL].spawn(
        parent=field(data, "parent", str, required=True),
        child=field(data, "child", str, required=True),
        run_id=field(data, "runId", str, required=True),
    )
    return json_response(result.event.record_json(duplicate=result.duplicate))


@routes.post("/v1/watches")
async def post_watch(request: web.Request) -> web.Response:
    data = await body(request, {"watcher", "target", "storePath"})
    watched = await request.app[KERNEL].watch(
        watcher=field(data, "watcher", str, required=True),
        target=field(data, "target", str, required=True),
        store_path=field(data, "storePath", str),
    )
    request.app[MONITOR].links_changed()  # a newly watched link gets its file watched
    return json_response({"watched": watched})


@routes.get("/v1/sessions/{key}/status")
async def status(request: web.Request) -> web.Response:
    return json_response(
        await request.app[KERNEL].status(
            request.match_info["key"],
            agent_id=request.query.get("agentId"),
            changes_since=query_int(request, "changesSince"),
        )
    )


@routes.get("/v1/sessions")
async def sessions(request: web.Request) -> web.Response:
    keys = [k for k in request.query.get("keys", "").split(",") if k.strip()]
    return json_response({"sessions": await request.app[KERNEL].state_versions(keys)})


async def _notices(request: web.Request, drain: bool) -> web.Response:
    kernel = request.app[KERNEL]
    watcher = request.match_info["key"]
    found: list[Notice] = await kernel.notices(
        watcher=watcher, store_path=request.query.get("storePath"), drain=drain
    )
    out: list[dict[str, Any]] = [n.as_json() for n in found]
    created = kernel.created_notices
    text = created.drain(watcher.lower()) if drain else created.peek(watcher.lower())
    if text:
        out.append({"target": None, "text": text})
    return json_response({"notices": out})


@routes.get("/v1/watchers/{key}/notices")
async def peek_notices(request: web.Request) -> web.Response:
    return await _notices(request, drain=False)


@routes.post("/v1/watchers/{key}/notices/drain")
async def drain_notices(request: web.Request) -> web.Response:
    return await _notices(request, drain=True)


@routes.get("/v1/catalog")
async def catalog(request: web.Request) -> web.Response:
    kind = request.query.get("kind")
    return json_response(await request.app[MONITOR].catalog(kind))


@routes.post("/v1/links")
async def post_link(request: web.Request) -> web.Response:
    data = await body(request, {"kind", "path", "catalogId", "sessionKey", "agentId", "sessionId"})
    monitor = request.app[MONITOR]
    common = {
        "session_key": field(data, "sessionKey", str, required=True),
        "agent_id": field(data, "agentId", str),
        "session_id": field(data, "sessionId", str),
    }
    catalog_id = field(data, "catalogId", str)
    if catalog_id is not None:
        if "kind" in data or "path" in data:
            raise BadInput("give either catalogId or kind and path, not both")
        return json_response(await monitor.adopt_catalog(catalog_id, **common))
    kind = check_kind(field(data, "kind", str, required=True))
    path = field(data, "path", str, required=True)
    return json_response(await monitor.adopt(kind=kind, path=path, **common))


@routes.get("/v1/links")
async def get_links(request: web.Request) -> web.Response:
    return json_response({"links": await request.app[MONITOR].links()})


@routes.delete("/v1/links/{key}")
async def delete_link(request: web.Request) -> web.Response:
    removed = await request.app[MONITOR].unlink(
        request.match_info["key"], agent_id=request.query.get("agentId")
    )
    if not removed:
        raise NotFound(f"no link for session {request.match_info['key']!r}")
    return json_response({"ok": True})


def build_app(
    kernel: Kernel, monitor: UpstreamMonitor, metrics: Metrics, token: str
) -> web.Application:
    app = web.Application(
        middlewares=[errors_middleware, auth_middleware], client_max_size=MAX_BODY
    )
    app[KERNEL] = kernel
    app[MONITOR] = monitor
    app[METRICS] = metrics
    app[TOKEN] = token
    app.add_routes(routes)
    return app


class _JsonErrorHandler(web_protocol.RequestHandler):
    """Protocol-level errors (a bad request line, an over-long URL or header, a bad
    Content-Length) answered in the API's ``{"error": {...}}`` shape instead of plain text."""

    __slots__ = ()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            log.error("error handling a request from %s", request.remote, exc_info=exc)
        if request.writer.output_size > 0:
            raise ConnectionError("the response was already started; cannot answer the error")
        detail = getattr(exc, "message", None) or message or HTTPStatus(status).phrase
        code = _HTTP_CODES.get(status, "http_error" if status < 500 else "internal_error")
        response = error(status, code, " ".join(str(detail).split())[:500])
        response.force_close()
        return response


class _JsonErrorServer(web.Server):
    # aiohttp makes one RequestHandler per connection here; ours shapes protocol errors.
    def __call__(self) -> web_protocol.RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, **self._kwargs)


def use_json_errors(runner: web.AppRunner) -> None:
    """Make a set-up runner answer protocol-level errors as JSON (see ``_JsonErrorHandler``)."""
    server = runner.server
    if server is not None:
        server.__class__ = _JsonErrorServer
