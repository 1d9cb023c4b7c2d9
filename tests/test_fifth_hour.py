"""An hour of trying, fifth round: a full disk and an odd locale are ordinary weather. Each
point as an operator met it (``serve``, its API, the CLI), each failing without its fix.

The full disk is a real one: a tmpfs of a few hundred KiB, mounted by the test (root only;
CI runs as root), filled with a file and freed by removing it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.helpers import REPO, served_address
from tests.test_openclaw_files import serve_process

MAIN = "agent:main:main"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A file system of 512 KiB of its own, unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k,mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to its last byte; the file that fills it (remove it to free it)."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        for size in (65536, 4096, 1):  # to the last partial block
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)
    return filler


def env_on(disk: Path) -> dict[str, str]:
    home = disk / "home"
    home.mkdir(exist_ok=True)
    config = disk.parent / "sw.toml"  # outside the small disk: only where to listen
    config.write_text('[api]\nlisten = "127.0.0.1:0"\n')
    drop = ("SESSIONWATCH_", "OPENCLAW_")
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(drop)},
        "HOME": str(home),
        "SESSIONWATCH_CONFIG": str(config),
    }


def test_a_first_start_on_a_full_disk_says_so_in_one_line_and_leaves_nothing(
    small_disk: Path,
) -> None:
    env = env_on(small_disk)
    filler = fill(small_disk)
    done = subprocess.run(
        [sys.executable, "-m", "monitor", "serve"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 1 == done.returncode
    lines = done.stderr.strip().splitlines()
    assert 1 == len(lines) and "the disk is full" in lines[0], done.stderr
    assert "permission" not in lines[0].lower() and "writable" not in lines[0]
    state = Path(env["HOME"]) / ".local" / "state" / "sessionwatch"
    token = state / "token"
    assert not token.exists() or token.read_text().strip()  # never an empty token file
    filler.unlink()  # space is back: the next start runs, as if nothing had happened
    proc = serve_process(env)
    try:
        served_address(proc)
        assert len(token.read_text().strip()) >= 43
    finally:
        proc.terminate()
        proc.wait(30)


def test_an_empty_token_file_an_earlier_start_left_gets_a_new_token(tmp_path: Path) -> None:
    """What an earlier release left after a start on a full disk: serve writes a token in
    it, and says so, instead of refusing every start."""
    disk = tmp_path / "disk"
    disk.mkdir()
    env = env_on(disk)
    state = Path(env["HOME"]) / ".local" / "state" / "sessionwatch"
    state.mkdir(parents=True, mode=0o700)
    token = state / "token"
    token.touch(mode=0o600)
    proc = serve_process(env)
    said: list[str] = []
    try:
        served_address(proc, said)
    finally:
        proc.terminate()
        proc.wait(30)
    assert len(token.read_text().strip()) >= 43
    assert 1 == sum("was empty: wrote a new token" in line for line in said), said


def test_a_disk_that_fills_under_serve_is_said_once_and_heals(small_disk: Path) -> None:
    env = env_on(small_disk)
    proc = serve_process(env)
    try:
        base = served_address(proc)
        token = (Path(env["HOME"]) / ".local/state/sessionwatch/token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}

        def record(n: int) -> int:
            event = {
                "sessionKey": f"agent:main:dashboard:p{n}",
                "kind": "human_direct_message",
                "actorType": "human",
                "payload": {"channel": "api", "pad": uuid.uuid4().hex * 40},  # new pages
            }
            return requests.post(f"{base}/v1/events", json=event, headers=headers).status_code

        assert 200 == record(0)
        filler = fill(small_disk)
        answers = [record(n) for n in range(1, 41)]
        assert 503 in answers, answers
        filler.unlink()
        assert 200 == record(41)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.stderr is not None
        log = proc.stderr.read()
        proc.wait(30)
    assert "Traceback" not in log
    assert 1 == log.count("the state database refuses requests"), log
    assert 1 == log.count("the state database takes requests again"), log
