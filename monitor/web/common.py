"""What every HTTP face of the sidecar shares: JSON answers and errors, the one bearer-token
guard, protocol errors in the same JSON shape, and starting a listener (``HOST:PORT`` or
``unix:PATH``)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import socket
import ssl
import stat
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import StreamReader, web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web import BaseRequest

from monitor.config import LISTEN_SHAPE, listen_is_valid
from monitor.errors import (
    ConfigError,
    NotFound,
    OutsideRoots,
    SessionwatchError,
    StoreError,
    Unreachable,
)
from monitor.kernel.keys import MAX_KEY_LENGTH

log = logging.getLogger(__name__)

MAX_BODY = 1024 * 1024
BODY_CUT_SHORT = "the request body was cut short: the client closed its side before sending it all"
RETRY_AFTER_S = "1"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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


def _refusal(request: web.Request, exc: BaseException) -> web.Response | None:
    """A client's mistake or an unavailable store as the API's error answer."""
    if isinstance(exc, NotFound):
        return error(404, "not_found", str(exc))
    if isinstance(exc, OutsideRoots):
        return error(403, "outside_roots", str(exc))
    if isinstance(exc, StoreError):
        store_refused(request, exc)
        return unavailable(error(503, "store_unavailable", str(exc)))
    if isinstance(exc, Unreachable):
        return unavailable(error(503, "upstream_unreachable", str(exc)))
    if isinstance(exc, SessionwatchError):  # BadInput and every other refusal
        return error(400, "bad_request", str(exc))
    if isinstance(exc, web.HTTPException) and exc.status >= 400:
        code = _HTTP_CODES.get(exc.status, "http_error")
        message = exc.text if exc.status == 400 and exc.text else exc.reason
        if exc.status == 413:
            message = f"request body is larger than {MAX_BODY} bytes"
        answer = error(exc.status, code, message or code)
        if "Allow" in exc.headers:  # a 405 names the methods the route takes (RFC 9110)
            answer.headers["Allow"] = exc.headers["Allow"]
        return answer
    return None


ALLOWED_HOSTS = web.AppKey("allowed_hosts", frozenset)
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def host_name(raw: str) -> str:
    """The name of a ``Host`` header, without its port or IPv6 brackets, lower-cased."""
    raw = raw.strip().lower()
    if raw.startswith("["):
        return raw[1 : raw.find("]")] if "]" in raw else raw
    return raw.split(":", 1)[0] if raw.count(":") == 1 else raw


def implied_hosts(host: str, extra: tuple[str, ...] = ()) -> frozenset[str]:
    """The ``Host`` names a listener on ``host`` answers to: the loopback names, the address
    itself, this machine's names when it listens on every address, and ``extra``."""
    names = set(LOOPBACK_NAMES) | {host_name(h) for h in extra if h.strip()}
    if host in ("0.0.0.0", "::", ""):
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    if host:
        names.add(host.lower())
    return frozenset(names)


# (method, route) -> the query parameters its document declares: a parameter it does not
# declare is refused, as an unknown body field is (set by the app that has a document)
QUERY_PARAMS: web.AppKey[dict[tuple[str, str], frozenset[str]]] = web.AppKey("query_params")


def _unknown_query(request: web.Request) -> str | None:
    declared = request.app.get(QUERY_PARAMS)
    if declared is None or not request.query:
        return None
    route = request.match_info.route.resource
    known = declared.get((request.method, route.canonical)) if route is not None else None
    if known is None:  # not a route of the document (the status page's own)
        return None
    unknown = sorted(set(request.query) - known)
    if not unknown:
        return None
    takes = ", ".join(sorted(known)) or "none"
    return f"unknown query parameter {unknown[0]!r} (this route takes: {takes})"


def make_guard(
    token: web.AppKey[str],
    open_paths: frozenset[str] = frozenset(),
    open_prefixes: tuple[str, ...] = (),
) -> Any:
    """The one check of every request: its ``Host`` is one this listener answers to (else
    421, so a page of another site that a DNS name rebound to loopback never reaches us,
    health check included), and its bearer token (every path but ``open_paths`` and those
    under ``open_prefixes``, which check their own admission), with errors answered as
    JSON. One middleware, not two: each layer costs every request another
    coroutine."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        protocol = request.protocol
        if isinstance(protocol, JsonErrorHandler):
            protocol.track(request.content)
        allowed = request.app.get(ALLOWED_HOSTS)
        if allowed is not None and host_name(request.host) not in allowed:
            return error(
                421,
                "misdirected_request",
                f"this sidecar does not answer to the host {host_name(request.host)!r};"
                " add it to [api] allowed_hosts to allow it",
            )
        unknown = _unknown_query(request)
        if unknown:
            return error(400, "bad_request", unknown)
        opened = request.path in open_paths or request.path.startswith(open_prefixes)
        if not opened and not token_matches(
            request.headers.get("Authorization", ""), request.app[token]
        ):
            return error(401, "unauthorized", "a valid Authorization: Bearer <token> is required")
        try:
            answer = await handler(request)
        except (SessionwatchError, web.HTTPException) as exc:
            refused = _refusal(request, exc)
            if refused is None:
                raise
            return refused
        trouble = request.app.get(STORE_TROUBLE)
        if trouble is not None and request.method != "GET" and answer.status < 500:
            trouble.over()  # a write went through
        return answer

    return guard


class StoreTrouble:
    """The store refusing the API's requests (full, locked, away): said once, with the
    first refusal, and its end once, at the next write that goes through; never one line
    per request (a full disk refused 1,497 requests in a row)."""

    __slots__ = ("reason",)

    def __init__(self) -> None:
        self.reason = ""

    def refused(self, exc: BaseException) -> None:
        if not self.reason:
            log.warning(
                "the state database refuses requests (%s): each is answered 503 until it"
                " takes them again",
                exc,
            )
        self.reason = str(exc)

    def over(self) -> None:
        if self.reason:
            log.info("the state database takes requests again")
            self.reason = ""


STORE_TROUBLE = web.AppKey("store_trouble", StoreTrouble)


def store_refused(request: web.Request, exc: BaseException) -> None:
    """Say that the store refused ``request`` (once, until it takes one again)."""
    trouble = request.app.get(STORE_TROUBLE)
    if trouble is None:
        log.warning("%s %s: %s", request.method, request.path, exc)
    else:
        trouble.refused(exc)


class JsonErrorHandler(web.RequestHandler):
    """One connection's HTTP protocol, on aiohttp's public API (``web.RequestHandler``,
    made by our own protocol factory in :func:`start_site`):

    - protocol-level errors (a bad request line, an over-long URL or header, a bad
      Content-Length) are answered in the API's ``{"error": {...}}`` shape, not as text;
    - a client that shuts its sending side after its request (a TCP half-close, as
      ``nc -N`` does) still gets the answer. aiohttp lets the transport close at once, so
      the request was carried out and its answer lost. A body cut short by the close is
      refused (400), never taken as whole. The guard middleware hands each request's body
      to :meth:`track`, so no private state of aiohttp is read."""

    __slots__ = ("body", "half_closed")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.body: StreamReader | None = None  # the body of the request being handled
        self.half_closed = False

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """A request that failed because its client hung up (its body cut short, the
        connection lost) is the client's doing: one debug line, never a traceback. 300
        clients that hang up must not write 7,000 lines."""
        exc = kw.get("exc_info")
        if isinstance(exc, BaseException) and self._hung_up(exc):
            log.debug("a client hung up during its request (%s: %s)", type(exc).__name__, exc)
            return
        super().log_exception(*args, **kw)

    def _hung_up(self, exc: BaseException) -> bool:
        """The connection is gone, or the client closed its side with its body unsent."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return True
        cut = isinstance(exc, web.HTTPBadRequest) and exc.text == BODY_CUT_SHORT
        return self.half_closed and (cut or isinstance(exc, ConnectionError))

    def track(self, body: StreamReader) -> None:
        self.body = body
        self._cut_short()

    def _cut_short(self) -> None:
        body = self.body
        if self.half_closed and body is not None and not body.is_eof():
            body.set_exception(web.HTTPBadRequest(text=BODY_CUT_SHORT))

    def eof_received(self) -> bool:  # type: ignore[override]  # aiohttp's says None
        self.half_closed = True
        self._cut_short()
        self.close()  # answer what was asked, then close (an idle wait ends: see start)
        # keep the transport open for the answer; TLS cannot half-close (asyncio closes it
        # and says so for each connection when told otherwise)
        transport = self.transport
        return transport is None or transport.get_extra_info("sslcontext") is None

    async def start(self) -> None:
        try:
            await super().start()
        except asyncio.CancelledError:
            # close() ends an idle wait for the next request by cancelling it, and aiohttp
            # then leaves the transport open: with nothing left to answer, close it.
            if self.half_closed and self.transport is not None:
                self.transport.close()
            raise

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if isinstance(exc, ConnectionError):  # the client went away: no one to answer
            log.debug("client %s went away: %s", request.remote, exc)
        elif status >= 500:
            log.error("error handling a request from %s", request.remote, exc_info=exc)
        if request.writer.output_size > 0:
            raise ConnectionError("the response was already started; cannot answer the error")
        detail = getattr(exc, "message", None) or message or HTTPStatus(status).phrase
        if isinstance(exc, LineTooLong):  # aiohttp's words quote the line itself: ours do not
            detail = (
                "the request line or a header is longer than the server reads (8190 bytes);"
                f" a session key is at most {MAX_KEY_LENGTH} characters"
            )
        code = _HTTP_CODES.get(status, "http_error" if status < 500 else "internal_error")
        response = error(status, code, " ".join(str(detail).split())[:500])
        response.force_close()
        return response


def _remove_socket(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


async def start_site(
    stack: AsyncExitStack,
    app: web.Application,
    listen: str,
    option: str,
    allowed_hosts: tuple[str, ...] = (),
    tls: ssl.SSLContext | None = None,
) -> list[str]:
    """Serve ``app`` on ``listen`` (``HOST:PORT``, or ``unix:PATH`` made 0600), answering
    protocol errors as JSON; the runner is cleaned up first when ``stack`` unwinds (no new
    requests). The addresses it listens on; a bad ``listen`` is a ConfigError naming
    ``option``. Over TCP it answers only to the ``Host`` names its address implies, and to
    ``allowed_hosts`` (see :func:`implied_hosts`)."""
    if not listen.startswith("unix:"):
        bound = listen.rpartition(":")[0]
        bound = bound[1:-1] if bound.startswith("[") and bound.endswith("]") else bound
        app[ALLOWED_HOSTS] = implied_hosts(bound or "127.0.0.1", allowed_hosts)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)  # runs after the listener closes
    shape = f"{option} {LISTEN_SHAPE}"
    if not listen_is_valid(listen):
        raise ConfigError(f"{shape}, got {listen!r}")
    manager = runner.server
    assert manager is not None  # set up above
    loop = asyncio.get_running_loop()

    def connection() -> JsonErrorHandler:
        return JsonErrorHandler(manager, loop=loop, access_log=None)

    path = listen.removeprefix("unix:") if listen.startswith("unix:") else None
    try:
        if path is not None:
            clear_stale_socket(path)
            server = await loop.create_unix_server(connection, path)
            stack.callback(_remove_socket, path)  # after the listener closed: a clean stop
        else:
            host, _, port = listen.rpartition(":")
            if host.startswith("[") and host.endswith("]"):  # [::1]:8080
                host = host[1:-1]
            server = await loop.create_server(connection, host or "127.0.0.1", int(port), ssl=tls)
        stack.callback(server.close)  # runs first on exit: stop accepting connections
        if path is not None:
            os.chmod(path, 0o600)
            return [listen]
    except OSError as exc:
        raise ConfigError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    addresses = [s.getsockname() for s in server.sockets]
    scheme = "https" if tls is not None else "http"
    return [
        f"{scheme}://[{a[0]}]:{a[1]}" if ":" in a[0] else f"{scheme}://{a[0]}:{a[1]}"
        for a in addresses
    ]


def clear_stale_socket(path: str) -> None:
    """Remove a socket nobody listens on; anything else at ``path`` is refused, never deleted."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:  # a parent that is a file, a directory we may not read
        raise ConfigError(f"cannot listen on unix:{path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"refusing to listen on {path}: it exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # stale: whoever made it is gone
        return
    finally:
        probe.close()
    raise ConfigError(f"refusing to listen on {path}: another process is listening there")
