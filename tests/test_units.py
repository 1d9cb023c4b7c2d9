"""The systemd units in docs/: systemd accepts them, and their commands start as written,
with no configuration file, the node creating its token where the unit lets it write."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

UNITS = ("sessionwatch.service", "sessionwatch-node.service", "sessionwatch-openclaw.service")
SCRIPT = Path(sys.executable).with_name("sessionwatch")


def unit_text(name: str, home: Path) -> str:
    """The unit with the install path pointing at this venv (the rest as shipped)."""
    text = (REPO / "docs" / name).read_text()
    return text.replace("%h/sessionwatch/.venv/bin/sessionwatch", str(SCRIPT))


def exec_start(name: str, home: Path) -> list[str]:
    """ExecStart with the specifiers a user manager fills in: %h home, %S state root."""
    line = re.search(r"^ExecStart=(.*)$", unit_text(name, home), flags=re.M)
    assert line is not None
    command = line.group(1).replace("%h", str(home)).replace("%S", str(home / ".local/state"))
    return shlex.split(command)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd is not installed")
def test_systemd_accepts_both_units(tmp_path: Path) -> None:
    paths = []
    for name in UNITS:
        path = tmp_path / name
        path.write_text(unit_text(name, tmp_path))
        paths.append(str(path))
    proc = subprocess.run(
        ["systemd-analyze", "verify", *paths], capture_output=True, text=True, check=False
    )
    assert 0 == proc.returncode, proc.stderr


@pytest.mark.parametrize("name", UNITS)
def test_the_unit_starts_without_a_configuration_file(name: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONWATCH_")}
    env["HOME"] = str(home)
    argv = exec_start(name, home)
    argv[argv.index("--listen") + 1 if "--listen" in argv else 0 :]
    if "--listen" in argv:
        argv[argv.index("--listen") + 1] = "127.0.0.1:0"
    else:  # serve listens on its default port: move it off, through the environment
        config = home / "c.toml"
        config.write_text('[api]\nlisten = "127.0.0.1:0"\n')
        env["SESSIONWATCH_CONFIG"] = str(config)
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if " serving " in line:
                break
        else:
            raise AssertionError(f"{name} did not start")
    finally:
        proc.terminate()
        proc.wait(30)
    if "node" in name:
        token = home / ".local/state/sessionwatch/node-token"
        assert token.exists() and 0o600 == token.stat().st_mode & 0o777
