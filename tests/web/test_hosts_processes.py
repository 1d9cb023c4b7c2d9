"""Two ``sessionwatch serve`` processes (hosts ``a`` and ``b``) and the CLI on one real
PostgreSQL: a notice the CLI opens reaches B's stream, and when the process holding the
shared lease is killed with SIGKILL, the other takes the lease over within one tick
interval."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.helpers import PgServer, notice, pg_database, served_address
from tests.opencode_db import OpenCodeDB
from tests.test_cli import sw
from tests.web.test_stream import follow_hears_a_record

MAIN = "agent:main:main"
CHILD = "agent:main:subagent:c1"
INTERVAL_S = 2


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    return pg_database(pg_server)


def config_for(tmp_path: Path, host: str) -> Path:
    """Host ``host``'s configuration: its own Claude root, the machine's one OpenCode
    database (a source without a host: whoever holds the shared lease ticks it)."""
    home = tmp_path / host
    (home / "claude").mkdir(parents=True)
    path = home / "sessionwatch.toml"
    path.write_text(
        f'[host]\nid = "{host}"\n'
        f'[roots]\nclaude = "{home / "claude"}"\nopencode_db = "{tmp_path / "opencode.db"}"\n'
        f"[monitor]\ninterval_s = {INTERVAL_S}\ninitial_delay_s = 0\nwatch_files = false\n"
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{home / "token"}"\n'
    )
    return path


@pytest.fixture
def sidecars(pg_url: str, tmp_path: Path) -> Iterator[dict[str, tuple[subprocess.Popen[str], str]]]:
    started: dict[str, tuple[subprocess.Popen[str], str]] = {}
    try:
        for host in ("a", "b"):
            config = config_for(tmp_path, host)
            proc = subprocess.Popen(
                [sys.executable, "-m", "monitor", "--db", pg_url, "--config", str(config), "serve"],
                stderr=subprocess.PIPE,
                text=True,
            )
            started[host] = (proc, served_address(proc))
        yield started
    finally:
        for proc, _ in started.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


def get(base: str, path: str, token: str) -> bytes:
    request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body: bytes = response.read()
        return body


def holds_lease(base: str, token: str) -> bool:
    metrics = get(base, "/metrics", token).decode()
    return "sessionwatch_shared_lease 1.0" in metrics


def test_a_cli_notice_reaches_the_other_sidecars_stream(
    pg_url: str, tmp_path: Path, sidecars: dict[str, tuple[subprocess.Popen[str], str]]
) -> None:
    _, base = sidecars["b"]
    token = (tmp_path / "b" / "token").read_text().strip()
    sw(pg_url, "spawn", "--parent", MAIN, "--child", CHILD, "--run-id", "r")
    request = urllib.request.Request(
        f"{base}/v1/watchers/{MAIN}/notices/stream", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as stream:
        sw(pg_url, "record", "--session", CHILD, "--kind", "goal_changed", "--actor", "agent")
        for raw in stream:
            line = raw.decode()
            if line.startswith("data: "):
                assert {"target": CHILD, "text": notice(CHILD, 1)} == orjson.loads(line[6:])
                break


def test_the_shared_lease_moves_when_its_holder_is_killed(
    pg_url: str, tmp_path: Path, sidecars: dict[str, tuple[subprocess.Popen[str], str]]
) -> None:
    """An OpenCode session (no host) is ticked by the lease holder; after SIGKILL the other
    sidecar takes the lease and records the next prompt, once, typed as the holder died:
    gaining the lease is a change (OwnershipChanged) that ticks at once, where the release
    before left the new holder's scheduled ticks out for ten intervals (20 s here)."""
    oc = OpenCodeDB(tmp_path / "opencode.db")
    oc.session("ses_1")
    oc.prompt("ses_1", "before adoption")
    key = "agent:main:adopted:oc"
    config = str(tmp_path / "a" / "sessionwatch.toml")
    sw(
        pg_url,
        "--config",
        config,
        "adopt",
        "--kind",
        "opencode",
        "--path",
        str(oc.path),
        "--thread",
        "ses_1",
        "--session-key",
        key,
        "--session-id",
        "s1",
    )
    sw(pg_url, "watch", "--watcher", MAIN, "--target", key)
    tokens = {h: (tmp_path / h / "token").read_text().strip() for h in sidecars}
    deadline = time.monotonic() + 30
    holders: list[str] = []
    while time.monotonic() < deadline:
        holders = [h for h, (_, base) in sidecars.items() if holds_lease(base, tokens[h])]
        if holders:
            break
        time.sleep(0.2)
    assert 1 == len(holders), holders
    (holder,) = holders
    other = "b" if holder == "a" else "a"
    sidecars[holder][0].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    oc.prompt("ses_1", "typed as the holder died")
    while not holds_lease(sidecars[other][1], tokens[other]):
        assert time.monotonic() - killed_at < 30, "the lease was never taken over"
        time.sleep(0.1)
    deadline = time.monotonic() + 30
    while True:
        status = sw(pg_url, "status", key, "--changes-since", "0")
        assert isinstance(status, dict)
        kinds = [e["kind"] for e in status["stateChanges"]["events"]]
        if "human_direct_message" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    recorded_after = time.monotonic() - killed_at
    assert ["adopted", "human_direct_message"] == kinds
    # the promise is two intervals (4 s: half an interval's lease, a renewal, a tick at
    # once); a loaded machine is given as many again, still half of the old 20 s
    assert recorded_after < 4 * INTERVAL_S + 2, recorded_after
    print(f"the prompt typed as the holder died was recorded {recorded_after:.1f} s after")


def test_notices_follow_hears_another_process_on_postgresql(pg_url: str) -> None:
    follow_hears_a_record(pg_url)
