"""An hour of trying, fifth round: a full disk and an odd locale are ordinary weather. Each
point as an operator met it (``serve``, its API, the CLI), each failing without its fix.

The full disk is a real one: a tmpfs of a few hundred KiB, mounted by the test (root only;
CI runs as root), filled with a file and freed by removing it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
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


def test_the_cli_prints_on_a_latin_1_terminal(tmp_path: Path) -> None:
    """``catalog`` (its "…" cut, a CJK title) and ``doctor`` on a terminal that takes
    Latin-1 only: what it cannot show is replaced, nothing dies of a UnicodeEncodeError."""
    root = tmp_path / "claude" / "p"
    root.mkdir(parents=True)
    title = "Réparer les tests — 修复测试 🚀 " + "and a title long enough to be cut " * 3
    line = {"type": "user", "uuid": "u1", "cwd": "/srv/b",
            "message": {"role": "user", "content": title}}  # fmt: skip
    (root / "s1.jsonl").write_text(json.dumps(line) + "\n")
    ascii_line = {**line, "message": {"role": "user", "content": "an ascii title " * 9}}
    (root / "s2.jsonl").write_text(json.dumps(ascii_line) + "\n")
    config = tmp_path / "sw.toml"
    config.write_text(f'[roots]\nclaude = "{tmp_path / "claude"}"\n')
    env = {**os.environ, "PYTHONIOENCODING": "latin-1", "HOME": str(tmp_path)}
    for command in (["catalog"], ["doctor"]):
        done = subprocess.run(
            [sys.executable, "-m", "monitor", "--config", str(config), *command],
            cwd=REPO, env=env, capture_output=True, check=False, timeout=60,
        )  # fmt: skip
        assert b"Traceback" not in done.stderr and b"UnicodeEncodeError" not in done.stderr
        assert done.returncode in (0, 1), done.stderr
        shown = done.stdout.decode("latin-1")
        if command == ["catalog"]:
            assert "Réparer les tests ? ????" in shown and "2 sessions" in shown, shown
            assert 2 == shown.count("?  /srv/b"), shown  # each "…" cut, replaced


def test_a_typo_in_openclaw_json_keeps_the_last_good_hooks_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from monitor.openclaw.files import Hooks, locate

    config = tmp_path / "openclaw.json"
    good = '{gateway: {port: 18800}, hooks: {enabled: true, token: "t0k3n-long-enough"}}'
    config.write_text(good)
    env = {"HOME": str(tmp_path), "OPENCLAW_CONFIG_PATH": str(config)}
    hooks = Hooks(locate(env), env)
    before = hooks.current()
    assert ("http://127.0.0.1:18800/hooks", "t0k3n-long-enough") == before
    seen = hooks.seen
    config.write_text(good.replace("port: 18800}", "port: 18800"))  # a brace lost
    for _ in range(3):
        assert before == hooks.current()  # as the running gateway keeps its last good one
    assert seen != hooks.seen  # a refusal that this version may heal is checked again
    assert 1 == caplog.text.count("is not JSON5"), caplog.text
    config.write_text(good.replace("18800", "18801"))
    assert "http://127.0.0.1:18801/hooks" == hooks.current()[0]
    assert 1 == caplog.text.count("parses again")


def test_the_version_is_written_in_one_place() -> None:
    """``--version``, the API document and the status page (``VERSION``) and the installed
    package's metadata all read ``monitor.__version__``; pyproject.toml names no other."""
    import tomllib
    from importlib.metadata import version

    from monitor import __version__
    from monitor.web.openapi import VERSION

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    done = subprocess.run(
        [sys.executable, "-m", "monitor", "--version"],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert f"sessionwatch {__version__}" == done.stdout.strip()
    assert __version__ == VERSION == version("sessionwatch")


def test_the_wake_metric_names_every_result_it_counts() -> None:
    from monitor.metrics import Metrics

    (family,) = [m for m in Metrics().registry.collect() if m.name == "sessionwatch_wake_calls"]
    for result in ("accepted", "refused", "unauthorized", "throttled", "redirected",
                   "no_token", "failed", "unanswered"):  # fmt: skip
        assert result in family.documentation, result
    assert "timeout" not in family.documentation.split("failed")[1].split("unanswered")[0]


def test_serve_help_says_where_it_listens_and_how_its_database_is_chosen() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "monitor", "serve", "--help"],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    for said in ("--db", "$SESSIONWATCH_DB", "[store] path", "OpenClaw", "127.0.0.1:8765",
                 "token_file", "SIGHUP"):  # fmt: skip
        assert said in done.stdout, said


def test_serve_says_once_that_it_watches_a_session_adopted_and_watched_while_it_ran(
    tmp_path: Path,
) -> None:
    root = tmp_path / "claude" / "p"
    root.mkdir(parents=True)
    line = {"type": "user", "uuid": "u1", "cwd": "/srv/b",
            "message": {"role": "user", "content": "fix the tests"}}  # fmt: skip
    transcript = root / "s1.jsonl"
    transcript.write_text(json.dumps(line) + "\n")
    config = tmp_path / "sw.toml"
    config.write_text(
        f'[roots]\nclaude = "{tmp_path / "claude"}"\n'
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n'
    )
    env = {**os.environ, "SESSIONWATCH_CONFIG": str(config),
           "SESSIONWATCH_DB": str(tmp_path / "state.db")}  # fmt: skip
    proc = serve_process(env)
    said: list[str] = []
    try:
        served_address(proc, said)
        subprocess.run(
            [sys.executable, "-m", "monitor", "adopt", "--kind", "claude", "--path",
             str(transcript), "--session-key", "agent:main:billing"],
            cwd=REPO, env=env, capture_output=True, check=True, timeout=60,
        )  # fmt: skip
        subprocess.run(
            [sys.executable, "-m", "monitor", "watch", "--watcher", MAIN, "--target",
             "agent:main:billing"],
            cwd=REPO, env=env, capture_output=True, check=True, timeout=60,
        )  # fmt: skip
        assert proc.stderr is not None
        guard = threading.Timer(30, proc.terminate)  # never said: the pipe ends, it fails
        guard.start()
        for line_said in proc.stderr:
            said.append(line_said)
            if "now watching" in line_said:
                break
        guard.cancel()
    finally:
        proc.terminate()
        proc.wait(30)
    (watching,) = [s for s in said if "now watching" in s]
    assert "agent:main:billing" in watching and str(transcript) in watching
