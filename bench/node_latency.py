"""A prompt typed on a paired node, to the wake at the gateway: per kind, over loopback with
TLS (a real ``sessionwatch node --tls``, its certificate pinned), against the same kind on
this machine in the same run and the same ``serve``. Target: each kind's p99 within 2x of
its local p99.

Each kind has one session on this machine and one on the node (Claude Code, Codex and Pi
transcripts appended to as the harnesses append; an OpenCode database written as OpenCode
writes it, tests/opencode_db.py), each watched by a watcher of its own. The samples take
turns: one write to one session, then the wait for its watcher's wake (the gateway is a
hooks API on loopback that answers as OpenClaw's does). Each sample has a watcher of its
own, as bench/opencode_wake.py does: a watcher woken twice within the coalescing window
(20 s) is woken again at its end, by design, which would measure the window. ``serve``
ticks only hourly here, so every local figure is file watching's early check and every
node figure is node watching's (the node's change feed).

Usage: python bench/node_latency.py [--samples 30]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.service import hooks_gateway, start_serve
from tests.opencode_db import OpenCodeDB

KINDS = ("claude", "codex", "pi", "opencode")
CODEX_ID = "019c0000-0000-7000-8000-00000000beef"
PI_ID = "3f2a"
CLAUDE_ID = "0b9c-41f2"
OPENCODE_ID = "ses_bench"


class Session:
    """One session of ``kind`` under ``root``: where it is, and how a person types into it."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.n = 0
        if kind == "opencode":
            self.db = OpenCodeDB(root / "opencode.db")
            self.db.session(OPENCODE_ID)
            self.db.prompt(OPENCODE_ID, "the first prompt")
            self.path, self.thread = root / "opencode.db", OPENCODE_ID
            return
        folder = root / kind / "2026" / "03" / "01" if kind == "codex" else root / kind / "p"
        folder.mkdir(parents=True)
        if kind == "claude":
            self.path, self.thread = folder / f"{CLAUDE_ID}.jsonl", CLAUDE_ID
        elif kind == "codex":
            self.path = folder / f"rollout-2026-03-01T10-00-00-{CODEX_ID}.jsonl"
            self.thread = CODEX_ID
            meta = {"id": CODEX_ID, "cwd": "/w", "cli_version": "0.98.0"}
            self._line({"type": "session_meta", "payload": meta})
        else:
            self.path, self.thread = folder / f"2026-03-01T10-00-00_{PI_ID}.jsonl", PI_ID
            self._line({"type": "session", "version": 3, "id": PI_ID, "timestamp": _ts()})
        self.type("the first prompt")

    def _line(self, record: dict[str, Any]) -> None:
        with self.path.open("ab") as f:
            f.write(orjson.dumps(record) + b"\n")

    def type(self, text: str) -> None:
        self.n += 1
        if self.kind == "opencode":
            self.db.prompt(OPENCODE_ID, text)
        elif self.kind == "claude":
            message = {"role": "user", "content": text}
            self._line(
                {"type": "user", "uuid": f"u{self.n}", "timestamp": _ts(), "message": message}
            )
        elif self.kind == "codex":
            payload = {"type": "user_message", "message": text, "images": []}
            self._line({"timestamp": _ts(), "type": "event_msg", "payload": payload})
        else:
            content = [{"type": "text", "text": text}]
            message = {"role": "user", "content": content, "timestamp": int(time.time() * 1000)}
            self._line(
                {"type": "message", "id": f"m{self.n}", "timestamp": _ts(), "message": message}
            )


def _ts() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def start_node(tmp: Path, node_root: Path) -> tuple[subprocess.Popen[str], str, str]:
    """``sessionwatch node --tls`` serving ``node_root``'s sessions: process, URL, pin."""
    config = tmp / "node.toml"
    config.write_text(
        f'[roots]\nclaude = "{node_root / "claude"}"\ncodex = "{node_root / "codex"}"\n'
        f'pi = "{node_root / "pi"}"\nopencode_db = "{node_root / "opencode.db"}"\n'
    )
    argv = [sys.executable, "-m", "monitor", "--config", str(config), "node"]
    argv += ["--listen", "127.0.0.1:0", "--token-file", str(tmp / "node.token")]
    argv += ["--tls", str(tmp / "node-tls.pem")]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    url = pin = None
    for line in proc.stderr:
        found = re.search(r"serving .* on (https://\S+)", line)
        url = found.group(1) if found else url
        pinned = re.search(r'fingerprint = "(sha256:[0-9a-f]{64})"', line)
        if pinned:
            pin = pinned.group(1)
            break
    if url is None or pin is None:
        raise RuntimeError("the node did not start")
    drain(proc)
    return proc, url, pin


def drain(proc: subprocess.Popen[str]) -> None:
    """Read what a process logs, so that a full pipe never stops it."""
    threading.Thread(target=lambda: [None for _ in proc.stderr or ()], daemon=True).start()


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(int(len(ordered) * 0.99) - 1, 0)]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    woken: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
    runner, hooks_url = await hooks_gateway(woken)
    figures: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        local, remote = tmp / "local", tmp / "node"
        sessions = {("local", k): Session(k, local) for k in KINDS}
        sessions |= {("node", k): Session(k, remote) for k in KINDS}
        node, url, pin = start_node(tmp, remote)
        more_roots = (
            f'codex = "{local / "codex"}"\npi = "{local / "pi"}"\n'
            f'opencode_db = "{local / "opencode.db"}"\n'
        )
        paired = (
            f'[nodes.laptop]\nurl = "{url}"\ntoken_file = "{tmp / "node.token"}"\n'
            f'fingerprint = "{pin}"\n'
        )
        (local / "claude").mkdir(exist_ok=True)
        serve, base, token = start_serve(local, hooks_url, more_roots=more_roots, more=paired)
        drain(serve)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        try:
            async with aiohttp.ClientSession(headers=headers) as http:
                for (where, kind), s in sessions.items():
                    key = f"agent:main:{where}-{kind}"
                    body: dict[str, Any] = {"sessionKey": key, "thread": s.thread}
                    if where == "node":
                        body |= {"kind": f"{kind}-node", "node": "laptop"}
                    else:
                        body |= {"kind": kind, "path": str(s.path)}
                    async with http.post(f"{base}/v1/links", data=orjson.dumps(body)) as r:
                        answer = await r.json()
                        assert r.status == 200 and answer["declined"] is None, answer
                await asyncio.sleep(2.0)  # file watching is armed on the new links
                for i in range(args.samples):
                    for (where, kind), s in sessions.items():
                        # a watcher of its own for each sample: a watcher woken twice within
                        # the coalescing window waits for its end, by design
                        watch = {"watcher": f"agent:w{i}-{where}-{kind}:main"}
                        watch["target"] = f"agent:main:{where}-{kind}"
                        async with http.post(f"{base}/v1/watches", data=orjson.dumps(watch)) as r:
                            assert r.status == 200, await r.text()
                        write = lambda s=s, i=i: s.type(f"typed {i}")  # noqa: E731
                        took = await sample(watch["watcher"], write, woken)
                        figures.setdefault((where, kind), []).append(took)
        finally:
            serve.terminate()
            node.terminate()
            serve.wait()
            node.wait()
            await runner.cleanup()
    worst = 0.0
    for kind in KINDS:
        here, there = figures[("local", kind)], figures[("node", kind)]
        ratio = p99(there) / p99(here)
        worst = max(worst, ratio)
        print(
            f"{kind:<9} local median {statistics.median(here) * 1000:5.0f} ms p99"
            f" {p99(here) * 1000:5.0f} ms | node over TLS median"
            f" {statistics.median(there) * 1000:5.0f} ms p99 {p99(there) * 1000:5.0f} ms"
            f" | p99 ratio {ratio:.2f}"
        )
    print(f"node over TLS / local, p99, worst kind: ratio {worst:.2f} (target <= 2.0)")
    return 0 if worst <= 2.0 else 1


async def sample(
    watcher: str, write: Callable[[], None], woken: asyncio.Queue[tuple[str, float]]
) -> float:
    await asyncio.sleep(0.3)  # the previous wake's acknowledgement settles
    while not woken.empty():
        woken.get_nowait()
    start = time.perf_counter()
    await asyncio.to_thread(write)
    while True:
        who, at = await asyncio.wait_for(woken.get(), 30)
        if who == watcher:
            return at - start


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
