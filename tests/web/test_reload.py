"""``SIGHUP`` reads the configuration again: roots, nodes and the gateway's hooks apply
live; the store, the listen address and the like are named as needing a restart; a bad file
is refused and the one in force stays."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.helpers import REPO, served_address, user_line


@contextlib.contextmanager
def serving(tmp_path: Path, config: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    """``serve`` on ``config`` (its database in ``tmp_path``): the process, the address it
    named, and the file its log goes to; terminated at the end of the block."""
    log = tmp_path / "serve.log"
    argv = [sys.executable, "-m", "monitor", "--db", str(tmp_path / "s.db"), "--config"]
    proc = subprocess.Popen(
        [*argv, str(config), "serve"], cwd=REPO, stderr=subprocess.PIPE, text=True
    )
    drain = None
    try:
        base = served_address(proc)
        assert proc.stderr is not None
        drain = subprocess.Popen(["cat"], stdin=proc.stderr, stdout=log.open("w"))
        yield proc, base, log
    finally:
        proc.terminate()
        proc.wait(30)
        if drain is not None:
            drain.wait(10)


def get(base: str, path: str, tmp_path: Path) -> bytes:
    token = (tmp_path / "token").read_text().strip()
    request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        body: bytes = resp.read()
        return body


def lines_of(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def wait_for_line(log: Path, text: str, timeout: float = 20, *, after: int = 0) -> str:
    """The last line with ``text`` among those after the first ``after`` lines: what a
    reload said, not what an earlier one did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [line for line in log.read_text().splitlines()[after:] if text in line]
        if lines:
            return lines[-1]
        time.sleep(0.05)
    raise AssertionError(f"no log line with {text!r}:\n{log.read_text()}")


def test_sighup_reloads_roots_and_names_what_needs_a_restart(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for root in (first, second):
        (root / "p").mkdir(parents=True)
    (second / "p" / "s.jsonl").write_bytes(user_line("a session in the second root"))
    config = tmp_path / "sw.toml"

    def write(root: Path, listen: str = "127.0.0.1:0", level: str = "info") -> None:
        config.write_text(
            f'[roots]\nclaude = "{root}"\n'
            f'[api]\nlisten = "{listen}"\ntoken_file = "{tmp_path / "token"}"\n'
            f'[monitor]\ninitial_delay_s = 3600\n[log]\nlevel = "{level}"\n'
        )

    write(first)
    argv = [sys.executable, "-m", "monitor", "--db", str(tmp_path / "s.db"), "--config"]
    with serving(tmp_path, config) as (proc, base, log):

        def catalog() -> list[str]:
            found = json.loads(get(base, "/v1/catalog", tmp_path))
            return [s["title"] for s in found["sessions"]]

        assert [] == catalog()
        write(second, listen="127.0.0.1:1", level="warning")
        said = lines_of(log)
        proc.send_signal(signal.SIGHUP)
        reloaded = wait_for_line(log, "configuration reloaded", after=said)
        assert "roots.claude, log.level changed and applied" in reloaded
        assert "api.listen changed but apply only at a restart" in wait_for_line(
            log, "restart", after=said
        )
        assert ["a session in the second root"] == catalog()  # the same listener, new roots
        opened = subprocess.run(
            [*argv, str(config), "open"], cwd=REPO, capture_output=True, text=True, check=False
        )  # the reload asked for port 1; open finds the port serve still listens on
        assert opened.stdout.startswith(base + "/ui/login?ticket="), opened.stderr
        write(second, level="info")  # back to info: said, at info
        said = lines_of(log)
        proc.send_signal(signal.SIGHUP)
        assert "log.level changed and applied" in wait_for_line(
            log, "log.level changed", after=said
        )
        config.write_text("[roots\n")
        said = lines_of(log)
        proc.send_signal(signal.SIGHUP)
        not_reloaded = wait_for_line(log, "configuration not reloaded", after=said)
        assert "not valid TOML" in not_reloaded
        assert ["a session in the second root"] == catalog()  # the one in force stays


def test_a_hooks_token_file_made_public_is_said_at_reload(tmp_path: Path) -> None:
    token = tmp_path / "hooks-token"
    token.write_text("secret\n")
    token.chmod(0o600)
    config = tmp_path / "sw.toml"
    config.write_text(
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n'
        f'[monitor]\ninitial_delay_s = 3600\n[gateway]\nhooks_url = "http://127.0.0.1:9/hooks"\n'
        f'hooks_token_file = "{token}"\n'
    )
    with serving(tmp_path, config) as (proc, _, log):
        token.chmod(0o644)
        proc.send_signal(signal.SIGHUP)
        line = wait_for_line(log, "hooks token file")
        assert "readable by others" in line and "serve refuses it at start" in line


def test_a_reloaded_interval_applies_from_the_next_tick(tmp_path: Path) -> None:
    """An hourly tick reloaded to every second: the next tick comes a second after the
    last, not when the hour in course runs out."""
    config = tmp_path / "sw.toml"

    def write(interval: float) -> None:
        config.write_text(
            f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n'
            f"[monitor]\ninitial_delay_s = 0\ninterval_s = {interval}\n"
        )

    write(3600)
    with serving(tmp_path, config) as (proc, base, log):

        def ticks() -> float:
            for line in get(base, "/metrics", tmp_path).decode().splitlines():
                if line.startswith("sessionwatch_ticks_total "):
                    return float(line.split()[1])
            return 0.0

        deadline = time.monotonic() + 20
        while ticks() < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 1 == ticks()  # the first, at start; the next is an hour away
        write(1)
        proc.send_signal(signal.SIGHUP)
        assert "1 s, from the next tick" in wait_for_line(log, "interval is now")
        deadline = time.monotonic() + 20
        while ticks() < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ticks() >= 3
        assert "restart" not in log.read_text()  # the interval alone: nothing else to say


def test_sighup_reads_the_file_the_environment_names_when_no_config_is_given(
    tmp_path: Path,
) -> None:
    """``serve`` without ``--config``, on ``$SESSIONWATCH_CONFIG``: a SIGHUP reads that file
    again (and ends nothing: SIGHUP's default would end the process)."""
    import os

    config = tmp_path / "sw.toml"
    config.write_text(
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n'
        "[monitor]\ninitial_delay_s = 3600\n"
    )
    log = tmp_path / "serve.log"
    env = {**os.environ, "SESSIONWATCH_CONFIG": str(config)}
    argv = [sys.executable, "-m", "monitor", "--db", str(tmp_path / "s.db"), "serve"]
    proc = subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE, text=True, env=env)
    drain = None
    try:
        served_address(proc)
        assert proc.stderr is not None
        drain = subprocess.Popen(["cat"], stdin=proc.stderr, stdout=log.open("w"))
        proc.send_signal(signal.SIGHUP)
        assert "nothing changed" in wait_for_line(log, "configuration reloaded")
        assert proc.poll() is None
    finally:
        proc.terminate()
        assert 0 == proc.wait(30)
        if drain is not None:
            drain.wait(10)
