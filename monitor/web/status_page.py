"""The status page: what the sidecar is doing, read-only, at ``/`` on the API's listener.

Who may read it: a browser cannot send a bearer token to an EventSource, so the page uses a
session cookie. ``sessionwatch open`` asks ``POST /v1/ui/tickets`` (bearer) for a one-time
ticket good for a minute, and opens ``/ui/login?ticket=...``; that spends the ticket, sets
an HttpOnly, SameSite=Strict cookie and redirects to ``/``. The token never appears in a URL,
and a ticket left in the history is spent. Every page route is a GET that changes nothing, so
there is nothing to forge (CSRF); the API's ``Host`` check applies (DNS rebinding); the
Content-Security-Policy allows only the page's own script and stylesheet.

What it shows is :class:`monitor.web.page_state.PageState`'s; this module is the routes,
admission and rendering.

Live: ``/ui/stream`` (Server-Sent Events) says ``changed`` (``doing`` when among the changes
is what a session is doing: the "needs you" panel) when what the page shows may have
changed, as the change bus tells it: each kind says what the page does with it, beside the
kind (its ``page``: :func:`monitor.kernel.bus.page_kinds`); the script then fetches
``/ui/live``, the same template's fragment, and swaps it in. The browser runs no timer. With
no page open, nothing here runs at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import orjson
from aiohttp import web
from jinja2 import Environment, PackageLoader, select_autoescape

from monitor.clock import ago
from monitor.errors import SessionwatchError
from monitor.kernel.bus import (
    SHOWN_AT_ONCE,
    SHOWN_IF_MOVED,
    SHOWN_LATER,
    doing_may_differ,
    page_kinds,
)
from monitor.kernel.changes import KEEPALIVE_S
from monitor.kernel.keys import shown_key
from monitor.web.common import token_matches
from monitor.web.page_state import PageState
from monitor.web.turn_chart import turn_chart

COOKIE = "sessionwatch_ui"  # and the instance's own suffix: see StatusPage.cookie
TICKET_TTL_S = 60.0
SESSION_TTL_S = 12 * 3600.0
TICK_REFRESH_S = 10.0  # a tick that changed nothing else is shown at most this often
MIN_GAP_S = 0.25  # under a stream of changes, the page is told at most this often
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
        " connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}
STATIC = {"app.js": "text/javascript", "app.css": "text/css"}


# -- who may read it ---------------------------------------------------------------------


@dataclass
class Admissions:
    """One-time tickets and the cookie sessions they open, in memory (a restart logs out)."""

    tickets: dict[str, float] = field(default_factory=dict)  # ticket -> expiry (monotonic)
    sessions: dict[str, float] = field(default_factory=dict)  # cookie -> expiry
    clock: Callable[[], float] = time.monotonic  # seconds; a test's own clock

    def issue(self) -> str:
        self._expire()
        ticket = secrets.token_urlsafe(32)
        self.tickets[ticket] = self.clock() + TICKET_TTL_S
        return ticket

    def admit(self, ticket: str) -> str | None:
        """A fresh cookie for a live ticket, which is spent; None for any other."""
        self._expire()
        if self.tickets.pop(ticket, None) is None:
            return None
        cookie = secrets.token_urlsafe(32)
        self.sessions[cookie] = self.clock() + SESSION_TTL_S
        return cookie

    def admitted(self, cookie: str | None) -> bool:
        expiry = self.sessions.get(cookie or "")
        return expiry is not None and expiry > self.clock()

    def _expire(self) -> None:
        now = self.clock()
        for table in (self.tickets, self.sessions):
            for key in [k for k, expiry in table.items() if expiry <= now]:
                del table[key]


class StatusPage:
    """The page's routes, over :class:`PageState`; ``stopping``: the API's shutdown, which
    ends the open streams."""

    def __init__(self, state: PageState, token: str, stopping: asyncio.Event) -> None:
        self.state = state
        self.token = token
        self.stopping = stopping
        self.admissions = Admissions()
        self.env = Environment(
            loader=PackageLoader("monitor.web", "templates"),
            autoescape=select_autoescape(["html"]),
            enable_async=False,
        )
        self.env.filters["ago"] = ago
        self.env.filters["lasting"] = lambda then, now: ago(then, now).removesuffix(" ago")
        self.env.filters["clock"] = _clock
        self.env.filters["turn_chart"] = turn_chart
        self.env.filters["short_key"] = shown_key
        # cookies ignore ports: two sidecars on one host would log each other out
        instance = f"{state.db}\n{state.config.api.listen}".encode()
        self.cookie = f"{COOKIE}_{hashlib.sha256(instance).hexdigest()[:12]}"
        self._static = {
            name: resources.files("monitor.web").joinpath("static", name).read_bytes()
            for name in STATIC
        }

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/", self.page),
            web.get("/ui/live", self.live),
            web.get("/ui/sessions/{key}", self.timeline),
            web.get("/ui/stream", self.stream),
            web.get("/ui/login", self.login),
            web.get("/static/{name}", self.static),
            web.get("/favicon.ico", self.favicon),
            web.post("/v1/ui/tickets", self.ticket),
        ]

    # -- admission -------------------------------------------------------------------------

    def _admitted(self, request: web.Request) -> bool:
        return self.admissions.admitted(request.cookies.get(self.cookie)) or token_matches(
            request.headers.get("Authorization", ""), self.token
        )

    async def ticket(self, request: web.Request) -> web.Response:
        """A one-time login link (the API's bearer token is checked by its guard)."""
        ticket = self.admissions.issue()
        body = {"path": f"/ui/login?ticket={ticket}", "expiresInS": int(TICKET_TTL_S)}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def login(self, request: web.Request) -> web.Response:
        cookie = self.admissions.admit(request.query.get("ticket", ""))
        if cookie is None:
            return self._html("login.html", status=403, reason="that link is spent or expired; run")
        answer = web.HTTPSeeOther("/", headers=SECURITY_HEADERS)
        answer.set_cookie(
            self.cookie,
            cookie,
            max_age=int(SESSION_TTL_S),
            httponly=True,
            samesite="Strict",
            path="/",
        )
        raise answer

    def _refuse(self) -> web.Response:
        return self._html("login.html", status=401, reason="to read this page, run")

    # -- pages -----------------------------------------------------------------------------

    async def page(self, request: web.Request) -> web.Response:
        if not self._admitted(request):
            return self._refuse()
        return self._html("page.html", view=await self.state.view(_page_of(request)))

    async def live(self, request: web.Request) -> web.Response:
        if not self._admitted(request):
            return self._refuse()
        return self._html("live.html", view=await self.state.view(_page_of(request)))

    async def timeline(self, request: web.Request) -> web.Response:
        if not self._admitted(request):
            return self._refuse()
        key = request.match_info["key"]
        try:
            events = await self.state.kernel.recent_events(key)
        except SessionwatchError as exc:
            return self._html("timeline.html", key=key, events=[], error=str(exc))
        return self._html("timeline.html", key=key, events=events, error=None)

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC:
            raise web.HTTPNotFound()
        return web.Response(
            body=self._static[name], content_type=STATIC[name], headers=SECURITY_HEADERS
        )

    async def favicon(self, request: web.Request) -> web.Response:
        """None: said at once, so a browser's automatic request is no error."""
        return web.Response(status=204, headers=SECURITY_HEADERS)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """``event: changed`` when what the page shows may have changed, as each change's
        kind says (:func:`monitor.kernel.bus.page_kinds`): a write, only when the page's
        fingerprint moved (a quiet scan does not move it); at once, within a quarter second
        under a stream of changes; later, at most every 10 s (a tick's time and duration).
        A keep-alive comment every 15 s otherwise."""
        if not self._admitted(request):
            return self._refuse()
        response = web.StreamResponse(
            headers={**SECURITY_HEADERS, "Content-Type": "text/event-stream"}
        )
        await response.prepare(request)
        try:
            async with self.state.bus.listen(page_kinds()) as heard:
                told = Told(await self.state.fingerprint(), asyncio.get_running_loop().time)
                await response.write(b"retry: 2000\n\n")
                while not self.stopping.is_set():
                    # told, never polled: the wait lasts until a change, or the moment
                    # something held back is due
                    first = await heard.next(told.wait_s(), unless=self.stopping)
                    changes = [c for c in (first, *heard.pending()) if c is not None]
                    shown = {c.shown() for c in changes}
                    if SHOWN_IF_MOVED in shown:
                        told.moved(await self.state.fingerprint())
                    told.heard(at_once=SHOWN_AT_ONCE in shown, later=SHOWN_LATER in shown)
                    told.doing = told.doing or any(map(doing_may_differ, changes))
                    said = told.due()
                    if said is not None:
                        await response.write(said)
        except (ConnectionResetError, SessionwatchError):
            pass  # the page was closed, or the database went away: the stream ends
        return response

    def _html(self, template: str, status: int = 200, **context: Any) -> web.Response:
        body = self.env.get_template(template).render(**context)
        return web.Response(
            text=body, status=status, content_type="text/html", headers=SECURITY_HEADERS
        )


def _page_of(request: web.Request) -> int:
    """``?page=N`` (1 when absent or not a number; past the last: the last)."""
    raw = request.query.get("page", "1")
    return int(raw) if raw.isdigit() and len(raw) < 7 else 1


def _clock(ms: int | None) -> str:
    if not ms:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


@dataclass
class Told:
    """When a stream tells its page, and what it holds back: a change at most every
    :data:`MIN_GAP_S`, a later one at most every :data:`TICK_REFRESH_S`, a keep-alive after
    :data:`KEEPALIVE_S` of quiet. ``now``: the loop's monotonic clock."""

    shown: tuple[object, ...]  # the fingerprint last seen
    now: Callable[[], float]
    changed: bool = False
    later: bool = False
    doing: bool = False  # among the changes: what a session is doing (said as ``doing``)
    sent: float = field(init=False)
    quiet_since: float = field(init=False)

    def __post_init__(self) -> None:
        self.sent = self.quiet_since = self.now()

    def wait_s(self) -> float:
        """How long to wait for a change before something held back is due."""
        if self.changed:
            due = self.sent + MIN_GAP_S
        elif self.later:
            due = self.sent + TICK_REFRESH_S
        else:
            due = self.quiet_since + KEEPALIVE_S
        return max(due - self.now(), 0.0)

    def moved(self, fingerprint: tuple[object, ...]) -> None:
        self.changed = self.changed or fingerprint != self.shown
        self.shown = fingerprint

    def heard(self, *, at_once: bool, later: bool) -> None:
        self.changed = self.changed or at_once
        self.later = self.later or later

    def due(self) -> bytes | None:
        """What to write now, if anything."""
        since = self.now() - self.sent
        if (self.changed and since >= MIN_GAP_S) or (self.later and since >= TICK_REFRESH_S):
            self.sent = self.quiet_since = self.now()
            kind = b"doing" if self.doing else b"changed"
            self.changed = self.later = self.doing = False
            return b"event: " + kind + b"\ndata: {}\n\n"
        if self.now() - self.quiet_since >= KEEPALIVE_S:
            self.quiet_since = self.now()
            return b": keep-alive\n\n"
        return None
