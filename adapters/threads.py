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
        batch = _Batch(self, jobs)
        if not batch.queue:
            return batch.results
        import asyncio  # only a tick (async) gets here; replay does not, and starts faster

        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        batch.finish = lambda: loop.call_soon_threadsafe(_finish, done)
        batch.spawn(min(self.workers, len(batch.queue)))
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(done), self.timeout)
                break
            except TimeoutError:
                if not batch.replace_stuck():
                    break  # everything left is stuck: return without it
        return batch.timed_out()

    def claim(self, key: str) -> bool:
        """Whether ``key``'s source may be read now (its last read returned): then it is
        busy until :meth:`release`."""
        with self._lock:
            if key in self._busy:
                return False
            self._busy.add(key)
            return True

    def release(self, key: str) -> None:
        with self._lock:
            self._busy.discard(key)


def _finish(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


class _Batch:
    """One batch's jobs, their results as they come, and the workers reading them."""

    def __init__(self, reads: DaemonReads, jobs: Sequence[tuple[str, Callable[[], Any]]]) -> None:
        self.reads = reads
        self.jobs = jobs
        self.results: list[Any] = [_PENDING] * len(jobs)
        self.started = [0.0] * len(jobs)
        self.queue: deque[int] = deque()
        for i, (key, _) in enumerate(jobs):
            if reads.claim(key):
                self.queue.append(i)
            else:
                self.results[i] = SourceBusy(key)
        self.remaining = len(self.queue)
        self.replaced = 0
        self.finish: Callable[[], object] = lambda: None
        self._lock = threading.Lock()

    def spawn(self, n: int) -> None:
        for _ in range(n):
            name = f"read:{self.reads.name}"
            threading.Thread(target=self.worker, name=name, daemon=True).start()

    def worker(self) -> None:
        while True:
            try:
                i = self.queue.popleft()
            except IndexError:
                return
            self.started[i] = time.monotonic()
            key, job = self.jobs[i]
            try:
                self.results[i] = job()
            except BaseException as exc:  # handed back as the job's result
                self.results[i] = exc
            self.reads.release(key)
            with self._lock:
                self.remaining -= 1
                last = self.remaining == 0
            if last:
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits
                    self.finish()

    def replace_stuck(self) -> bool:
        """After a wait of a timeout: a new worker for each newly stuck one while jobs are
        queued (the queue drains); False when every job left is stuck."""
        now = time.monotonic()
        unfinished = [i for i, r in enumerate(self.results) if r is _PENDING]
        stuck = [
            i for i in unfinished if self.started[i] and now - self.started[i] > self.reads.timeout
        ]
        if len(stuck) == len(unfinished):
            return False
        if self.queue and len(stuck) > self.replaced:
            self.spawn(len(stuck) - self.replaced)
            self.replaced = len(stuck)
        return True

    def timed_out(self) -> list[Any]:
        """The results, a job still running past the timeout's as a ``TimeoutError``."""
        said = f"the read did not return within {self.reads.timeout:g} s"
        return [TimeoutError(said) if r is _PENDING else r for r in self.results]
