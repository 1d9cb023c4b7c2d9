"""The one watcher of the store's changes made by other processes (the change hub).

The store's ``version()`` moves with every commit of another process, and never with this
one's own: SQLite's ``PRAGMA data_version`` of the writer connection (a CLI process, a
gateway sharing the file), or the count of PostgreSQL's notices of other stores (any other
sidecar on any host). This process's own commits are on the bus as they happen
(:mod:`monitor.kernel.bus`). :class:`ChangeHub` looks at the version when the store says it may
have moved: on SQLite on Linux when the database or its WAL was written (inotify; and again
shortly after, as the commit may be visible only then: :data:`VISIBLE_AFTER_S`), elsewhere
every ``POLL_S``, and at once on PostgreSQL's notice; in one task, counts each move and
publishes :class:`monitor.kernel.bus.StoreMoved`, which so means another process's commit,
and only that. So N readers listening cost the store no more looks than one.

The hub's task starts when :class:`~monitor.kernel.bus.StoreMoved` is first listened for
(:meth:`monitor.kernel.bus.Bus.on_first`), and ends with the kernel, its registration on the
bus with it.
"""

from __future__ import annotations

import contextlib

from monitor.errors import SessionwatchError
from monitor.kernel.bus import StoreMoved
from monitor.lazylog import LazyLogger

TYPE_CHECKING = False

if TYPE_CHECKING:  # asyncio at run time only where someone waits: one-shot commands never
    import asyncio

    from monitor.kernel.bus import Bus
    from monitor.kernel.store.protocol import StateStore

log = LazyLogger(__name__)

POLL_S = 0.2
WATCHED_S = 30.0  # the hub's look when the store is told of writes: a safety net only
# SQLite: a commit's frames are written to the WAL (the write told) before its index makes
# it visible, so a look at the tell may find nothing yet while the writer is descheduled
# between the two; no write tells the rest. Looked at again after these, unless told sooner.
VISIBLE_AFTER_S = (0.05, 0.25, 1.0)
KEEPALIVE_S = 15.0


class ChangeHub:
    def __init__(self, store: StateStore, bus: Bus, *, poll_s: float = POLL_S) -> None:
        self._store = store
        self._bus = bus
        self._poll_s = poll_s
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.moves = 0  # how often another process's commit was heard
        self.looks = 0  # how often the store was looked at (its cost, in tests and benches)
        self._first = bus.on_first(StoreMoved, self._start)  # the first to listen starts it

    def _start(self) -> None:
        """Start watching (once): every change after this call is heard. The version is
        read here, before the listener reads what a change would alter, so that nothing
        falls between its read and its wait."""
        if self._task is None and not self._closed:
            import asyncio

            self._task = asyncio.get_running_loop().create_task(self._watch(self._look(None)))

    def _look(self, version: int | None) -> int | None:
        """The store's version now: ``version`` when the store is away, None when it cannot
        say at once (a write holds its connection)."""
        self.looks += 1
        try:
            return self._store.version()
        except SessionwatchError as exc:  # the store is away: look again later
            log.debug("changes not looked at: %s", exc)
            return version

    async def _watch(self, version: int | None) -> None:
        import asyncio

        told = self._store.watches_changes  # on SQLite on Linux, this arms the watch
        looked = False  # the first look is at once: a commit between the start and the
        # arming of the watch told nothing
        again: tuple[float, ...] = ()  # the looks still due after a tell that found nothing
        while not self._closed:
            heard = False
            if looked:
                wait = again[0] if again else WATCHED_S if told else self._poll_s
                again = again[1:]
                heard = await self._store.changed(wait)
            looked = True
            now = self._look(version)
            while now is None and not self._closed:  # a write holds the store: soon again
                await asyncio.sleep(self._poll_s)
                now = self._look(version)
            if version is None:  # the start could not read it: this is the baseline
                version = now
            self._heard(version, now)
            if told and now != version:
                again = ()
                # a burst of another process's commits is heard at most every
                # POLL_S, as a poll would: what each move wakes (re-reads) stays bounded
                await asyncio.sleep(self._poll_s)
            elif told and heard:
                again = VISIBLE_AFTER_S  # told of a write not visible yet (or our own)
            version = now

    def _heard(self, before: int | None, now: int | None) -> None:
        if now == before or now is None:
            return
        self.moves += 1
        self._bus.publish(StoreMoved(self.moves, self._store.heard()))

    async def close(self) -> None:
        """Stop watching. The loop also ends by itself at its next look: Python 3.11's
        ``wait_for`` (PostgreSQL's ``changed``) can swallow a cancellation that lands as the
        change does."""
        self._closed = True
        self._first.unsubscribe()
        task, self._task = self._task, None
        if task is not None:
            import asyncio

            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
