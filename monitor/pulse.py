"""A count that moves, and wakes whoever waits for it to pass the one they saw.

Under the change bus, a count for the waits that outlive a callback: the change hub's count
of other processes' commits, a PostgreSQL store's count of ``NOTIFY``s and a node's change
feed (the parts of the service hear changes on the bus, :mod:`monitor.kernel.bus`). A
waiter takes ``count``, reads what the change would alter, then waits with
:meth:`Pulse.after`; a beat between the two is never missed.
asyncio is imported when someone waits: a one-shot command that never waits never loads it.
"""

from __future__ import annotations

TYPE_CHECKING = False

if TYPE_CHECKING:
    import asyncio


class Pulse:
    __slots__ = ("_closed", "_moved", "count")

    def __init__(self) -> None:
        self.count = 0
        self._moved: asyncio.Event | None = None  # made by the first waiter of a beat
        self._closed = False

    def beat(self) -> None:
        """Move the count, and wake everyone waiting."""
        self.count += 1
        self._wake()

    def close(self) -> None:
        """Wake everyone now, and every later waiter at once: the source is gone."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        moved, self._moved = self._moved, None
        if moved is not None:
            moved.set()

    async def after(self, seen: int, timeout: float, *, unless: asyncio.Event | None = None) -> int:
        """The count, once it has passed ``seen``, after ``timeout`` s, or once ``unless``
        is set (a stop), whichever comes first."""
        if self.count != seen or self._closed or (unless is not None and unless.is_set()):
            return self.count
        import asyncio

        if self._moved is None:
            self._moved = asyncio.Event()
        waits = [asyncio.ensure_future(self._moved.wait())]
        if unless is not None:
            waits.append(asyncio.ensure_future(unless.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return self.count
