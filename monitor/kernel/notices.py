"""Stale-state notices: their byte-stable text, the wake coalescer and the
"session created" queue.

A notice is derived from a durable cursor (``material > last_seen``), so every process that
opens the database sees the same pending notices; nothing here is the source of truth.
"""

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from monitor.clock import SECOND_MS, Clock
from monitor.lazylog import LazyLogger

if TYPE_CHECKING:
    import asyncio  # at run time only where a service schedules: one-shot commands never do

log = LazyLogger(__name__)

WAKE_COALESCE_MS = 20 * SECOND_MS
CREATED_SUMMARY_CAP = 8192
CREATED_HEADER = "Recent session creations (bounded summary; older entries may be omitted):"
PROVENANCE_EXPLICIT = "explicit"
PROVENANCE_AMBIENT = "ambient-group"


def notice_text(target: str, last_seen: int) -> str:
    """The stale-state notice, byte-stable while it is pending."""
    return (
        f'Session "{target}" changed (other actor). Reconcile before acting: '
        f'session_status sessionKey "{target}" changesSince {last_seen}.'
    )


class Notice(NamedTuple):
    """One pending stale-state notice for a watcher/target pair."""

    watcher: str
    store_path: str | None
    target: str
    last_seen: int
    provenance: str

    @property
    def text(self) -> str:
        return notice_text(self.target, self.last_seen)

    @property
    def queue_only(self) -> bool:
        """Ambient watchers find the notice on their next turn; they are never woken."""
        return self.provenance == PROVENANCE_AMBIENT

    def as_json(self) -> dict[str, Any]:
        return {"target": self.target, "text": self.text}


WakeCallback = Callable[[str], None]


WakeClaim = Callable[[str, str], Awaitable["int | str"]]  # see monitor.kernel.wakes.claim


class WakeCoalescer:
    """Wakes a watcher at once, then at most once per 20 s window.

    A request inside the window is folded into one trailing wake at the window's end.
    ``schedule(delay_s, fn)`` is the event loop's ``call_later`` unless a test plugs another.

    On a store several sidecars share, each wake is first claimed in the store, with the
    notice it is for (``claim``, see :func:`monitor.kernel.wakes.claim`): the window holds
    across all of them, a notice another sidecar already woke for is not woken again, and a
    newer one inside another sidecar's window becomes one trailing wake.
    """

    def __init__(
        self,
        wake: WakeCallback,
        *,
        clock: Clock,
        schedule: Callable[[float, Callable[[], None]], Any] | None = None,
        window_ms: int = WAKE_COALESCE_MS,
        claim: WakeClaim | None = None,
    ) -> None:
        self._wake = wake
        self._clock = clock
        self._schedule = schedule
        self._window_ms = window_ms
        self._claim = claim
        self._last_fired: dict[str, int] = {}
        self._trailing: set[str] = set()
        self._latest: dict[str, str] = {}  # the newest notice each watcher is woken for
        self._claims: set[asyncio.Task[None]] = set()

    def request(self, watcher: str, notice: str = "") -> None:
        """Wake ``watcher`` (for ``notice``, the notice's text) at once or at the end of
        its window."""
        self._latest[watcher] = notice
        now = self._clock()
        last = self._last_fired.get(watcher)
        if last is None or now - last >= self._window_ms:
            self._fire(watcher)
            return
        self._trail(watcher, last, now)

    def _trail(self, watcher: str, last: int, now: int) -> None:
        """One trailing wake at the end of the window that began at ``last``."""
        if watcher in self._trailing:
            return
        self._trailing.add(watcher)
        delay_s = max(0, last + self._window_ms - now) / 1000
        schedule = self._schedule
        if schedule is None:
            import asyncio

            schedule = asyncio.get_running_loop().call_later
        schedule(delay_s, lambda: self._fire_trailing(watcher))

    def _fire_trailing(self, watcher: str) -> None:
        self._trailing.discard(watcher)
        self._fire(watcher)

    def _fire(self, watcher: str) -> None:
        self._last_fired[watcher] = self._clock()
        if self._claim is None:
            self._send(watcher)
            return
        import asyncio

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
            self._last_fired[watcher] = claimed
            self._trail(watcher, claimed, self._clock())

    async def settled(self) -> None:
        """Wait for the wakes being claimed in the store (tests; a clean stop)."""
        import asyncio

        while self._claims:
            await asyncio.gather(*list(self._claims), return_exceptions=True)

    def _send(self, watcher: str) -> None:
        try:
            self._wake(watcher)
        except Exception:  # a wake is best-effort; it must never fail the producer
            log.exception("wake callback failed for %s", watcher)


class CreatedNotices:
    """The bounded in-memory "New session created" queue, one batch per main session."""

    def __init__(self, *, max_entries: int = 100) -> None:
        self._max_entries = max_entries
        self._pending: dict[str, OrderedDict[str, None]] = {}

    def add(self, main_session: str, created_key: str) -> None:
        entries = self._pending.setdefault(main_session, OrderedDict())
        entries[created_key] = None
        entries.move_to_end(created_key)
        while len(entries) > self._max_entries:
            entries.popitem(last=False)

    def peek(self, main_session: str) -> str | None:
        entries = self._pending.get(main_session)
        if not entries:
            return None
        lines = [f"- New session created: {key}" for key in reversed(entries)]
        text = CREATED_HEADER
        for line in lines:  # newest first, so the cap drops the oldest
            if len(text) + 1 + len(line) > CREATED_SUMMARY_CAP:
                break
            text += "\n" + line
        return text

    def drain(self, main_session: str) -> str | None:
        text = self.peek(main_session)
        self._pending.pop(main_session, None)
        return text
