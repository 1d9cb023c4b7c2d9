"""A stand-in for OpenClaw's hooks API (``POST /hooks/wake``) on loopback, for the tests that
do not run the real gateway (tests/interop does). It answers as the real one does: 401 for a
wrong token, 400 ``text required``, 400 for a caller-chosen key it does not allow, 429 with
``Retry-After`` when told to, 503 when told to, else 200 ``queued``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from monitor.config import GatewayConfig
from monitor.delivery.hooks import CallFailed, Reply

TOKEN = "hook-secret-0123456789abcdef"


class HooksGateway:
    def __init__(self) -> None:
        self.wakes: list[dict[str, Any]] = []  # the accepted wake bodies, in order
        self.calls = 0
        self.woken = asyncio.Event()
        self.allow_keys = True
        self.status: int | None = None  # answer every call with this status instead
        self.retry_after = "1"
        self.url = ""

    @property
    def texts(self) -> list[str]:
        return [w["text"] for w in self.wakes]

    def answer(self, authorization: str | None, raw: bytes) -> tuple[int, Any, dict[str, str]]:
        """The gateway's answer to one call: status, JSON body (or text), headers."""
        self.calls += 1
        if authorization != f"Bearer {TOKEN}":
            return 401, "Unauthorized", {}
        if self.status == 429:
            return 429, "", {"Retry-After": self.retry_after}
        if self.status is not None:
            return self.status, {"ok": False, "error": "unavailable"}, {}
        body = orjson.loads(raw)
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
        status, body, headers = self.answer(
            request.headers.get("Authorization"), await request.read()
        )
        if isinstance(body, str):
            return web.Response(status=status, text=body, headers=headers)
        return web.json_response(body, status=status, headers=headers)

    def transport(self) -> MockTransport:
        """This gateway in process, as the hooks client's transport: no socket at all."""
        return MockTransport(self)

    def config(self, tmp_path: Path, **extra: Any) -> GatewayConfig:
        """The sidecar's ``[gateway]`` for this gateway, its token in a private file."""
        token_file = tmp_path / "hooks-token"
        if not token_file.exists():
            token_file.write_text(TOKEN + "\n")
            token_file.chmod(0o600)
        return GatewayConfig(hooks_url=self.url, hooks_token_file=str(token_file), **extra)


class MockTransport:
    """A :class:`monitor.delivery.hooks.Transport` answered by a :class:`HooksGateway` in
    process (httpx's ``MockTransport``, for the hooks client); ``down`` makes every call go
    unanswered, as a refused connection would."""

    def __init__(self, gateway: HooksGateway) -> None:
        self.gateway = gateway
        self.down = False
        self.closed = False
        self.before: Callable[[], Awaitable[None]] | None = None  # runs before an answer

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> Reply:
        if self.before is not None:
            await self.before()
        if self.down:
            self.gateway.calls += 1
            raise CallFailed("connection refused")
        status, answer, extra = self.gateway.answer(headers.get("Authorization"), body)
        raw = answer.encode() if isinstance(answer, str) else orjson.dumps(answer)
        return Reply(status, raw, extra.get("Retry-After"))

    async def close(self) -> None:
        self.closed = True


@contextlib.asynccontextmanager
async def running_hooks_gateway() -> AsyncIterator[HooksGateway]:
    """A hooks stand-in on a loopback port of its own, for as long as the block runs."""
    gw = HooksGateway()
    app = web.Application()
    app.router.add_post("/hooks/wake", gw.wake)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        gw.url = f"http://{host}:{port}/hooks"
        yield gw
    finally:
        await runner.cleanup()


@pytest.fixture
async def hooks_gateway() -> AsyncIterator[HooksGateway]:
    async with running_hooks_gateway() as gw:
        yield gw
