"""The hooks stand-in of :mod:`monitor.testing` for the tests that do not run the real
gateway (tests/interop does), with the sidecar's ``[gateway]`` for it and a fixture."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from monitor.config import GatewayConfig
from monitor.testing import HOOKS_TOKEN as TOKEN
from monitor.testing import HooksGateway as _Gateway
from monitor.testing import MockTransport, serving

__all__ = ["TOKEN", "HooksGateway", "MockTransport", "hooks_gateway", "running_hooks_gateway"]


class HooksGateway(_Gateway):
    def config(self, tmp_path: Path, **extra: Any) -> GatewayConfig:
        """The sidecar's ``[gateway]`` for this gateway, its token in a private file."""
        token_file = tmp_path / "hooks-token"
        if not token_file.exists():
            token_file.write_text(TOKEN + "\n")
            token_file.chmod(0o600)
        return GatewayConfig(hooks_url=self.url, hooks_token_file=str(token_file), **extra)


def running_hooks_gateway() -> contextlib.AbstractAsyncContextManager[HooksGateway]:
    """A hooks stand-in on a loopback port of its own, for as long as the block runs."""
    return serving(HooksGateway())


@pytest.fixture
async def hooks_gateway() -> AsyncIterator[HooksGateway]:
    async with running_hooks_gateway() as gw:
        yield gw
