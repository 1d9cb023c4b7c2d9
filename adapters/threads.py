"""Blocking reads off the event loop, in a few daemon threads that share one queue of jobs.

A read that hangs (a stuck network mount) holds only its own thread: the other workers take
the rest of the queue; once every job that has not finished is stuck past ``timeout``, the
batch returns without it (that job's result is a ``TimeoutError``). A source whose read is
still stuck is not read again until it returns (its result is :class:`SourceBusy`), a stuck
worker is replaced, and daemon threads never delay the process's exit.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")
_PENDING: Any = object()


class SourceBusy(Exception):
    """The previous read of this source has not returned yet."""


class DaemonReads:
    """Runs batches of reads, at most one at a time per source key."""

    def __init__(self, name: str, *, workers: int = 1, timeout: float = 10.0) -> None:
        self.name = name
        self.workers = workers
        self.timeout = timeout
        self._busy: set[str] = set()
        self._lock = threading.Lock()

    async def run(self, key: str, fn: Callable[..., T], *args: Any) -> T:
        """One read; raises :class:`SourceBusy` or ``TimeoutError`` as well as its own."""
        (result,) = await self.run_batch([(key, lambda: fn(*args))])
        if isinstance(result, BaseException):
            raise result
        return result

    async def run_batch(
        self, jobs: Sequence[tuple[str, Callable[[], T]]]
    ) -> list[T | BaseException]:
        """Each job's result, or the exception it raised (``SourceBusy``, ``TimeoutError``)."""
        results: list[Any] = [_PENDING] * len(jobs)
        started = [0.0] * len(jobs)
        queue: deque[int] = deque()
        with self._lock:
            for i, (key, _) in enumerate(jobs):
                if key in self._busy:
                    results[i] = SourceBusy(key)
                else:
                    self._busy.add(key)
                    queue.append(i)
        remaining = [len(queue)]
        if not queue:
            return results
        import asyncio  # only a tick (async) gets here; replay does not, and starts faster

        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def finish() -> None:
            if not done.done():
                done.set_result(None)

        def worker() -> None:
            while True:
                try:
                    i = queue.popleft()
                except IndexError:
                    return
                started[i] = time.monotonic()
                key, job = jobs[i]
                try:
                    results[i] = job()
                except BaseException as exc:  # handed back as the job's result
                    results[i] = exc
                with self._lock:
                    self._busy.discard(key)
                    remaining[0] -= 1
                    last = remaining[0] == 0
                if last:
                    with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits
                        loop.call_soon_threadsafe(finish)

        def spawn(n: int) -> None:
            for _ in range(n):
                threading.Thread(target=worker, name=f"read:{self.name}", daemon=True).start()

        spawn(min(self.workers, len(queue)))
        replaced = 0
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(done), self.timeout)
                break
            except TimeoutError:
                now = time.monotonic()
                unfinished = [i for i, r in enumerate(results) if r is _PENDING]
                stuck = [i for i in unfinished if started[i] and now - started[i] > self.timeout]
                if len(stuck) == len(unfinished):
                    break  # everything left is stuck: return without it
                if queue and len(stuck) > replaced:
                    spawn(len(stuck) - replaced)  # replace stuck workers: the queue drains
                    replaced = len(stuck)
        for i, result in enumerate(results):
            if result is _PENDING:
                results[i] = TimeoutError(f"the read did not return within {self.timeout:g} s")
        return results
