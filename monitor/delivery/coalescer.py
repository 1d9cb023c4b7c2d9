"""When a watcher is woken: at once, then at most once per 20 s window, across every
sidecar on a shared store. Windows are timed on the monotonic clock: a step of the wall
clock delays no wake past the window."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from monitor.clock import SECOND_MS
from monitor.delivery.timers import Timers
from monitor.lazylog import LazyLogger

log = LazyLogger(__name__)

WAKE_COALESCE_MS = 20 * SECOND_MS

WakeCallback = Callable[[str], None]  # wake this watcher now
WakeClaim = Callable[[str, str], Awaitable["int | str"]]  # see monitor.delivery.claims.claim


class WakeCoalescer:
    """Wakes a watcher at once, then at most once per window.

    A request inside the window is folded into one trailing wake at the window's end.

    On a store several sidecars share, each wake is first claimed in the store, with the
    notice it is for (``claim``, see :func:`monitor.delivery.claims.claim`): the window holds
    across all of them, a notice another sidecar already woke for is not woken again, and a
    newer one inside another sidecar's window becomes one trailing wake.
    """

    def __init__(
        self,
        wake: WakeCallback,
        *,
        timers: Timers,
        window_ms: int = WAKE_COALESCE_MS,
        claim: WakeClaim | None = None,
    ) -> None:
        self._wake = wake
        self._timers = timers
        self._window_ms = window_ms
        self._claim = claim
        self._last_fired: dict[str, float] = {}  # monotonic s
        self._trailing: set[str] = set()
        self._latest: dict[str, str] = {}  # the newest notice each watcher is woken for
        self._claims: set[asyncio.Task[None]] = set()

    def request(self, watcher: str, notice: str = "") -> None:
        """Wake ``watcher`` (for ``notice``, the notice's text) at once or at the end of
        its window."""
        self._latest[watcher] = notice
        now = self._timers.monotonic()
        last = self._last_fired.get(watcher)
        if last is None or now - last >= self._window_s:
            self._fire(watcher)
            return
        self._trail(watcher, last, now)

    @property
    def _window_s(self) -> float:
        return self._window_ms / 1000

    def _trail(self, watcher: str, last: float, now: float) -> None:
        """One trailing wake at the end of the window that began at ``last``."""
        if watcher in self._trailing:
            return
        self._trailing.add(watcher)
        delay_s = min(self._window_s, max(0.0, last + self._window_s - now))
        self._timers.call_later(delay_s, lambda: self._fire_trailing(watcher))

    def _fire_trailing(self, watcher: str) -> None:
        self._trailing.discard(watcher)
        self._fire(watcher)

    def _fire(self, watcher: str) -> None:
        self._last_fired[watcher] = self._timers.monotonic()
        if self._claim is None:
            self._send(watcher)
            return
        task = asyncio.get_running_loop().create_task(self._claimed(watcher))
        self._claims.add(task)
        task.add_done_callback(self._claims.discard)

    async def _claimed(self, watcher: str) -> None:
        assert self._claim is not None
        claimed: int | str
        try:
            claimed = await self._claim(watcher, self._latest.get(watcher, ""))
        except Exception as exc:  # the store is down: a wake too many beats one missing
            log.warning("could not claim the wake of %s (%s); waking anyway", watcher, exc)
            claimed = "send"
        if claimed == "send":
            self._send(watcher)
        elif isinstance(claimed, int):  # another sidecar woke it: this window is theirs
            now = self._timers.monotonic()
            ago_s = (self._timers.now_ms() - claimed) / 1000  # stored wall-clock, within it
            last = now - min(self._window_s, max(0.0, ago_s))
            self._last_fired[watcher] = last
            self._trail(watcher, last, now)

    async def settled(self) -> None:
        """Wait for the wakes being claimed in the store (tests; a clean stop)."""
        while self._claims:
            await asyncio.gather(*list(self._claims), return_exceptions=True)

    def _send(self, watcher: str) -> None:
        try:
            self._wake(watcher)
        except Exception:  # a wake is best-effort; it must never fail the producer
            log.exception("wake callback failed for %s", watcher)
