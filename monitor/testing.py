"""For testing against sessionwatch without sleeping: a manual clock and timers, and a
stand-in for the gateway's hooks API. What the project's own tests use, importable by a
gateway's developers (as structlog's ``testing`` and httpx's ``MockTransport`` are).

A wake delivered without a network and without waiting out its 20 s window::

    from monitor.testing import HooksGateway, waking_kernel

    gateway = HooksGateway()
    async with waking_kernel(tmp_path / "state.db", gateway, tmp_path / "token") as (
        kernel, timers
    ):
        await kernel.watch(watcher="agent:main:main", target="agent:main:subagent:a")
        await kernel.record(...)  # a person's turn in the sub-agent's session
        await timers.advance(0)  # the wake goes at once
        await kernel.record(...)  # a second one within the window
        await timers.advance(20_000)  # the window passes at once: the next wake
        assert 2 == len(gateway.texts)

Or on a loopback port of its own, for a sidecar in another process::

    async with running_hooks_gateway() as gateway:
        ...  # [gateway] hooks_url = gateway.url, hooks_token_file holding HOOKS_TOKEN
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from aiohttp import web

    from monitor.delivery.transport import Ready, Reply
    from monitor.kernel import Kernel

T0 = 1_790_000_000_000  # where a manual clock starts (ms since the epoch)
HOOKS_TOKEN = "hook-secret-0123456789abcdef"  # the token the stand-in gateway takes


class ManualClock:
    """A wall clock in ms that moves only when the test moves it."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@dataclass(order=True)
class _Timer:
    at_ms: int
    seq: int
    fn: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


async def settle_loop(rounds: int = 20) -> None:
    """Let the event loop run what is ready (no time passes)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


class ManualTimers:
    """Delivery's timers (:class:`monitor.delivery.timers.Timers`) on a :class:`ManualClock`:
    a timer fires, and a sleep ends, only when :meth:`advance` moves time past it. Timers
    run on a monotonic clock of their own, which :meth:`advance` moves with the wall clock;
    a test steps the wall clock alone by setting ``clock.now``."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.mono_ms = 0
        self.stores: list[Any] = []  # stores whose thread writes each step waits for
        self._due: list[_Timer] = []
        self._seq = itertools.count()

    def now_ms(self) -> int:
        return self.clock()

    def monotonic(self) -> float:
        return self.mono_ms / 1000

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> _Timer:
        timer = _Timer(self.mono_ms + round(delay_s * 1000), next(self._seq), fn)
        heapq.heappush(self._due, timer)
        return timer

    async def sleep(self, delay_s: float) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def end() -> None:
            if not done.done():
                done.set_result(None)

        self.call_later(delay_s, end)
        await done

    @property
    def delays_ms(self) -> list[int]:
        """How far ahead each timer still set is."""
        return sorted(t.at_ms - self.mono_ms for t in self._due if not t.cancelled)

    async def advance(self, ms: int) -> None:
        """Move both clocks ``ms`` on, firing each timer due on the way at its own time,
        and letting what it woke run until it waits again."""
        await self.quiesce()  # what the step before began ends before time moves
        end = self.mono_ms + ms
        while self._due and self._due[0].at_ms <= end:
            timer = heapq.heappop(self._due)
            if timer.cancelled:
                continue
            step = max(0, timer.at_ms - self.mono_ms)
            self.mono_ms += step
            self.clock.now += step
            timer.fn()
            await self.quiesce()
        self.clock.now += end - self.mono_ms
        self.mono_ms = end
        await self.quiesce()

    async def quiesce(self) -> None:
        """Let what is ready run, and the writes handed to a store's writer thread end, so
        that no time passes while a write of the step is still under way."""
        await settle_loop()
        for _ in range(5_000):
            if not any(getattr(s, "_queued", 0) for s in self.stores):
                return
            await asyncio.sleep(0.001)
            await settle_loop()


class HooksGateway:
    """A stand-in for OpenClaw's hooks API (``POST /hooks/wake``). It answers as the real one
    does: 401 for a wrong token, 400 ``text required``, 400 for a caller-chosen session key
    it does not allow (``allow_keys``), 429 with ``Retry-After`` or any other status when
    told to (``status``), else 200 ``queued``; the accepted bodies are kept in order."""

    def __init__(self, token: str = HOOKS_TOKEN) -> None:
        self.token = token
        self.wakes: list[dict[str, Any]] = []  # the accepted wake bodies, in order
        self.calls = 0
        self.woken = asyncio.Event()
        self.allow_keys = True
        self.status: int | None = None  # answer every call with this status instead
        self.retry_after = "1"
        self.url = ""  # its hooks base, once it listens (running_hooks_gateway)

    @property
    def texts(self) -> list[str]:
        return [w["text"] for w in self.wakes]

    def answer(self, authorization: str | None, raw: bytes) -> tuple[int, Any, dict[str, str]]:
        """The gateway's answer to one call: status, JSON body (or text), headers."""
        import orjson

        self.calls += 1
        if authorization != f"Bearer {self.token}":
            return 401, "Unauthorized", {}
        if self.status == 429:
            return 429, "", {"Retry-After": self.retry_after}
        if self.status is not None:
            return self.status, {"ok": False, "error": "unavailable"}, {}
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return 400, {"ok": False, "error": "invalid JSON"}, {}
        if not isinstance(body, dict):
            return 400, {"ok": False, "error": "text required"}, {}
        if not isinstance(body.get("text"), str) or not body["text"].strip():
            return 400, {"ok": False, "error": "text required"}, {}
        if "sessionKey" in body and not self.allow_keys:
            error = (
                "sessionKey is disabled for externally supplied hook payload values;"
                " set hooks.allowRequestSessionKey=true to enable"
            )
            return 400, {"ok": False, "error": error}, {}
        self.wakes.append(body)
        self.woken.set()
        return 200, {"ok": True, "mode": "now", "eventOutcome": "queued"}, {}

    async def wake(self, request: web.Request) -> web.Response:
        """The aiohttp handler of ``POST /hooks/wake``."""
        from aiohttp import web

        status, body, headers = self.answer(
            request.headers.get("Authorization"), await request.read()
        )
        if isinstance(body, str):
            return web.Response(status=status, text=body, headers=headers)
        return web.json_response(body, status=status, headers=headers)

    def transport(self) -> MockTransport:
        """This gateway in process, as the hooks client's transport: no socket at all."""
        return MockTransport(self)


class MockTransport:
    """A :class:`monitor.delivery.hooks.Transport` answered by a :class:`HooksGateway` in
    process (httpx's ``MockTransport``, for the hooks client); ``down`` makes every call go
    unanswered, as a refused connection would."""

    def __init__(self, gateway: HooksGateway) -> None:
        self.gateway = gateway
        self.down = False
        self.closed = False
        self.before: Callable[[], Awaitable[None]] | None = None  # runs before an answer

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], ready: Ready | None = None
    ) -> Reply | None:
        import orjson

        from monitor.delivery.transport import CallFailed, Reply

        if self.down:  # never connected: not asked
            self.gateway.calls += 1
            raise CallFailed("connection refused")
        if ready is not None and not await ready():
            return None
        if self.before is not None:
            await self.before()
        status, answer, extra = self.gateway.answer(headers.get("Authorization"), body)
        raw = answer.encode() if isinstance(answer, str) else orjson.dumps(answer)
        return Reply(status, raw, extra.get("Retry-After"))

    async def close(self) -> None:
        self.closed = True


@contextlib.asynccontextmanager
async def serving(gateway: HooksGateway) -> AsyncIterator[HooksGateway]:
    """``gateway`` on a loopback port of its own, for as long as the block runs; its
    ``url`` is then the ``[gateway] hooks_url`` to give a sidecar."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/hooks/wake", gateway.wake)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        gateway.url = f"http://{host}:{port}/hooks"
        yield gateway
    finally:
        await runner.cleanup()


def running_hooks_gateway(
    token: str = HOOKS_TOKEN,
) -> contextlib.AbstractAsyncContextManager[HooksGateway]:
    """A new :class:`HooksGateway` that takes ``token``, served on loopback (:func:`serving`)."""
    return serving(HooksGateway(token))


@contextlib.asynccontextmanager
async def waking_kernel(
    target: str | Path, gateway: HooksGateway, token_file: Path, clock: ManualClock | None = None
) -> AsyncIterator[tuple[Kernel, ManualTimers]]:
    """A kernel on ``target`` (a SQLite path or a PostgreSQL URL) whose wakes go to
    ``gateway`` in process, on manual timers: what ``serve`` does with a notice, with no
    socket and no sleep. ``token_file`` is written with the gateway's token (mode 600) if
    it is not there. Yields the kernel and its timers (``await timers.advance(ms)``)."""
    from monitor.delivery.hooks import HooksClient
    from monitor.delivery.ledger import Delivery
    from monitor.kernel import Kernel
    from monitor.kernel.store import open_store

    if not token_file.exists():
        token_file.write_text(gateway.token + "\n")
        token_file.chmod(0o600)
    clock = clock or ManualClock()
    store = await open_store(target, clock=clock)
    timers = ManualTimers(clock)
    timers.stores.append(store)
    client = HooksClient(
        gateway.url or "http://gateway.invalid/hooks",
        token_file,
        timers=timers,
        transport=gateway.transport(),
    )
    kernel = await Kernel.on_store(store)
    delivery = Delivery(kernel, client, timers=timers, others=False)
    try:
        async with contextlib.AsyncExitStack() as stack:
            await delivery.start(stack, kernel.bus)
            yield kernel, timers
            await delivery.close()
    finally:
        await client.close()
        await kernel.close()
