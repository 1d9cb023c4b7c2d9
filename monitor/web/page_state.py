"""What the status page shows: one part, :class:`PageState`.

It reads the store's rows when the page asks (the links and their states, each session's
activity, the pending notices), and keeps what no store holds as the bus tells it, from
the data each change carries: each watcher's last wake (:class:`WakeOutcome`), the last
tick (:class:`TickRan`), the titles read (:class:`TitlesRead`), the notices an earlier
release left undecided (:class:`NoticesUndecided`), and the configuration in force
(:class:`ConfigReloaded`). It reads no other part's memory. The page itself
(:mod:`monitor.web.status_page`) is routes, admission and rendering.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapters.states import FOR_A_PERSON
from monitor.config import Config, NodeConfig, is_pg_url, without_password
from monitor.errors import SessionwatchError
from monitor.kernel.bus import (
    Bus,
    ConfigReloaded,
    NoticesUndecided,
    TickRan,
    TitlesRead,
    WakeOutcome,
)
from monitor.upstream.configured import root_paths

if TYPE_CHECKING:
    from monitor.kernel import Kernel
    from monitor.kernel.signal_log import Activity
    from monitor.upstream import UpstreamMonitor
    from monitor.upstream.links import LinkView
    from monitor.web.titles import TitleReader

NODES_TTL_S = 30.0
PAGE_ROWS = 100  # adopted sessions a page shows: the first paint stays small at 10,000

NodeCheck = Callable[[str, NodeConfig], Awaitable[str | None]]


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
    doing: str = "unknown"  # what the session is doing (adapters/states.py), since when
    doing_since: int | None = None
    doing_hours: tuple[str | None, ...] = ()  # what it did most of each of the last 24 hours


@dataclass(frozen=True, kw_only=True, slots=True)
class NeedsYou:
    """An adopted session whose next move is a person's: it ended its turn (``waiting``)
    or asked (``asking``), since ``since`` (ms)."""

    session_key: str
    kind: str
    title: str
    state: str
    since: int | None


@dataclass(frozen=True, slots=True)
class LastWake:
    """The outcome of the last wake call for one watcher."""

    result: str  # accepted, refused, ...: as WakeOutcome.result
    error: str
    at_ms: int  # wall clock, as shown


@dataclass(frozen=True, kw_only=True, slots=True)
class WatcherRow:
    watcher: str
    targets: tuple[str, ...]
    last_wake: LastWake | None


@dataclass(frozen=True, slots=True)
class TickShown:
    """The last tick, as :class:`TickRan` said it, and the schedule in force."""

    interval_s: float
    budget_s: float
    last_at_ms: int | None = None
    last_duration_s: float | None = None
    over_budget: tuple[str, ...] = ()
    failed: str | None = None  # why the last tick failed as a whole

    def after(self, ran: TickRan) -> TickShown:
        if ran.failed is not None:
            return dataclasses.replace(self, failed=ran.failed)
        if ran.idle:  # nothing to read: the links stand as the last tick left them
            return dataclasses.replace(self, last_at_ms=ran.at_ms, failed=None)
        return dataclasses.replace(
            self,
            last_at_ms=ran.at_ms,
            last_duration_s=ran.duration_s,
            over_budget=ran.over_budget,
            failed=None,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class PageView:
    version: str
    store: str
    roots: tuple[tuple[str, str, bool], ...]
    nodes: tuple[tuple[str, str, str | None], ...]  # name, url, why unreachable (None: ok)
    links: tuple[LinkRow, ...]
    watchers: tuple[WatcherRow, ...]
    tick: TickShown
    wakes: str  # how notices reach the gateway
    now_ms: int
    error: str | None = None
    total: int = 0  # the adopted sessions, of which ``links`` is one page
    states: tuple[tuple[str, int], ...] = ()  # how many of them in each state shown
    page: int = 1
    pages: int = 1
    needs_you: tuple[NeedsYou, ...] = ()  # the longest waited for first, one page of them
    waiting: int = 0  # how many sessions need a person, of which ``needs_you`` is a page

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
    found = _drift(view)
    if found:
        return "drifting", "; ".join(found)
    return "healthy", ""


def _drift(view: LinkView) -> list[str]:
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
    return found


class NodeStates:
    """Whether each paired node answers, asked at most every :data:`NODES_TTL_S`."""

    def __init__(self, check: NodeCheck | None) -> None:
        self._check = check
        self._states: tuple[tuple[str, str, str | None], ...] = ()
        self._at = -NODES_TTL_S

    async def of(self, nodes: Mapping[str, NodeConfig]) -> tuple[tuple[str, str, str | None], ...]:
        check = self._check
        if check is None or not nodes:
            return tuple((n, c.url, None) for n, c in sorted(nodes.items()))
        if time.monotonic() - self._at >= NODES_TTL_S:
            self._at = time.monotonic()
            names = sorted(nodes)
            found = await asyncio.gather(*(check(n, nodes[n]) for n in names))
            states = zip(names, found, strict=True)
            self._states = tuple((n, nodes[n].url, why) for n, why in states)
        return self._states


class PageState:
    """What the status page shows (see the module docstring)."""

    bus: Bus  # handed at start

    def __init__(
        self,
        kernel: Kernel,
        monitor: UpstreamMonitor,
        config: Config,
        titles: TitleReader,
        *,
        db: str,
        version: str,
        wakes_to: str | None,
        node_check: NodeCheck | None = None,
    ) -> None:
        """``wakes_to``: where wakes go at start (None: no wakes); ``node_check``: whether a
        paired node answers, and why not."""
        self.kernel = kernel
        self.monitor = monitor
        self.config = config
        self.db = db
        self.version = version
        self.wakes_to = wakes_to
        self._titles = titles
        self._nodes = NodeStates(node_check)
        self.titles: dict[str, str] = {}  # by native thread id, as last read
        self.wakes: dict[str, LastWake] = {}  # per watcher
        self.undecided = 0
        self.tick = TickShown(config.monitor.interval_s, config.monitor.adapter_budget_s)

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        self.bus = bus  # the page's streams listen on it
        stack.enter_context(bus.subscribe(WakeOutcome, self._woke))
        stack.enter_context(bus.subscribe(TickRan, self._ticked))
        stack.enter_context(bus.subscribe(TitlesRead, self._titles_read))
        stack.enter_context(bus.subscribe(NoticesUndecided, self._undecided))
        stack.enter_context(bus.subscribe(ConfigReloaded, self._reloaded))

    def _woke(self, change: WakeOutcome) -> None:
        self.wakes[change.watcher] = LastWake(change.result, change.error, change.at_ms)
        self.wakes_to = change.url or self.wakes_to

    def _ticked(self, change: TickRan) -> None:
        self.tick = self.tick.after(change)

    def _titles_read(self, change: TitlesRead) -> None:
        self.titles = change.titles

    def _undecided(self, change: NoticesUndecided) -> None:
        self.undecided = change.count

    def _reloaded(self, change: ConfigReloaded) -> None:
        self.config = change.new
        monitor = change.new.monitor
        self.tick = dataclasses.replace(
            self.tick, interval_s=monitor.interval_s, budget_s=monitor.adapter_budget_s
        )

    async def fingerprint(self) -> tuple[object, ...]:
        """Moves when what the page shows of the store does."""
        return (await self.kernel.fingerprint(), await self.monitor.fingerprint())

    def _wakes_said(self) -> str:
        said = (
            f"woken through {self.wakes_to}"
            if self.wakes_to is not None
            else "no [gateway] hooks_url: the gateway drains notices itself"
        )
        if self.undecided:
            said += (
                f"; {self.undecided} notices an earlier sessionwatch left on this shared"
                " database are left to the gateway until their pair changes"
            )
        return said

    async def view(self, page: int = 1) -> PageView:
        """What the page shows; of the adopted sessions, page ``page`` (the ones typed
        into most recently first)."""
        config = self.config
        base = PageView(
            version=self.version,
            store=without_password(self.db) if is_pg_url(self.db) else self.db,
            roots=tuple(
                (kind, str(path), path.exists()) for kind, path in root_paths(config.roots).items()
            ),
            nodes=await self._nodes.of(config.nodes),
            links=(),
            watchers=(),
            tick=self.tick,
            wakes=self._wakes_said(),
            now_ms=int(time.time() * 1000),
        )
        try:
            links = await self.monitor.links()
            activity = await self.kernel.activity()
            pending = await self.kernel.all_pending()
        except SessionwatchError as exc:
            return dataclasses.replace(base, error=str(exc))

        def recent(v: LinkView) -> tuple[int, str]:
            typed = activity.get(v.link.session_key)
            return (-(typed.last_at if typed else 0), v.link.session_key)

        pages = max((len(links) + PAGE_ROWS - 1) // PAGE_ROWS, 1)
        page = min(max(page, 1), pages)
        shown = sorted(links, key=recent)[(page - 1) * PAGE_ROWS : page * PAGE_ROWS]
        waiting = sorted(
            (v for v in links if v.doing.state in FOR_A_PERSON),
            key=lambda v: (v.doing.since is None, v.doing.since or 0, v.link.session_key),
        )
        needs = waiting[:PAGE_ROWS]
        titles = await self._titles_of([*shown, *needs])  # one read for the table and panel
        rows = await self._rows(shown, activity, titles)
        by_watcher: dict[str, list[str]] = {}
        for notice in pending:
            by_watcher.setdefault(notice.watcher, []).append(notice.target)
        watchers = tuple(
            WatcherRow(watcher=w, targets=tuple(by_watcher.get(w, ())), last_wake=self.wakes.get(w))
            for w in sorted(set(by_watcher) | set(self.wakes))
        )
        missing_after = self.config.monitor.missing_threshold
        states = Counter(shown_state(v, missing_after)[0] for v in links)
        return dataclasses.replace(
            base,
            needs_you=tuple(
                NeedsYou(
                    session_key=v.link.session_key,
                    kind=v.link.kind or v.link.upstream_kind or "?",
                    title=self._title(titles, v),
                    state=v.doing.state,
                    since=v.doing.since,
                )
                for v in needs
            ),
            waiting=len(waiting),
            links=rows,
            watchers=watchers,
            total=len(links),
            states=tuple(sorted(states.items())),
            page=page,
            pages=pages,
        )

    async def _titles_of(self, shown: list[LinkView]) -> dict[tuple[str, str], str | None]:
        """Each session's own title, read from its source where its format can; the
        catalog's of the others are asked for in the background (``self.titles``)."""
        try:
            titles = await self.monitor.sessions.titles([v.link for v in shown])
        except SessionwatchError:
            titles = {}
        untitled = {v.link.thread_id for v in shown if v.link.key not in titles}
        self._titles.want({thread for thread in untitled if thread})
        return titles

    def _title(self, titles: Mapping[tuple[str, str], str | None], view: LinkView) -> str:
        """A session's title: its own (``titles``), else the catalog's, else none."""
        return titles.get(view.link.key) or self.titles.get(view.link.thread_id or "", "")

    async def _rows(
        self,
        shown: list[LinkView],
        activity: dict[str, Activity],
        titles: Mapping[tuple[str, str], str | None],
    ) -> tuple[LinkRow, ...]:
        """The page's rows, each with its session's title (:meth:`_title`)."""
        try:
            hours = await self.monitor.doing_hours([v.link.session_key for v in shown])
        except SessionwatchError:
            hours = {}
        missing_after = self.config.monitor.missing_threshold
        rows = []
        for view in shown:
            state, reason = shown_state(view, missing_after)
            link = view.link
            rows.append(
                LinkRow(
                    session_key=link.session_key,
                    kind=link.kind or link.upstream_kind or "?",
                    host=link.host_id or "",
                    title=self._title(titles, view),
                    state=state,
                    reason=reason,
                    activity=activity.get(link.session_key),
                    watched=view.watched,
                    doing=view.doing.state,
                    doing_since=view.doing.since,
                    doing_hours=hours.get(link.session_key, ()),
                )
            )
        return tuple(rows)
