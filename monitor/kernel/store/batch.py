"""The one batching core of both stores: writes wait in a queue, a thread of their own
takes every write that is waiting (up to :data:`MAX_GROUP`) and runs them as one
transaction, and each caller gets its own outcome back on the event loop.

What differs per dialect is only how one group runs on one connection (``RunGroup``:
SQLite's ``BEGIN IMMEDIATE`` with a busy timeout, PostgreSQL's advisory lock with a lock
timeout); the queue, the grouping, the deadlines and the hand-back are here, once.

A write is a function of the database only, and may run more than once: when one write
of a group fails, the group is rolled back and run again with a savepoint each, so that
the failing write rolls back alone; a PostgreSQL connection that broke before it did
anything is retried once. Running it again is running it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from monitor.errors import StoreError

T = TypeVar("T")
MAX_GROUP = 64  # writes folded into one transaction at most

Result = tuple[bool, Any]  # (ok, the value or the exception)


@dataclass(slots=True)
class PendingWrite:
    fn: Callable[[Any], Any]
    deadline: float  # time.monotonic() after which it no longer waits for a lock
    timeout: float  # how long that was, for the error
    future: asyncio.Future[Any]
    alone: bool = False  # run outside any transaction (the pragmas), not in a group


Done = list[tuple[PendingWrite, Result]]
Expired = Callable[[Done], None]
# Runs one group on the dialect's connection: a result per write, in order. Writes whose
# lock wait is over are failed at once through ``Expired`` (see :func:`live_writes`).
RunGroup = Callable[[list[PendingWrite], Expired], list[Result]]
Translate = Callable[[BaseException, float], BaseException]


def fail_late(
    writes: list[PendingWrite],
    outcomes: list[Result | None],
    now: float,
    locked: Callable[[float], BaseException],
    expired: Expired | None,
) -> None:
    """The writes still waiting whose deadline has passed fail with ``locked(timeout)``, and
    are told at once through ``expired``: a write that came in early would otherwise wait
    for the deadline of the last one in its group."""
    late: Done = []
    for i, write in enumerate(writes):
        if outcomes[i] is None and write.deadline <= now:
            outcome: Result = (False, locked(write.timeout))
            outcomes[i] = outcome
            late.append((write, outcome))
    if late and expired is not None:
        expired(late)


def live_writes(
    writes: list[PendingWrite],
    outcomes: list[Result | None],
    locked: Callable[[float], BaseException],
    expired: Expired | None,
) -> tuple[list[int], float]:
    """The writes of a group still to run, and how long the lock may be waited for: what
    the oldest of them has left (the late ones fail first, see :func:`fail_late`)."""
    now = time.monotonic()
    fail_late(writes, outcomes, now, locked, expired)
    live = [i for i, r in enumerate(outcomes) if r is None]
    return live, (min(writes[i].deadline for i in live) - now) if live else 0.0


def resolve(done: Done, translate: Callable[[BaseException, float], BaseException]) -> None:
    """On the event loop: each write's caller gets its own result or error (``translate``
    makes the store's error ours); a caller already told (or gone) is skipped."""
    for write, (ok, value) in done:
        if write.future.done():
            continue
        if ok:
            write.future.set_result(value)
        else:
            write.future.set_exception(translate(value, write.timeout))


class Batcher:
    """The writer thread (see the module docstring).

    The loop hands writes over with :meth:`submit` (a queue put); the thread blocks only
    while there is nothing to write. A group's results go back to the waiting loop in one
    ``call_soon_threadsafe``, and the thread does not wait for the loop to take them before
    it starts on the next group, so under load it never idles on a round trip through the
    event loop. A write marked ``alone`` runs by itself, outside any group (``run_alone``).
    """

    def __init__(
        self,
        run_group: RunGroup,
        translate: Translate,
        *,
        run_alone: Callable[[PendingWrite], Result] | None = None,
        on_close: Callable[[], None] | None = None,
        name: str = "sessionwatch-writer",
    ) -> None:
        self._run_group = run_group
        self._run_alone = run_alone
        self._translate = translate
        self._on_close = on_close
        self._queue: queue.SimpleQueue[PendingWrite | None] = queue.SimpleQueue()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    async def submit(self, fn: Callable[[Any], T], timeout: float, *, alone: bool = False) -> T:
        """Run ``fn`` in the next group; it waits at most ``timeout`` s for a lock."""
        if self._closing:
            raise StoreError("the state database is closed")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.put(PendingWrite(fn, time.monotonic() + timeout, timeout, future, alone))
        return await future

    @property
    def closing(self) -> bool:
        """Closed, or closing: no write is taken any more."""
        return self._closing

    async def close(self) -> None:
        """Finish the writes already submitted, then stop (and ``on_close``)."""
        if not self._closing:
            self._closing = True
            self._queue.put(None)
        await asyncio.to_thread(self._thread.join)

    def _take(self, first: PendingWrite) -> tuple[list[PendingWrite], PendingWrite | None, bool]:
        """``first`` and the writes waiting behind it, up to MAX_GROUP; a write that must
        run alone, or the end, stops the group (and is handed back for next time)."""
        group = [first]
        while len(group) < MAX_GROUP:
            try:
                write = self._queue.get_nowait()
            except queue.Empty:
                break
            if write is None:
                return group, None, True
            if write.alone:
                return group, write, False
            group.append(write)
        return group, None, False

    def _run(self) -> None:
        carried: PendingWrite | None = None
        stop = False
        try:
            while not stop:
                first = carried if carried is not None else self._queue.get()
                carried = None
                if first is None:
                    break
                if first.alone and self._run_alone is not None:
                    group, results = [first], [self._run_alone(first)]
                else:
                    group, carried, stop = self._take(first)
                    try:
                        results = self._run_group(group, self._hand_back)
                    except BaseException as exc:  # the connection itself failed
                        results = [(False, exc)] * len(group)
                self._hand_back(list(zip(group, results, strict=True)))
        finally:
            if self._on_close is not None:
                self._on_close()

    def _hand_back(self, done: Done) -> None:
        """Each waiting loop (there is one, but a test may bring another) settles its own;
        a write already settled (one whose lock wait expired) is skipped there."""
        by_loop: dict[asyncio.AbstractEventLoop, Done] = {}
        for write, result in done:
            by_loop.setdefault(write.future.get_loop(), []).append((write, result))
        for loop, settled in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: no one waits
                loop.call_soon_threadsafe(resolve, settled, self._translate)
