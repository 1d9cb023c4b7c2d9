"""The sessions' titles a format cannot read by itself, for the status page: read from the
catalog, which reads every session, in the background; said on the bus when read
(:class:`monitor.kernel.bus.TitlesRead`, with the titles: open pages fetch them)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

from monitor.errors import SessionwatchError
from monitor.kernel.bus import Bus, TitlesRead

if TYPE_CHECKING:
    from monitor.upstream import UpstreamMonitor

TITLES_TTL_S = 300.0


class TitleReader:
    """Reads the titles, by native thread id (``read``), and says them on the bus: at once
    for a thread the last read was not asked for (a new adoption has its title within a
    second), else at most every :data:`TITLES_TTL_S`."""

    def __init__(
        self,
        read: Callable[[], Awaitable[dict[str, str]]],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read_titles = read
        self._clock = clock
        self._bus: Bus | None = None
        self._asked: set[str] = set()  # the threads the last read was asked for
        self._read_at = -TITLES_TTL_S
        self._task: asyncio.Task[None] | None = None
        self.reads = 0

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        self._bus = bus
        stack.push_async_callback(self._stop)

    def want(self, threads: set[str]) -> None:
        """The page shows ``threads`` without a title of their own: read the catalog in the
        background when one of them is new, or the last read is old."""
        if not threads:
            return
        running = self._task is not None and not self._task.done()
        fresh = threads - self._asked
        if running or (not fresh and self._clock() - self._read_at < TITLES_TTL_S):
            return
        self._read_at = self._clock()
        self._asked = set(threads)  # asked once, whether or not the read succeeds
        self._task = asyncio.ensure_future(self._read())

    async def settled(self) -> None:
        """The read in flight, if any, ended."""
        if self._task is not None:
            await self._task

    async def _read(self) -> None:
        with contextlib.suppress(SessionwatchError):
            self.reads += 1
            titles = await self._read_titles()
            if self._bus is not None:
                self._bus.publish(TitlesRead(titles))

    async def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def catalog_titles(monitor: UpstreamMonitor) -> Callable[[], Awaitable[dict[str, str]]]:
    """The titles the catalog reads, by native thread id."""

    async def read() -> dict[str, str]:
        found = await monitor.sessions.find()
        return {e.native_id: e.title or "" for e in found.entries if e.native_id}

    return read
