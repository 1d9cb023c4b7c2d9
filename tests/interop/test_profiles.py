"""OpenClaw's profiles, followed as OpenClaw resolves them, with two real gateways on one
machine: the default install, and the ``dev`` profile started as its CLI starts it
(``openclaw --dev gateway run``, which listens on 19001 with no ``gateway.port`` set). A
sidecar with ``OPENCLAW_PROFILE=dev`` follows the dev install and its port; one without
follows the default's. ``doctor`` names the install, what chose it and where the port came
from, and its probe of the hooks (an empty body, which wakes no one) is accepted by the
gateway it follows; the sidecar's wake URL is the one that answers."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.interop import NODE, OPENCLAW, unless_runnable
from tests.interop.gateway_rig import ANSI, QUIET, free_port, http, wait_for, why_not_runnable
from tests.test_openclaw_files import sw

WHY = why_not_runnable()
pytestmark = unless_runnable(WHY)
HOOKS_TOKEN = "hooks-" + "ab12" * 8
DEV_PORT = 19001


def _config(path: Path, port: int | None) -> None:
    gateway: dict[str, object] = {
        "mode": "local",
        "bind": "loopback",
        "auth": {"mode": "token", "token": "gw-" + "cd34" * 8},
    }
    if port is not None:
        gateway["port"] = port
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "gateway": gateway,
                "hooks": {"enabled": True, "token": HOOKS_TOKEN, "allowRequestSessionKey": True},
            }
        )
    )


def _start(home: Path, *flags: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = home / f"gateway{''.join(flags)}.log"
    env = {"HOME": str(home), "PATH": f"{NODE.parent}:/usr/bin:/bin", **QUIET}
    proc = subprocess.Popen(
        [str(NODE), str(OPENCLAW / "openclaw.mjs"), *flags, "gateway", "run"],
        cwd=home,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, log


def _ready(proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"the gateway exited: {log.read_text()[-3000:]}")
    return bool(re.search(r"\[gateway\] ready\b", ANSI.sub("", log.read_text("utf-8", "replace"))))


@pytest.fixture(scope="module")
def two_gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    """A home with the default install (on a port of its own) and the ``dev`` profile's
    (no port: 19001 from OpenClaw's CLI), both gateways running."""
    with __import__("socket").socket() as s:
        if s.connect_ex(("127.0.0.1", DEV_PORT)) == 0:
            pytest.skip(f"port {DEV_PORT}, the dev profile's, is taken on this machine")
    home = tmp_path_factory.mktemp("profiles")
    default_port = free_port()
    _config(home / ".openclaw" / "openclaw.json", default_port)
    _config(home / ".openclaw-dev" / "openclaw.json", None)
    started = [_start(home), _start(home, "--dev")]
    try:
        for proc, log in started:
            wait_for("a gateway to be ready", lambda p=proc, g=log: _ready(p, g), 300)
        yield home, default_port
    finally:
        for proc, _ in started:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in started:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def _sidecar_env(home: Path, **extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("OPENCLAW_", "SESSIONWATCH_"))}
    return {**keep, "HOME": str(home), **extra}


def _doctor(env: dict[str, str]) -> str:
    done = sw(env, "doctor")
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


def _wake_url(env: dict[str, str]) -> str:
    """The hooks URL serve would wake, as its code finds it in this environment."""
    code = "from monitor.openclaw.files import Hooks, locate; print(Hooks(locate()).current()[0])"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_the_dev_profile_with_no_gateway_running_says_its_port_and_how_to_start_it(
    tmp_path: Path,
) -> None:
    """No gateway runs (this test runs before the module's gateways start): the port is the
    dev profile's own (19001, as ``--dev`` sets it), and
    doctor's fix says how to start that profile's gateway, not to check an unset
    ``gateway.port``."""
    _config(tmp_path / ".openclaw-dev" / "openclaw.json", None)
    env = _sidecar_env(tmp_path, OPENCLAW_PROFILE="dev")
    assert _wake_url(env) == f"http://127.0.0.1:{DEV_PORT}/hooks"
    said = _doctor(env)  # the dev install has yet to make its database: start it so
    assert "start the gateway once (openclaw --dev gateway run, or its service)" in said, said
    made = tmp_path / ".openclaw-dev" / "state" / "openclaw.sqlite"
    made.parent.mkdir()
    with contextlib.closing(sqlite3.connect(made)) as conn:
        conn.execute("CREATE TABLE gateway_own (id INTEGER)")
    made.chmod(0o600)
    said = _doctor(env)
    assert "the gateway's port from the dev profile" in said, said
    assert "openclaw --dev gateway run" in said, said
    assert "check gateway.port" not in said, said


def test_the_dev_profile_is_woken_on_its_own_port(two_gateways: tuple[Path, int]) -> None:
    home, default_port = two_gateways
    dev = _sidecar_env(home, OPENCLAW_PROFILE="dev")
    url = _wake_url(dev)
    assert url == f"http://127.0.0.1:{DEV_PORT}/hooks"
    said = _doctor(dev)
    assert f"following OpenClaw's install at {home}/.openclaw-dev ($OPENCLAW_PROFILE (dev))" in (
        said
    ), said
    assert "the gateway's port from the running gateway's lock" in said, said
    assert f"the gateway's hooks at {url}/wake accept the token" in said, said
    # the default install, beside it, is still the default's
    default = _sidecar_env(home)
    assert _wake_url(default) == f"http://127.0.0.1:{default_port}/hooks"
    said = _doctor(default)
    assert f"following OpenClaw's install at {home}/.openclaw (the default)" in said, said
    assert f"hooks at http://127.0.0.1:{default_port}/hooks/wake accept the token" in said, said
    # and what the URL names answers as the gateway's hooks (400: an empty body, no wake)
    status, _ = http("POST", f"{url}/wake", {}, HOOKS_TOKEN)
    assert status == 400
