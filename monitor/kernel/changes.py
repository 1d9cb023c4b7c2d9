"""One watcher of the store's changes per process, for everyone who waits on them.

The store's ``version()`` moves with every commit of another connection: SQLite's ``PRAGMA
data_version`` (this process's writer, a CLI process, a gateway sharing the file), or
PostgreSQL's ``NOTIFY`` count (any sidecar on any host). :class:`ChangeHub` looks at it, every
``POLL_S`` on SQLite and at once on PostgreSQL's notice, in one task, and counts each move.
A waiter asks to be woken when the count passes the one it saw (:meth:`ChangeHub.after`):
the notice streams, the status page, ``notices --follow``, file watching's link refresh and
delivery's watch for notices other processes opened. So N open streams cost the store no
more looks than one.

The task starts with the first waiter and ends with the kernel. A one-shot command runs
without an event loop (``notices --follow``, its only waiter): there the waiter looks
itself, the same way.
"""

from __future__ import annotations

import contextlib

from monitor.errors import SessionwatchError
from monitor.lazylog import LazyLogger

TYPE_CHECKING = False

if TYPE_CHECKING:  # asyncio at run time only where someone waits: one-shot commands never
    import asyncio

    from monitor.kernel.store.protocol import StateStore

log = LazyLogger(__name__)

POLL_S = 0.2
KEEPALIVE_S = 15.0


class ChangeHub:
    def __init__(self, store: StateStore, *, poll_s: float = POLL_S) -> None:
        self._store = store
        self._poll_s = poll_s
        self._count = 0
        self._moved: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._inline: int | None = None  # without a loop: the version the waiter last saw
        self._closed = False
        self.looks = 0  # how often the store was looked at (its cost, in tests and benches)

    def mark(self) -> int:
        """The count of changes heard so far, to pass to :meth:`after`; every change after
        this call is heard (the first call starts the watching). Take it before reading
        what the change would alter, so that nothing falls between the read and the wait."""
        if self._task is None and self._inline is None:
            import asyncio

            baseline = self._look(None)
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # a one-shot command: its one waiter looks itself
                self._inline = baseline if baseline is not None else -1
                return self._count
            self._moved = asyncio.Event()
            self._task = loop.create_task(self._watch(baseline))
        return self._count

    async def after(self, seen: int, timeout: float, *, unless: asyncio.Event | None = None) -> int:
        """The count, once it has passed ``seen``, after ``timeout`` s, or once ``unless``
        is set (a stop), whichever comes first."""
        self.mark()
        if self._count != seen or (unless is not None and unless.is_set()):
            return self._count
        if self._inline is not None:
            await self._store.changed(timeout)  # on the calling thread: it never suspends
            self._heard(self._inline, self._look(self._inline))
            return self._count
        import asyncio

        assert self._moved is not None
        waits = [asyncio.ensure_future(self._moved.wait())]
        if unless is not None:
            waits.append(asyncio.ensure_future(unless.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return self._count

    def _look(self, version: int | None) -> int | None:
        self.looks += 1
        try:
            return self._store.version()
        except SessionwatchError as exc:  # the store is away: look again later
            log.debug("changes not looked at: %s", exc)
            return version

    async def _watch(self, version: int | None) -> None:
        while not self._closed:
            await self._store.changed(self._poll_s)
            now = self._look(version)
            self._heard(version, now)
            version = now

    def _heard(self, before: int | None, now: int | None) -> None:
        if now == before or now is None:
            return
        self._count += 1
        if self._inline is not None:
            self._inline = now
            return
        import asyncio

        moved, self._moved = self._moved, asyncio.Event()
        assert moved is not None
        moved.set()

    async def close(self) -> None:
        """Stop watching. The loop also ends by itself at its next look: Python 3.11's
        ``wait_for`` (PostgreSQL's ``changed``) can swallow a cancellation that lands as the
        change does."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            import asyncio

            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
