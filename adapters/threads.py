"""Blocking reads off the event loop, one daemon thread per read.

A read that hangs (a stuck network mount) holds only its own thread: the caller stops waiting
after ``timeout`` seconds, the source is marked busy until the thread returns, so no second
thread piles up behind it, and a daemon thread never delays the process's exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class SourceBusy(Exception):
    """The previous read of this source has not returned yet."""


class DaemonReads:
    """Runs reads in daemon threads, at most one at a time per source key."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._busy: set[str] = set()
        self._lock = threading.Lock()

    def busy(self) -> int:
        with self._lock:
            return len(self._busy)

    async def run(self, key: str, timeout: float, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a daemon thread; raises :class:`SourceBusy` or ``TimeoutError``."""
        with self._lock:
            if key in self._busy:
                raise SourceBusy(key)
            self._busy.add(key)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if future.done():
                return
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

        def work() -> None:
            try:
                result: Any = fn(*args)
                ok = True
            except BaseException as exc:  # handed to the waiting coroutine
                result, ok = exc, False
            finally:
                with self._lock:
                    self._busy.discard(key)
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(settle, ok, result)

        threading.Thread(target=work, name=f"{self.name}:{key}", daemon=True).start()
        return await asyncio.wait_for(future, timeout)
