"""``serve`` under libfaketime (Debian's ``faketime``): the wall clock stepped back an hour,
then forward two, while the monotonic clock runs on. Each notice is woken within the 20 s
window, as timed from outside: windows, quiet periods and retries run on the monotonic
clock; only what is stored is wall-clock."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hooks_gateway import HooksGateway
from tests.test_cli import sw

LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
MAIN = "agent:main:main"
WINDOW_S = 20
SLACK_S = 5  # a pass's claim, call and record on a loaded machine; an hour's step is 3,600


@pytest.mark.skipif(not Path(LIB).exists(), reason="libfaketime is not installed (faketime)")
async def test_a_wall_clock_step_back_or_forward_delays_no_wake_past_the_window(
    tmp_path: Path, hooks_gateway: HooksGateway
) -> None:
    gateway = hooks_gateway.config(tmp_path)
    config = tmp_path / "sw.toml"
    config.write_text(
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n'
        f'[gateway]\nhooks_url = "{gateway.hooks_url}"\n'
        f'hooks_token_file = "{gateway.hooks_token_file}"\n'
    )
    db = tmp_path / "state.db"
    offset = tmp_path / "faketime"
    offset.write_text("+0 x1\n")
    env = {
        **os.environ,
        "LD_PRELOAD": LIB,
        "FAKETIME_TIMESTAMP_FILE": str(offset),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # the step is the wall clock's alone
    }
    log = tmp_path / "serve.log"
    argv = [sys.executable, "-m", "monitor", "--db", str(db), "--config", str(config)]
    proc = subprocess.Popen([*argv, "serve"], env=env, stderr=log.open("w"))
    c = ("--config", str(config))
    try:
        while "serving" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            await asyncio.sleep(0.05)
        for peer in ("a", "b", "c"):
            sw(db, *c, "watch", "--watcher", MAIN, "--target", f"agent:main:subagent:{peer}")

        async def woken_after(peer: str) -> float:
            before = len(hooks_gateway.wakes)
            key = f"agent:main:subagent:{peer}"
            start = time.monotonic()
            sw(db, *c, "record", "--session", key, "--kind", "human_direct_message",
               "--actor", "human")  # fmt: skip
            while len(hooks_gateway.wakes) == before:
                assert time.monotonic() - start < 3 * WINDOW_S, log.read_text()
                await asyncio.sleep(0.05)
            return time.monotonic() - start

        assert await woken_after("a") < WINDOW_S  # at once
        # an hour back, right after the wake (FAKETIME_NO_CACHE: serve's next clock read
        # is stepped, nothing to wait for). Each next wake waits out the window from the
        # one before: the rest of it, plus the pass's own work, never an hour.
        offset.write_text("-3600 x1\n")
        assert await woken_after("b") <= WINDOW_S + SLACK_S, log.read_text()
        offset.write_text("+3600 x1\n")  # then two hours forward
        assert await woken_after("c") <= WINDOW_S + SLACK_S, log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert "Traceback" not in log.read_text()
