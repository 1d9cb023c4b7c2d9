"""A stand-in for OpenClaw's hooks API (``POST /hooks/wake``) on loopback, for the tests that
do not run the real gateway (tests/interop does). It answers as the real one does: 401 for a
wrong token, 400 ``text required``, 400 for a caller-chosen key it does not allow, 429 with
``Retry-After`` when told to, 503 when told to, else 200 ``queued``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from monitor.config import GatewayConfig

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

    async def wake(self, request: web.Request) -> web.Response:
        self.calls += 1
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.Response(status=401, text="Unauthorized")
        if self.status == 429:
            return web.Response(status=429, headers={"Retry-After": self.retry_after})
        if self.status is not None:
            return web.json_response({"ok": False, "error": "unavailable"}, status=self.status)
        body = orjson.loads(await request.read())
        if not isinstance(body.get("text"), str) or not body["text"].strip():
            return web.json_response({"ok": False, "error": "text required"}, status=400)
        if "sessionKey" in body and not self.allow_keys:
            error = (
                "sessionKey is disabled for externally supplied hook payload values;"
                " set hooks.allowRequestSessionKey=true to enable"
            )
            return web.json_response({"ok": False, "error": error}, status=400)
        self.wakes.append(body)
        self.woken.set()
        return web.json_response({"ok": True, "mode": "now", "eventOutcome": "queued"})

    def config(self, tmp_path: Path, **extra: Any) -> GatewayConfig:
        """The sidecar's ``[gateway]`` for this gateway, its token in a private file."""
        token_file = tmp_path / "hooks-token"
        if not token_file.exists():
            token_file.write_text(TOKEN + "\n")
            token_file.chmod(0o600)
        return GatewayConfig(hooks_url=self.url, hooks_token_file=str(token_file), **extra)


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
