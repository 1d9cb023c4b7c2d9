"""Stale-state notices: their byte-stable text, the wake coalescer and the
"session created" queue.

A notice is derived from a durable cursor (``material > last_seen``), so every process that
opens the database sees the same pending notices; nothing here is the source of truth.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from monitor.clock import SECOND_MS, Clock
from monitor.lazylog import LazyLogger

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


@dataclass(frozen=True, kw_only=True, slots=True)
class Notice:
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


class WakeCoalescer:
    """Wakes a watcher at once, then at most once per 20 s window.

    A request inside the window is folded into one trailing wake at the window's end.
    ``schedule(delay_s, fn)`` is the event loop's ``call_later`` unless a test plugs another.
    """

    def __init__(
        self,
        wake: WakeCallback,
        *,
        clock: Clock,
        schedule: Callable[[float, Callable[[], None]], Any] | None = None,
        window_ms: int = WAKE_COALESCE_MS,
    ) -> None:
        self._wake = wake
        self._clock = clock
        self._schedule = schedule
        self._window_ms = window_ms
        self._last_fired: dict[str, int] = {}
        self._trailing: set[str] = set()

    def request(self, watcher: str) -> None:
        now = self._clock()
        last = self._last_fired.get(watcher)
        if last is None or now - last >= self._window_ms:
            self._fire(watcher)
            return
        if watcher in self._trailing:
            return
        self._trailing.add(watcher)
        delay_s = (last + self._window_ms - now) / 1000
        schedule = self._schedule
        if schedule is None:
            import asyncio  # only a service schedules; one-shot commands never get here

            schedule = asyncio.get_running_loop().call_later
        schedule(delay_s, lambda: self._fire_trailing(watcher))

    def _fire_trailing(self, watcher: str) -> None:
        self._trailing.discard(watcher)
        self._fire(watcher)

    def _fire(self, watcher: str) -> None:
        self._last_fired[watcher] = self._clock()
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
