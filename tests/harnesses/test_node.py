"""Every real harness on a paired node over TLS: a real ``sessionwatch node`` serves what
Claude Code, Codex, OpenCode and Pi write; a real ``serve`` adopts each session from the
node's catalog, records each prompt typed through the real CLI once, and wakes the gateway
stand-in; the node is stopped and started again mid-session, and nothing is lost."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.harnesses.harnesses import KINDS, MAIN, Harness, Sidecar, why_not_runnable
from tests.helpers import REPO, served_address, until
from tests.hooks_gateway import running_hooks_gateway
from tests.interop import skip_unless_runnable
from tests.interop.gateway_rig import MockModelProcess

PROMPTS = ("start the billing fix", "typed while the node serves", "typed while it is down")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class NodeProcess:
    """``sessionwatch node --tls`` on a fixed port, serving the harness's root."""

    def __init__(self, work: Path, harness: Harness) -> None:
        key, root = harness.root()
        self.config = work / "node.toml"
        self.config.write_text(f'[roots]\n{key} = "{root}"\n')
        self.token = work / "node.token"
        self.pem = work / "node-tls.pem"
        self.port = free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.said: list[str] = []

    def start(self) -> tuple[str, str]:
        """Its address and the fingerprint it logs."""
        argv = [sys.executable, "-m", "monitor", "--config", str(self.config), "node"]
        argv += ["--listen", f"127.0.0.1:{self.port}", "--token-file", str(self.token)]
        argv += ["--tls", str(self.pem)]
        self.proc = subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE, text=True)
        url = served_address(self.proc, self.said)
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()
        self.said.append(line)
        found = re.search(r'fingerprint = "(sha256:[0-9a-f]{64})"', line)
        assert found, self.said
        threading.Thread(
            target=lambda: self.said.extend(self.proc.stderr or ()), daemon=True
        ).start()
        return url, found.group(1)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            assert 0 == self.proc.wait(30)
            self.proc = None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_harness_on_a_node_over_tls_is_adopted_recorded_and_woken(
    kind: str, model: MockModelProcess, tmp_path: Path
) -> None:
    skip_unless_runnable(why_not_runnable(kind))
    harness = Harness(kind, tmp_path / kind, model)
    await asyncio.to_thread(harness.prompt, PROMPTS[0])
    node = NodeProcess(tmp_path, harness)
    url, pin = node.start()
    sw = Sidecar(tmp_path, harness)
    async with running_hooks_gateway() as gw:
        hooks = gw.config(tmp_path)
        sw.config.write_text(
            f'[nodes.laptop]\nurl = "{url}"\ntoken_file = "{node.token}"\nfingerprint = "{pin}"\n'
            f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "api.token"}"\n'
            "[monitor]\ninitial_delay_s = 0\ninterval_s = 5\n"  # node watching records
            f'[gateway]\nhooks_url = "{hooks.hooks_url}"\n'
            f'hooks_token_file = "{hooks.hooks_token_file}"\n'
        )
        argv = [sys.executable, "-m", "monitor", "--db", str(sw.db), "--config", str(sw.config)]
        doctor = subprocess.run([*argv, "doctor"], cwd=REPO, capture_output=True, text=True)
        assert "certificate pin holds" in doctor.stdout, doctor.stdout + doctor.stderr
        key = f"agent:main:node:{kind}"
        entry = await asyncio.to_thread(sw.adopt, f"{kind}-node", key)
        assert ("laptop", f"{kind}-node") == (entry["node"], entry["kind"])
        serve = subprocess.Popen([*argv, "serve"], cwd=REPO, stderr=subprocess.PIPE, text=True)
        try:
            await asyncio.to_thread(served_address, serve)
            await asyncio.to_thread(harness.prompt, PROMPTS[1])
            await until("the prompt recorded", lambda: sw.human_turns(key) == 1, timeout=60)
            await until("the gateway woken", lambda: any(key in t for t in gw.texts), timeout=60)
            node.stop()  # the laptop sleeps; the person types into the harness anyway
            await asyncio.to_thread(harness.prompt, PROMPTS[2])

            def link() -> dict[str, Any]:
                (found,) = [x for x in sw("links")["links"] if x["sessionKey"] == key]
                return dict(found)

            def unreachable() -> bool:  # at the ticks against a node that is not there:
                # inconclusive, never quiet; a check in flight as the node went away says
                # "Server disconnected", the ticks after it cannot connect
                status = link()["status"] or {}
                reason = str(status.get("reason"))
                return status.get("outcome") == "inconclusive" and "cannot connect" in reason

            await until("the link inconclusive while the node is down", unreachable, 60)
            assert 1 == sw.human_turns(key)
            node.start()
            await until("the prompt typed while down", lambda: sw.human_turns(key) == 2, 60)
            await until("woken again", lambda: len([t for t in gw.texts if key in t]) >= 2, 60)
        finally:
            serve.terminate()
            serve.wait(30)
            node.stop()
    assert 2 == sw.human_turns(key), f"{kind} {harness.version}: each prompt once"
    assert all(w["sessionKey"] == MAIN for w in gw.wakes), gw.wakes
