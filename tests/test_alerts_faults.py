"""Every shipped alert is proven by a run (tests/alerts_rig.py): the faults of a node, the
gateway and the store, each driving a real ``serve`` at its defaults into its rule."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.alerts_rig import (
    KEY,
    LINE,
    MAIN,
    REPO,
    UNLESS_RUNNABLE,
    Rig,
    fired,
    free_port,
)
from tests.helpers import refuse_event_inserts, refusing_gateway, served_address

pytestmark = UNLESS_RUNNABLE


def test_node_unreachable_fires_when_a_paired_node_stops_answering(tmp_path: Path) -> None:
    node_root = tmp_path / "laptop" / "claude"
    (node_root / "p").mkdir(parents=True)
    (node_root / "p" / "n1.jsonl").write_bytes(LINE)
    token = tmp_path / "node.token"
    token.write_text("node-secret-" + "0" * 20 + "\n")
    token.chmod(0o600)
    port = free_port()
    node_env = {**Rig(tmp_path / "node").env}
    (tmp_path / "node" / "sw.toml").write_text(f'[roots]\nclaude = "{node_root}"\n')
    node = subprocess.Popen(
        [sys.executable, "-m", "monitor", "node", "--listen", f"127.0.0.1:{port}",
         "--token-file", str(token)],
        cwd=REPO, env=node_env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        served_address(node)
        rig = Rig(tmp_path / "sidecar")
        rig.extra = f'[nodes.laptop]\nurl = "http://127.0.0.1:{port}"\ntoken_file = "{token}"\n'
        rig.write_config()
        rig.cli("adopt", "--kind", "claude-node", "--path", "laptop", "--thread", "n1",
                "--session-key", KEY)  # fmt: skip
        rig.cli("watch", "--watcher", MAIN, "--target", KEY)
    finally:
        node.send_signal(signal.SIGTERM)  # the laptop sleeps
        node.wait(30)
    with rig.serving() as scraper:
        scraper.minutes(16)
    alerts = fired(scraper.scrapes, "SessionwatchNodeUnreachable")
    assert alerts == [
        {"alertname": "SessionwatchNodeUnreachable", "instance": "run", "severity": "warning"}
    ]


def test_wakes_failing_fires_when_the_gateway_refuses_every_wake(tmp_path: Path) -> None:
    refusing = refusing_gateway()
    try:
        hooks_token = tmp_path / "hooks.token"
        hooks_token.write_text("wrong-token-" + "0" * 20 + "\n")
        hooks_token.chmod(0o600)
        rig = Rig(tmp_path)
        rig.extra = (
            f'[gateway]\nhooks_url = "http://127.0.0.1:{refusing.server_port}/hooks"\n'
            f'hooks_token_file = "{hooks_token}"\n'
        )
        rig.write_config()
        rig.adopt_and_watch()

        with rig.serving() as scraper:
            scraper.minutes(24, rig.type)
    finally:
        refusing.shutdown()
    assert fired(scraper.scrapes, "SessionwatchWakesFailing") == [
        {"alertname": "SessionwatchWakesFailing", "instance": "run", "severity": "critical"}
    ]


def test_store_refusing_fires_while_the_database_refuses_writes(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.adopt_and_watch()
    conn = sqlite3.connect(tmp_path / "state.db")
    refuse_event_inserts(conn)  # every write refused, as on a full disk
    conn.close()

    with rig.serving() as scraper:
        scraper.minutes(12, rig.type)
    assert fired(scraper.scrapes, "SessionwatchStoreRefusing") == [
        {"alertname": "SessionwatchStoreRefusing", "instance": "run", "severity": "critical"}
    ]
