"""Wake calls to the gateway: ``POST {sessionKey, source, intent}`` to its heartbeat URL.

A wake runs in the background with a short timeout and a bounded retry; a gateway that is
down never blocks recording or the tick. Coalescing per watcher (20 s) happens before this,
in :class:`monitor.notices.WakeCoalescer`.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import orjson

from monitor.metrics import Metrics

log = logging.getLogger(__name__)

TIMEOUT_S = 2.0
ATTEMPTS = 3
BACKOFF_S = 0.5


class GatewayWaker:
    def __init__(self, url: str, *, metrics: Metrics | None = None) -> None:
        self.url = url
        self.metrics = metrics
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(self, session_key: str) -> None:
        """Schedule one wake call; returns at once."""
        task = asyncio.get_running_loop().create_task(self._send(session_key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, session_key: str) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))
        body = orjson.dumps(
            {"sessionKey": session_key, "source": "session-state", "intent": "immediate"}
        )
        headers = {"Content-Type": "application/json"}
        for attempt in range(1, ATTEMPTS + 1):
            try:
                async with self._session.post(self.url, data=body, headers=headers) as resp:
                    if resp.status < 500:
                        self._count("ok" if resp.status < 300 else "refused")
                        if resp.status >= 300:
                            log.warning(
                                "gateway refused the wake of %s: %s", session_key, resp.status
                            )
                        return
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.debug("wake of %s failed (attempt %d): %s", session_key, attempt, exc)
            if attempt < ATTEMPTS:
                await asyncio.sleep(BACKOFF_S * attempt)
        self._count("failed")
        log.warning("gateway unreachable; %s not woken (the notice stays queued)", session_key)

    def _count(self, result: str) -> None:
        if self.metrics:
            self.metrics.wakes.labels(result).inc()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
