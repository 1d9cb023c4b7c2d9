"""The status page: what the sidecar is doing, read-only, at ``/`` on the API's listener.

Who may read it: a browser cannot send a bearer token to an EventSource, so the page uses a
session cookie. ``sessionwatch open`` asks ``POST /v1/ui/tickets`` (bearer) for a one-time
ticket good for a minute, and opens ``/ui/login?ticket=...``; that spends the ticket, sets
an HttpOnly, SameSite=Strict cookie and redirects to ``/``. The token never appears in a URL,
and a ticket left in the history is spent. Every page route is a GET that changes nothing, so
there is nothing to forge (CSRF); the API's ``Host`` check applies (DNS rebinding); the
Content-Security-Policy allows only the page's own script and stylesheet.

Live: ``/ui/stream`` (Server-Sent Events) says ``changed`` when what the page shows may have
changed, as the change bus tells it (a commit of this process or another, a finished tick, a
wake's outcome, the titles read, a reload: ``PAGE_CHANGES``); the script then fetches
``/ui/live``, the same template's fragment, and swaps it in. The browser runs no timer. With
no page open, nothing here runs at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import orjson
from aiohttp import web
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from monitor.clock import ago
from monitor.config import Config, NodeConfig, is_pg_url, without_password
from monitor.delivery.hooks import HooksClient, LastWake
from monitor.errors import SessionwatchError
from monitor.kernel import Kernel
from monitor.kernel.bus import (
    PAGE_CHANGES,
    WRITES,
    ConfigReloaded,
    TickRan,
    TitlesRead,
    WakeOutcome,
)
from monitor.kernel.changes import KEEPALIVE_S
from monitor.kernel.keys import shown_key
from monitor.kernel.signal_log import Activity
from monitor.upstream import UpstreamMonitor
from monitor.upstream.links import LinkView
from monitor.upstream.monitor import root_paths
from monitor.upstream.tick_health import TickHealth
from monitor.web.common import token_matches

COOKIE = "sessionwatch_ui"  # and the instance's own suffix: see StatusPage.cookie
TICKET_TTL_S = 60.0
SESSION_TTL_S = 12 * 3600.0
TITLES_TTL_S = 300.0
NODES_TTL_S = 30.0
TICK_REFRESH_S = 10.0  # a tick that changed nothing else is shown at most this often
MIN_GAP_S = 0.25  # under a stream of changes, the page is told at most this often
PAGE_ROWS = 100  # adopted sessions a page shows: the first paint stays small at 10,000
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


@dataclass
class PageSources:
    """What the page reads, as the service wires it; ``in_force`` gives the configuration
    in force (a reload replaces it)."""

    kernel: Kernel
    monitor: UpstreamMonitor
    tick: TickHealth
    in_force: Callable[[], Config]
    waker: HooksClient | None
    db: str
    version: str
    node_check: Callable[[str, NodeConfig], Awaitable[str | None]] | None = None

    @property
    def config(self) -> Config:
        return self.in_force()


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


# -- what it shows -----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkRow:
    session_key: str
    kind: str
    host: str
    title: str
    state: str  # healthy | blocked | drifting | missing | inconclusive | foreign
    reason: str
    activity: Activity | None
    watched: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class WatcherRow:
    watcher: str
    targets: tuple[str, ...]
    last_wake: LastWake | None


@dataclass(frozen=True, kw_only=True, slots=True)
class PageView:
    version: str
    store: str
    roots: tuple[tuple[str, str, bool], ...]
    nodes: tuple[tuple[str, str, str | None], ...]  # name, url, why unreachable (None: ok)
    links: tuple[LinkRow, ...]
    watchers: tuple[WatcherRow, ...]
    tick: TickHealth
    wakes: str  # how notices reach the gateway
    now_ms: int
    error: str | None = None
    total: int = 0  # the adopted sessions, of which ``links`` is one page
    page: int = 1
    pages: int = 1

    @property
    def first(self) -> int:
        """The number of the page's first row (1-based)."""
        return (self.page - 1) * PAGE_ROWS + 1


def shown_state(view: LinkView, missing_after: int) -> tuple[str, str]:
    """The one state a person reads first, and its reason; ``missing_after``: the misses
    the monitor counts before it says ``upstream_missing`` (``[monitor] missing_threshold``)."""
    if view.link.foreign:
        return "foreign", "a kind this sidecar does not read"
    if view.blocked:
        return "blocked", view.blocked.reason or f"at byte {view.blocked.offset}"
    if view.missing_streak:
        return "missing", f"not found at {view.missing_streak} of {missing_after} checks"
    if view.status and view.status.outcome == "inconclusive":
        return "inconclusive", view.status.reason or "the last check could not decide"
    if view.status and view.status.outcome == "quiet" and view.status.reason:
        return "idle", view.status.reason  # compressed or archived by its harness
    drift = view.drift
    found = []
    if drift.unknown_types:
        found.append("unknown types " + ", ".join(sorted(drift.unknown_types)))
    if drift.unclassified:
        found.append(f"{drift.unclassified} unclassified user records")
    if drift.invalid:
        found.append(f"{drift.invalid} invalid lines")
    if drift.newer:
        found.append(f"version {drift.version} is newer than tested")
    if found:
        return "drifting", "; ".join(found)
    return "healthy", ""


class StatusPage:
    """The page's routes, over :class:`PageSources`."""

    def __init__(self, sources: PageSources, token: str, stopping: asyncio.Event) -> None:
        self.sources = sources
        self.token = token
        self.stopping = stopping
        self.admissions = Admissions()
        self.env = Environment(
            loader=PackageLoader("monitor.web", "templates"),
            autoescape=select_autoescape(["html"]),
            enable_async=False,
        )
        self.env.filters["ago"] = ago
        self.env.filters["clock"] = _clock
        self.env.filters["turn_chart"] = turn_chart
        self.env.filters["short_key"] = shown_key
        # cookies ignore ports: two sidecars on one host would log each other out
        instance = f"{sources.db}\n{sources.config.api.listen}".encode()
        self.cookie = f"{COOKIE}_{hashlib.sha256(instance).hexdigest()[:12]}"
        self._titles: dict[str, str] = {}
        self._titled: set[str] = set()  # the threads the last catalog read was asked for
        self._titles_at = -TITLES_TTL_S
        self._titles_task: asyncio.Task[None] | None = None
        self._nodes: tuple[tuple[str, str, str | None], ...] = ()
        self._nodes_at = -NODES_TTL_S
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
        return self._html("page.html", view=await self.view(_page_of(request)))

    async def live(self, request: web.Request) -> web.Response:
        if not self._admitted(request):
            return self._refuse()
        return self._html("live.html", view=await self.view(_page_of(request)))

    async def timeline(self, request: web.Request) -> web.Response:
        if not self._admitted(request):
            return self._refuse()
        key = request.match_info["key"]
        try:
            events = await self.sources.kernel.recent_events(key)
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
        """``event: changed`` when what the page shows may have changed: at once for the
        log, the notices and the links (their fingerprints moved, which a quiet scan does
        not do), and at most every quarter second under a stream of changes; at most every
        10 s for a tick that changed nothing else (its time and duration); a keep-alive
        comment every 15 s otherwise."""
        if not self._admitted(request):
            return self._refuse()
        response = web.StreamResponse(
            headers={**SECURITY_HEADERS, "Content-Type": "text/event-stream"}
        )
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        try:
            async with self.sources.kernel.bus.listen(PAGE_CHANGES) as heard:
                shown = await self._fingerprint()
                sent = quiet_since = loop.time()
                changed = tick_due = False
                await response.write(b"retry: 2000\n\n")
                while not self.stopping.is_set():
                    # told, never polled: the wait lasts until a change, or the moment
                    # something held back is due (a change within MIN_GAP_S, a tick's
                    # refresh, the keep-alive)
                    if changed:
                        due = sent + MIN_GAP_S
                    elif tick_due:
                        due = sent + TICK_REFRESH_S
                    else:
                        due = quiet_since + KEEPALIVE_S
                    first = await heard.next(max(due - loop.time(), 0.0), unless=self.stopping)
                    kinds = {type(c) for c in (first, *heard.pending()) if c is not None}
                    if kinds & set(WRITES):  # shown only if what it shows moved
                        now = await self._fingerprint()
                        changed, shown = changed or now != shown, now
                    if kinds & {WakeOutcome, TitlesRead, ConfigReloaded}:  # at once
                        changed = True
                    if TickRan in kinds:  # its time and duration, or why it failed
                        tick_due = True
                        changed = changed or self.sources.tick.failed is not None
                    since = loop.time() - sent
                    if (changed and since >= MIN_GAP_S) or (tick_due and since >= TICK_REFRESH_S):
                        await response.write(b"event: changed\ndata: {}\n\n")
                        sent = quiet_since = loop.time()
                        changed = tick_due = False
                    elif loop.time() - quiet_since >= KEEPALIVE_S:
                        await response.write(b": keep-alive\n\n")
                        quiet_since = loop.time()
        except (ConnectionResetError, SessionwatchError):
            pass  # the page was closed, or the database went away: the stream ends
        return response

    async def _fingerprint(self) -> tuple[object, ...]:
        return (await self.sources.kernel.fingerprint(), await self.sources.monitor.fingerprint())

    def _html(self, template: str, status: int = 200, **context: Any) -> web.Response:
        body = self.env.get_template(template).render(**context)
        return web.Response(
            text=body, status=status, content_type="text/html", headers=SECURITY_HEADERS
        )

    # -- the view --------------------------------------------------------------------------

    async def view(self, page: int = 1) -> PageView:
        """What the page shows; of the adopted sessions, page ``page`` (the ones typed
        into most recently first)."""
        s = self.sources
        config, waker = s.config, s.waker
        roots = tuple(
            (kind, str(path), path.exists()) for kind, path in root_paths(config.roots).items()
        )
        store = without_password(s.db) if is_pg_url(s.db) else s.db
        wakes = (
            f"woken through {waker.url}"
            if waker is not None
            else "no [gateway] hooks_url: the gateway drains notices itself"
        )
        if s.kernel.undecided_notices:
            wakes += (
                f"; {s.kernel.undecided_notices} notices an earlier sessionwatch left on this"
                " shared database are left to the gateway until their pair changes"
            )
        base = PageView(
            version=s.version,
            store=store,
            roots=roots,
            nodes=await self._node_states(config),
            links=(),
            watchers=(),
            tick=s.tick,
            wakes=wakes,
            now_ms=int(time.time() * 1000),
        )
        try:
            links = await s.monitor.links()
            activity = await s.kernel.activity()
            pending = await s.kernel.all_pending()
        except SessionwatchError as exc:
            return dataclasses.replace(base, error=str(exc))

        def recent(v: LinkView) -> tuple[int, str]:
            typed = activity.get(v.link.session_key)
            return (-(typed.last_at if typed else 0), v.link.session_key)

        pages = max((len(links) + PAGE_ROWS - 1) // PAGE_ROWS, 1)
        page = min(max(page, 1), pages)
        shown = sorted(links, key=recent)[(page - 1) * PAGE_ROWS : page * PAGE_ROWS]
        try:  # each session's own title, read from its source (the page's rows only)
            titles = await s.monitor.titles([v.link for v in shown])
        except SessionwatchError:
            titles = {}
        self._refresh_titles(
            {v.link.thread_id or "" for v in shown if v.link.key not in titles} - {""}
        )
        rows = []
        for view in shown:
            state, reason = shown_state(view, config.monitor.missing_threshold)
            link = view.link
            title = titles.get(link.key)
            rows.append(
                LinkRow(
                    session_key=link.session_key,
                    kind=link.kind or link.upstream_kind or "?",
                    host=link.host_id or "",
                    title=title or self._titles.get(link.thread_id or "", ""),
                    state=state,
                    reason=reason,
                    activity=activity.get(link.session_key),
                    watched=view.watched,
                )
            )
        by_watcher: dict[str, list[str]] = {}
        for notice in pending:
            by_watcher.setdefault(notice.watcher, []).append(notice.target)
        last = waker.last if waker is not None else {}
        watchers = tuple(
            WatcherRow(watcher=w, targets=tuple(by_watcher.get(w, ())), last_wake=last.get(w))
            for w in sorted(set(by_watcher) | set(last))
        )
        return dataclasses.replace(
            base, links=tuple(rows), watchers=watchers, total=len(links), page=page, pages=pages
        )

    def _refresh_titles(self, threads: set[str]) -> None:
        """The titles a session's format cannot read by itself come from the catalog,
        which reads every session: in the background, at once for a link the last read was
        not asked for (a new adoption has its title within a second), else at most every
        five minutes."""
        if not threads:
            return
        running = self._titles_task is not None and not self._titles_task.done()
        fresh = threads - self._titled
        if running or (not fresh and time.monotonic() - self._titles_at < TITLES_TTL_S):
            return
        self._titles_at = time.monotonic()
        self._titled = set(threads)  # asked once, whether or not the read succeeds
        self._titles_task = asyncio.ensure_future(self._load_titles())

    async def _load_titles(self) -> None:
        with contextlib.suppress(SessionwatchError):
            found = await self.sources.monitor.catalog()
            self._titles = {e.native_id: e.title or "" for e in found.entries if e.native_id}
            self.sources.kernel.bus.publish(TitlesRead())  # the open pages fetch them

    async def _node_states(self, config: Config) -> tuple[tuple[str, str, str | None], ...]:
        check = self.sources.node_check
        if check is None or not config.nodes:
            return tuple((n, c.url, None) for n, c in sorted(config.nodes.items()))
        if time.monotonic() - self._nodes_at >= NODES_TTL_S:
            self._nodes_at = time.monotonic()
            names = sorted(config.nodes)
            found = await asyncio.gather(*(check(n, config.nodes[n]) for n in names))
            self._nodes = tuple(
                (n, config.nodes[n].url, why) for n, why in zip(names, found, strict=True)
            )
        return self._nodes

    async def close(self) -> None:
        if self._titles_task is not None:
            self._titles_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._titles_task


def _page_of(request: web.Request) -> int:
    """``?page=N`` (1 when absent or not a number; past the last: the last)."""
    raw = request.query.get("page", "1")
    return int(raw) if raw.isdigit() and len(raw) < 7 else 1


CHART_W, CHART_H = 96, 18  # 24 bars of 3 px, 1 px apart


def turn_chart(hours: tuple[int, ...]) -> Markup:
    """A person's turns over the last 24 hours, an hour a bar (oldest on the left), scaled
    to the busiest hour: inline SVG drawn here, one path, no script."""
    total, peak = sum(hours), max(hours, default=0)
    label = f"{total} turn{'' if total == 1 else 's'} typed in the last 24 hours"
    if peak:
        label += f", at most {peak} in one hour"
    bars = "".join(
        f"M{i * 4 + 1.5:g} {CHART_H}V{CHART_H - max(round(n / peak * (CHART_H - 2)), 1)}"
        for i, n in enumerate(hours)
        if n
    )
    drawn = f'<path class="bars" d="{bars}"/>' if bars else ""
    return Markup(
        f'<svg class="turns" viewBox="0 0 {CHART_W} {CHART_H}" width="{CHART_W}"'
        f' height="{CHART_H}" role="img" aria-label="{label}"><title>{label}</title>'
        f'<path class="base" d="M0 {CHART_H - 0.5}H{CHART_W}"/>{drawn}</svg>'
    )


def _clock(ms: int | None) -> str:
    if not ms:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))
