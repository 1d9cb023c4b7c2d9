"""The gateway's hooks API as a client: ``POST {hooks_url}/wake``, one notice per call.

The wake is the delivery. A gateway keeps its pending notices in memory, so a notice that a
sidecar process opened reaches the running agent only as the text of a wake, byte for byte::

    {"text": <notice>, "mode": "now", "agentId": <watcher's agent>, "sessionKey": <watcher>}

with ``Authorization: Bearer <hooks token>``. A ``200`` (``queued`` or ``coalesced``) is
accepted; what each answer means for the notice is :class:`monitor.delivery.ledger.Delivery`'s.

- 5xx, a refused connection, no connection in ``CONNECT_S``: the call reached no gateway
  that took it, so it is tried three times, then ``failed``.
- No whole answer within ``READ_S`` once the request went out (a gateway that trickles its
  answer, too), or a connection cut after it went: the gateway may have taken the wake, so
  it is not tried again here (``unanswered``; the ledger allows one more call,
  :mod:`monitor.delivery.ledger`), and the connection is reset, so nothing of it arrives
  later (:mod:`monitor.delivery.transport`). An attempt so ends before the wake's lease
  does (:data:`monitor.delivery.ledger.ATTEMPT_MS`).
- 401: said once, naming the token file; no call at all for ``retry_s``, so the gateway's
  lockout (20 failures a minute) is never reached.
- 429: no call until its ``Retry-After`` has passed.
- 400: said once with the gateway's own error. Where it refuses caller-chosen session keys,
  a main session is woken through its agent's main session (no ``sessionKey``); any other
  watcher is not the client's to wake (``None``).
- 3xx: a redirect is never followed (the token and the notice would go where the gateway
  did not listen, and another server's 200 would count as the gateway's): ``redirected``,
  said once with where it pointed; the notice stays pending.
- The token cannot be read (its mode, a missing, empty or unreadable file): ``no_token``,
  said once with the reason, no call made, tried again every ``retry_s``.

The HTTP transport and the timers are given from outside (:class:`Transport`, as httpx's
``MockTransport`` is; :class:`monitor.delivery.timers.Timers`), so a test answers as the
gateway would, on a manual clock.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from monitor.config import Config, GatewayConfig
from monitor.delivery.transport import CallFailed, OneShotTransport, Ready, Reply, Transport
from monitor.errors import SessionwatchError, one_line
from monitor.kernel.bus import Bus, ConfigReloaded, WakeOutcome
from monitor.kernel.keys import main_key_for, parse_agent_key
from monitor.paths import expand_user
from monitor.private import read_secret
from monitor.retry import Backoff

if TYPE_CHECKING:
    from contextlib import AsyncExitStack

    from monitor.delivery.timers import Timers
    from monitor.metrics import Metrics

log = logging.getLogger(__name__)

ATTEMPTS = 3
BACKOFF_S = 0.5
KEYS_REFUSED = "the gateway refuses caller-chosen session keys"  # a watcher's not woken
KEYS_SETTING = (
    'hooks.allowRequestSessionKey: true, with "agent:" (and "hook:") in'
    " hooks.allowedSessionKeyPrefixes"
)


class Credentials(Protocol):
    """The hooks URL and token as the gateway's own configuration says them
    (:class:`monitor.openclaw.files.Hooks`)."""

    @property
    def seen(self) -> object:
        """The version of the configuration last read."""
        ...

    def current(self) -> tuple[str, str]:
        """(hooks URL, token) now; raises a SessionwatchError saying why not."""
        ...


@dataclass(frozen=True, slots=True)
class WakeAnswer:
    """One wake call's outcome: ``result`` is the metric label."""

    # accepted | refused | unauthorized | throttled | redirected | no_token | failed |
    # unanswered (the gateway may have taken it) | withdrawn (no longer to be sent: no call)
    result: str
    error: str = ""
    retry_after_s: float = 0.0


class HooksClient:
    def __init__(
        self,
        hooks_url: str,
        token_file: Path,
        *,
        timers: Timers,
        transport: Transport | None = None,
        main_key: str = "main",
        retry_s: float = 30.0,
        metrics: Metrics | None = None,
        credentials: Credentials | None = None,
        bus: Bus | None = None,
    ) -> None:
        """``credentials``: the hooks URL and token as the gateway's own configuration says
        at each call (:class:`monitor.openclaw.files.Hooks`), instead of ``hooks_url`` and the
        token file. ``bus``: where each call's outcome is published, with its watcher
        (:class:`monitor.kernel.bus.WakeOutcome`: a status page shows it at once)."""
        self.url = hooks_url.rstrip("/") + "/wake"
        self.token_file = token_file
        self.credentials = credentials
        self.main_key = main_key
        self.retry_s = retry_s
        self.metrics = metrics
        self.timers = timers
        self.transport: Transport = transport or OneShotTransport()
        # the gateway refused caller-chosen session keys: when (monotonic s), and the
        # version of its configuration then; checked again after retry_s, or at once when
        # its configuration changed (OpenClaw applies a change without a restart)
        self._keys_refused: tuple[float, object] | None = None
        self.bus = bus  # where each wake's outcome is said (WakeOutcome)
        self._quiet_until = 0.0  # monotonic s; no call before this: after a 401 or a 429
        self._said: set[str] = set()

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        """Take its section of each reload until ``stack`` closes, then close its
        connections."""
        stack.push_async_callback(self.close)
        stack.enter_context(bus.subscribe(ConfigReloaded, self._reloaded))

    def live_fields(self, new: Config) -> tuple[str, ...]:
        """``[gateway]`` applies live while wakes stay on (turning them on or off needs a
        restart), and while its token file is usable: one that became unusable (its mode,
        an empty file) is said, whether the configuration changed or not."""
        if not new.gateway.wakes:
            return ()
        try:
            read_secret(Path(expand_user(new.gateway.hooks_token_file)), "the hooks token file")
        except SessionwatchError as exc:
            log.error("%s; wakes fail until it is fixed (serve refuses it at start)", exc)
            return ()
        return ("gateway",)

    def _reloaded(self, change: ConfigReloaded) -> None:
        if change.old.gateway != change.new.gateway:
            self.reconfigure(change.new.gateway)

    def reconfigure(self, gateway: GatewayConfig) -> None:
        """A reloaded ``[gateway]``: the next call goes to the new URL with the new token,
        and every reason may be said again (a gateway setting may have changed too)."""
        self.url = gateway.hooks_url.rstrip("/") + "/wake"
        self.token_file = Path(expand_user(gateway.hooks_token_file))
        self.retry_s = gateway.retry_interval_s
        self._keys_refused = None
        self._quiet_until = 0.0
        self._said.clear()

    def quiet_s(self) -> float:
        """How long no call may go (after a 401 or a 429); 0 when calls may go."""
        return max(0.0, self._quiet_until - self.timers.monotonic())

    async def wake(self, watcher: str, text: str, *, still: Ready | None = None) -> WakeAnswer:
        """One notice in one wake call. When the gateway refuses caller-chosen keys and
        ``watcher`` is no main session: ``refused`` (its notice stays pending, for its own
        drains, and is tried with its key again after ``retry_s``: the refusal may heal).
        ``still``: asked at each attempt once connected, just before its request is
        written; False withdraws the call (``withdrawn``, no call made: the notice was
        acknowledged or drained meanwhile, or the lease is lost)."""
        key = parse_agent_key(watcher)
        body: dict[str, Any] = {"text": text, "mode": "now"}
        if key is not None:
            body["agentId"] = key.agent_id
        is_main = key is not None and watcher == main_key_for(key.agent_id, self.main_key)
        keys_refused = self.keys_refused()
        if keys_refused and not is_main:  # no call: refused as the gateway last answered
            return self._outcome(watcher, WakeAnswer("refused", KEYS_REFUSED))
        if not keys_refused:
            body["sessionKey"] = watcher
        answer = await self._post(body, still)
        if answer.result == "withdrawn":
            return answer
        if answer.result == "refused" and _refuses_keys(answer.error):
            self._refused_keys(answer.error)
            self._count(answer)
            if not is_main:  # pending, tried again with its key after retry_s
                return self._outcome(watcher, WakeAnswer("refused", KEYS_REFUSED))
            del body["sessionKey"]
            answer = await self._post(body, still)
            if answer.result == "withdrawn":
                return answer
        elif answer.result == "accepted" and "sessionKey" in body and "keys" in self._said:
            self._said.discard("keys")
            log.info("the gateway takes caller-chosen session keys again")
        self._explain(answer)
        return self._count(self._outcome(watcher, answer))

    def _outcome(self, watcher: str, answer: WakeAnswer) -> WakeAnswer:
        """``answer``, said on the bus as ``watcher``'s outcome (a status page shows it)."""
        if self.bus is not None:
            at_ms = self.timers.now_ms()
            self.bus.publish(WakeOutcome(watcher, answer.result, answer.error, at_ms, self.url))
        return answer

    def keys_refused(self) -> bool:
        """The gateway refused caller-chosen session keys lately: less than ``retry_s``
        ago, with its configuration unchanged since."""
        if self._keys_refused is None:
            return False
        at, version = self._keys_refused
        if self.timers.monotonic() - at < self.retry_s and version == self._version():
            return True
        self._keys_refused = None  # the next wake carries its key again
        return False

    def _version(self) -> object:
        """The version of the gateway's configuration the credentials came from, if any."""
        return None if self.credentials is None else self.credentials.seen

    def _refused_keys(self, error: str) -> None:
        self._keys_refused = (self.timers.monotonic(), self._version())
        self.say_once(
            "keys",
            "the gateway refuses caller-chosen session keys (%s): main sessions are woken"
            " through their agent's main session, other watchers' notices stay pending and"
            " are tried again every %.0f s; set %s to wake each watcher's own session",
            error,
            self.retry_s,
            KEYS_SETTING,
        )

    async def _post(self, body: dict[str, Any], still: Ready | None) -> WakeAnswer:
        try:
            if self.credentials is not None:
                base, token = self.credentials.current()
                url = base.rstrip("/") + "/wake"
                if url != self.url:  # a new gateway.port, say: followed, said once
                    if self.url != "/wake":
                        log.info("wakes now go to %s, as OpenClaw's configuration says", url)
                    self.url = url
            else:
                token = read_secret(self.token_file, "the hooks token file")
        except SessionwatchError as exc:  # its mode, a missing or unreadable file: no call
            return WakeAnswer("no_token", str(exc))
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        errors: list[str] = []  # each try's, once: a 500 then a timeout are both said
        backoff = Backoff(BACKOFF_S, BACKOFF_S * 2 ** (ATTEMPTS - 2))
        for attempt in range(1, ATTEMPTS + 1):
            try:
                reply = await self.transport.post(self.url, orjson.dumps(body), headers, still)
                if reply is None:
                    return WakeAnswer("withdrawn")  # read again once connected: not sent
                answer = _answer(reply)
                if answer.result != "failed":  # a redirect is not followed, nor tried again
                    return answer
                error = answer.error
            except CallFailed as exc:
                if exc.maybe_taken:  # it may be queued: a second try here would repeat it
                    return WakeAnswer("unanswered", str(exc))
                error = str(exc)
            if error not in errors:
                errors.append(error)
            if attempt < ATTEMPTS:
                await self.timers.sleep(backoff.next())
        return WakeAnswer("failed", "; then ".join(errors))

    def _explain(self, answer: WakeAnswer) -> None:
        """Each reason once in the log (until the gateway accepts a wake again)."""
        if answer.result == "accepted":
            if self._said - {"keys"}:
                log.info("the gateway accepts wakes again")
            self._said &= {"keys"}
            return
        now = self.timers.monotonic()
        if answer.result == "unauthorized":
            self._quiet_until = now + self.retry_s
            self.say_once(
                "401",
                "the gateway refused the hooks token (401): check %s against the gateway's"
                " hooks.token; notices stay pending (%s)",
                "OpenClaw's configuration" if self.credentials else self.token_file,
                answer.error or "401",
            )
        elif answer.result == "throttled":
            self._quiet_until = now + answer.retry_after_s
            self.say_once(
                "429",
                "the gateway throttles wakes (429); waiting %.0f s as it asked",
                answer.retry_after_s,
            )
        elif answer.result == "no_token":
            self.say_once(
                "token",
                "no wake sent: %s; notices stay pending and are tried again every %.0f s",
                answer.error,
                self.retry_s,
            )
        elif answer.result == "redirected":
            self.say_once(
                "redirect",
                "the hooks endpoint %s answered a redirect (%s); redirects are never followed"
                " (the token and the notice would go to another server): set the hooks URL to"
                " where the gateway itself listens; notices stay pending",
                self.url,
                answer.error,
            )
        elif answer.result == "refused":
            self.say_once(
                f"400 {answer.error}",
                "the gateway refused a wake (400): %s; the notice stays pending",
                answer.error,
            )
        elif answer.result == "unanswered":
            self.say_once(
                "unanswered",
                "the gateway at %s did not answer a wake in time (%s): it may have taken it;"
                " it is sent at most once more",
                self.url,
                answer.error,
            )
        else:  # each way of being down once: a 500, then a timeout, are two reasons
            self.say_once(
                "down " + answer.error.split(" ", 1)[0],
                "the gateway at %s did not take a wake (%s); notices stay pending and are"
                " sent again every %.0f s",
                self.url,
                answer.error,
                self.retry_s,
            )

    def say_once(self, reason: str, message: str, *args: object) -> None:
        """``message`` in the log, unless ``reason`` was said since wakes last went
        through."""
        if reason not in self._said:
            self._said.add(reason)
            log.warning(message, *args)

    def _count(self, answer: WakeAnswer) -> WakeAnswer:
        if self.metrics:
            self.metrics.wakes.labels(answer.result).inc()
        return answer

    async def close(self) -> None:
        await self.transport.close()


def _refuses_keys(error: str) -> bool:
    """The gateway's 400 for a caller-chosen key it does not allow (not for ``mode``)."""
    return error.startswith("sessionKey") and "mode" not in error


def _answer(reply: Reply) -> WakeAnswer:
    error = ""
    with contextlib.suppress(orjson.JSONDecodeError):
        parsed = orjson.loads(reply.body)
        if isinstance(parsed, dict):
            error = str(parsed.get("error") or "")
    status = reply.status
    # the gateway's words, on one printable line (its escape bytes never reach a terminal)
    error = one_line(error or reply.body.decode("utf-8", "replace"), 200) or str(status)
    if 200 <= status < 300:
        return WakeAnswer("accepted")
    if 300 <= status < 400:
        return WakeAnswer("redirected", f"{status} to {reply.location or 'nowhere'}")
    if status == 401:
        return WakeAnswer("unauthorized", error)
    if status == 429:
        try:
            wait = float(reply.retry_after or "60")
        except ValueError:
            wait = 60.0
        return WakeAnswer("throttled", error, retry_after_s=max(wait, 1.0))
    if 400 <= status < 500:
        return WakeAnswer("refused", f"{status} {error}" if status != 400 else error)
    return WakeAnswer("failed", f"{status} {error}")
