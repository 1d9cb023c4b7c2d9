"""The operator guide's paired-node example, run: a node with TLS on loopback, the gateway's
``[nodes.NAME]`` table with the pin the node logs, the node's sessions in the catalog,
adoption by catalog id, and a prompt typed on the node recorded at the next tick."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.doc_blocks import doc_block
from tests.helpers import REPO, served_address
from tests.test_cli import sw

GUIDE = REPO / "docs" / "operator-guide.md"
FIRST = (
    b'{"type":"user","uuid":"u1","cwd":"/w/billing",'
    b'"message":{"role":"user","content":"Fix the billing tests"}}\n'
)
TYPED = b'{"type":"user","uuid":"u2","message":{"role":"user","content":"and again"}}\n'


def test_the_paired_node_example_works_end_to_end(tmp_path: Path) -> None:
    block = doc_block("node")
    thread = "0b6e4c1a-1111-2222-3333-444455556666"
    workstation = tmp_path / "workstation"
    transcript = workstation / "projects" / "billing" / f"{thread}.jsonl"
    transcript.parent.mkdir(parents=True)
    transcript.write_bytes(FIRST)
    node_config = tmp_path / "node.toml"
    node_config.write_text(f'[roots]\nclaude = "{workstation / "projects"}"\n')
    token = tmp_path / "node-token"
    command = block.replace("127.0.0.1:8766", "127.0.0.1:0")  # any free port
    env = {**os.environ, "NODE_CONFIG": str(node_config), "NODE_TOKEN": str(token)}
    env["NODE_TLS"] = str(tmp_path / "node-tls.pem")
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    node = subprocess.Popen(
        ["bash", "-c", f"exec {command}"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        url = served_address(node)
        assert url.startswith("https://127.0.0.1:")
        assert node.stderr is not None
        pin = re.search(r'fingerprint = "(sha256:[0-9a-f]{64})"', node.stderr.readline())
        assert pin is not None
        assert 0o600 == (tmp_path / "node-tls.pem").stat().st_mode & 0o777
        gateway = tmp_path / "gateway.toml"
        gateway.write_text(
            f'[roots]\nclaude = "{tmp_path / "local"}"\n'
            f'[nodes.laptop]\nurl = "{url}"\ntoken_file = "{token}"\n'
            f'fingerprint = "{pin.group(1)}"\n'
        )
        db = tmp_path / "state.db"
        found = sw(db, "--config", str(gateway), "catalog", "--kind", "claude-node", "--json")
        [entry] = found["sessions"]
        assert ("claude-node", "laptop", thread) == (
            entry["kind"],
            entry["node"],
            entry["nativeId"],
        )
        assert "Fix the billing tests" == entry["title"]
        key = "agent:main:laptop"
        adopted = sw(
            db, "--config", str(gateway), "adopt", entry["catalogId"], "--session-key", key
        )
        assert adopted["declined"] is None
        sw(db, "watch", "--watcher", "agent:main:main", "--target", key)
        again = sw(db, "--config", str(gateway), "catalog", "--json", "--search", "billing")
        assert key == again["sessions"][0]["sessionKey"]
        with transcript.open("ab") as f:
            f.write(TYPED)
        sw(db, "--config", str(gateway), "tick")
        status = sw(db, "status", key, "--changes-since", "1")
        kinds = [e["kind"] for e in status["stateChanges"]["events"]]
        assert ["human_direct_message"] == kinds
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(timeout=30)
