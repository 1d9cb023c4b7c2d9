"""Waking the gateway through its hooks API: ``POST {hooks_url}/wake``.

The wake is the delivery. A gateway keeps its pending notices in memory, so a notice that a
sidecar process opened reaches the running agent only as the text of a wake. Each of the
watcher's notices that a sidecar opened goes as one call, its text byte for byte::

    {"text": <notice>, "mode": "now", "agentId": <watcher's agent>, "sessionKey": <watcher>}

with ``Authorization: Bearer <hooks token>``. A ``200`` (``queued`` or ``coalesced``) is
acknowledged exactly as a drain is; anything else leaves the notice pending, and it is sent
again: at once on the next change, else every ``retry_s`` while it is pending.

- 5xx, a timeout, a refused connection: three tries, then the interval.
- 401: said once, naming the token file; no call at all until the interval has passed, so
  the gateway's lockout (20 failures a minute) is never reached.
- 429: no call until its ``Retry-After`` has passed.
- 400: said once with the gateway's own error. Where it refuses caller-chosen session keys,
  a main session is woken through its agent's main session (no ``sessionKey``); any other
  watcher's notice stays pending.

Coalescing per watcher (20 s) happens before this, in
:class:`monitor.kernel.notices.WakeCoalescer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson

from monitor.config import GatewayConfig
from monitor.errors import ConfigError, connection_reason
from monitor.kernel.cursors import WatchCursor
from monitor.kernel.keys import main_key_for, parse_agent_key
from monitor.metrics import Metrics
from monitor.paths import expand_user
from monitor.private import read_secret
from monitor.retry import Backoff

log = logging.getLogger(__name__)

TIMEOUT_S = 5.0
ATTEMPTS = 3
BACKOFF_S = 0.5
KEYS_SETTING = (
    'hooks.allowRequestSessionKey: true, with "agent:" (and "hook:") in'
    " hooks.allowedSessionKeyPrefixes"
)


class NoticeLedger(Protocol):
    """Where the waker reads what to send and says what the gateway accepted
    (:class:`monitor.kernel.delivery.Delivery`)."""

    async def undelivered(self, watcher: str) -> list[WatchCursor]: ...

    async def delivered(self, accepted: list[WatchCursor]) -> None: ...


@dataclass(frozen=True, slots=True)
class Answer:
    """One wake call's outcome: ``result`` is the metric label."""

    result: str  # accepted | refused | unauthorized | throttled | failed
    error: str = ""
    retry_after_s: float = 0.0


@dataclass(frozen=True, slots=True)
class LastWake:
    """The outcome of the last wake call for one watcher (the status page shows it)."""

    result: str  # as Answer.result
    error: str
    at_ms: int


class HooksWaker:
    def __init__(
        self,
        hooks_url: str,
        token_file: Path,
        *,
        main_key: str = "main",
        retry_s: float = 30.0,
        metrics: Metrics | None = None,
        credentials: Callable[[], tuple[str, str]] | None = None,
    ) -> None:
        """``credentials``: the hooks URL and token as the gateway's own configuration says
        at each call (:class:`monitor.openclaw.Hooks`), instead of ``hooks_url`` and the
        token file."""
        self.url = hooks_url.rstrip("/") + "/wake"
        self.token_file = token_file
        self.credentials = credentials
        self.main_key = main_key
        self.retry_s = retry_s
        self.metrics = metrics
        self.ledger: NoticeLedger | None = None
        self.keys_refused = False  # the gateway refuses caller-chosen session keys
        self._session: aiohttp.ClientSession | None = None
        self._running: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._retries: dict[str, asyncio.TimerHandle] = {}
        self._quiet_until = 0.0  # no call before this (monotonic): after a 401 or a 429
        self._said: set[str] = set()
        # notices the gateway accepted whose acknowledgement the store refused: acknowledged
        # again before anything else, never sent again (that would deliver them twice)
        self._unacked: dict[str, list[WatchCursor]] = {}
        self.last: dict[str, LastWake] = {}  # per watcher
        self.on_outcome: Callable[[], None] | None = None  # a watcher's outcome changed

    def attach(self, ledger: NoticeLedger) -> None:
        self.ledger = ledger

    def reconfigure(self, gateway: GatewayConfig) -> None:
        """A reloaded ``[gateway]``: the next call goes to the new URL with the new token,
        and every reason may be said again (a gateway setting may have changed too)."""
        self.url = gateway.hooks_url.rstrip("/") + "/wake"
        self.token_file = Path(expand_user(gateway.hooks_token_file))
        self.retry_s = gateway.retry_interval_s
        self.keys_refused = False
        self._quiet_until = 0.0
        self._said.clear()

    def __call__(self, watcher: str) -> None:
        """Send the watcher's undelivered notices in the background; returns at once."""
        if watcher in self._running:
            self._again.add(watcher)  # one more pass once the one in flight ends
            return
        retry = self._retries.pop(watcher, None)
        if retry is not None:
            retry.cancel()
        task = asyncio.get_running_loop().create_task(self._pass(watcher))
        self._running[watcher] = task
        task.add_done_callback(lambda _: self._passed(watcher))

    def _passed(self, watcher: str) -> None:
        self._running.pop(watcher, None)
        if watcher in self._again:
            self._again.discard(watcher)
            self(watcher)

    def _retry_later(self, watcher: str) -> None:
        if watcher in self._retries:
            return
        delay = max(self.retry_s, self._quiet_until - time.monotonic())
        loop = asyncio.get_running_loop()
        self._retries[watcher] = loop.call_later(delay, self._fire_retry, watcher)

    def _fire_retry(self, watcher: str) -> None:
        self._retries.pop(watcher, None)
        self(watcher)

    async def _pass(self, watcher: str) -> None:
        if self.ledger is None:
            return
        if not await self._acknowledge(watcher, self._unacked.pop(watcher, [])):
            return
        try:
            pending = await self.ledger.undelivered(watcher)
        except Exception as exc:  # the store is down: the notice is still there later
            self._say_once("store", "could not read the notices to wake (%s); retrying", exc)
            self._retry_later(watcher)
            return
        accepted: list[WatchCursor] = []
        unsent = 0
        for cursor in pending:
            if time.monotonic() < self._quiet_until:
                unsent += 1
                continue
            answer = await self._send(watcher, cursor)
            if answer is None:
                continue  # not ours to send while the gateway refuses this key
            if answer.result == "accepted":
                accepted.append(cursor)
            else:
                unsent += 1
        if await self._acknowledge(watcher, accepted) and unsent:
            self._retry_later(watcher)

    async def _acknowledge(self, watcher: str, accepted: list[WatchCursor]) -> bool:
        """Acknowledge what the gateway accepted; when the store refuses, keep it to
        acknowledge at the next pass (retried), and answer False."""
        if not accepted or self.ledger is None:
            return True
        try:
            await self.ledger.delivered(accepted)
        except Exception as exc:  # the store is down: the gateway has the notice already
            self._unacked[watcher] = accepted
            self._say_once("ack", "could not acknowledge a delivered notice (%s); retrying", exc)
            self._retry_later(watcher)
            return False
        return True

    async def _send(self, watcher: str, cursor: WatchCursor) -> Answer | None:
        """One notice in one wake call; None when the gateway refuses caller-chosen keys and
        ``watcher`` is no main session (its notice stays pending, for its own drains)."""
        key = parse_agent_key(watcher)
        body: dict[str, Any] = {"text": cursor.notice().text, "mode": "now"}
        if key is not None:
            body["agentId"] = key.agent_id
        is_main = key is not None and watcher == main_key_for(key.agent_id, self.main_key)
        if self.keys_refused and not is_main:
            return None
        if not self.keys_refused:
            body["sessionKey"] = watcher
        answer = await self._post(body)
        if answer.result == "refused" and _refuses_keys(answer.error):
            if not self.keys_refused:  # two passes in flight may both hear it
                self._keys_refused_said(answer.error)
            self._count(answer)
            if not is_main:
                return None
            del body["sessionKey"]
            answer = await self._post(body)
        self._explain(answer)
        before = self.last.get(watcher)
        self.last[watcher] = LastWake(answer.result, answer.error, int(time.time() * 1000))
        news = before is None or (before.result, before.error) != (answer.result, answer.error)
        if news and self.on_outcome is not None:
            self.on_outcome()  # a status page shows a new outcome at once
        return self._count(answer)

    def _keys_refused_said(self, error: str) -> None:
        self.keys_refused = True
        log.warning(
            "the gateway refuses caller-chosen session keys (%s): main sessions are woken"
            " through their agent's main session, other watchers' notices stay pending;"
            " set %s to wake each watcher's own session",
            error,
            KEYS_SETTING,
        )

    async def _post(self, body: dict[str, Any]) -> Answer:
        try:
            if self.credentials is not None:
                base, token = self.credentials()
                self.url = base.rstrip("/") + "/wake"
            else:
                token = read_secret(self.token_file, "the hooks token file")
        except ConfigError as exc:
            return Answer("unauthorized", str(exc))
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        error = ""
        backoff = Backoff(BACKOFF_S, BACKOFF_S * 2 ** (ATTEMPTS - 2))
        for attempt in range(1, ATTEMPTS + 1):
            try:
                async with self._session.post(
                    self.url, data=orjson.dumps(body), headers=headers
                ) as resp:
                    answer = await _read_answer(resp)
                    if answer.result != "failed":
                        return answer
                    error = answer.error
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                error = connection_reason(exc)
            if attempt < ATTEMPTS:
                await backoff.wait()
        return Answer("failed", error)

    def _explain(self, answer: Answer) -> None:
        """Each reason once in the log (until the gateway accepts a wake again)."""
        if answer.result == "accepted":
            if self._said - {"keys"}:
                log.info("the gateway accepts wakes again")
            self._said &= {"keys"}
            return
        if answer.result == "unauthorized":
            self._quiet_until = time.monotonic() + self.retry_s
            self._say_once(
                "401",
                "the gateway refused the hooks token (401): check %s against the gateway's"
                " hooks.token; notices stay pending (%s)",
                "OpenClaw's configuration" if self.credentials else self.token_file,
                answer.error or "401",
            )
        elif answer.result == "throttled":
            self._quiet_until = time.monotonic() + answer.retry_after_s
            self._say_once(
                "429",
                "the gateway throttles wakes (429); waiting %.0f s as it asked",
                answer.retry_after_s,
            )
        elif answer.result == "refused":
            self._say_once(
                f"400 {answer.error}",
                "the gateway refused a wake (400): %s; the notice stays pending",
                answer.error,
            )
        else:
            self._say_once(
                "down",
                "the gateway at %s did not take a wake (%s); notices stay pending and are"
                " sent again every %.0f s",
                self.url,
                answer.error,
                self.retry_s,
            )

    def _say_once(self, reason: str, message: str, *args: object) -> None:
        if reason not in self._said:
            self._said.add(reason)
            log.warning(message, *args)

    def _count(self, answer: Answer) -> Answer:
        if self.metrics:
            self.metrics.wakes.labels(answer.result).inc()
        return answer

    async def settled(self) -> None:
        """Wait for the passes in flight (tests; a clean stop)."""
        while self._running:
            await asyncio.gather(*list(self._running.values()), return_exceptions=True)

    async def close(self) -> None:
        for handle in self._retries.values():
            handle.cancel()
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        if self._session is not None:
            await self._session.close()


def _refuses_keys(error: str) -> bool:
    """The gateway's 400 for a caller-chosen key it does not allow (not for ``mode``)."""
    return error.startswith("sessionKey") and "mode" not in error


async def _read_answer(resp: aiohttp.ClientResponse) -> Answer:
    raw = await resp.read()
    error = ""
    with contextlib.suppress(orjson.JSONDecodeError):
        parsed = orjson.loads(raw)
        if isinstance(parsed, dict):
            error = str(parsed.get("error") or "")
    error = error or raw.decode("utf-8", "replace").strip()[:200] or str(resp.status)
    if 200 <= resp.status < 300:
        return Answer("accepted")
    if resp.status == 401:
        return Answer("unauthorized", error)
    if resp.status == 429:
        try:
            wait = float(resp.headers.get("Retry-After", "60"))
        except ValueError:
            wait = 60.0
        return Answer("throttled", error, retry_after_s=max(wait, 1.0))
    if 400 <= resp.status < 500:
        return Answer("refused", f"{resp.status} {error}" if resp.status != 400 else error)
    return Answer("failed", f"{resp.status} {error}")
