"""A gateway-adopted Codex thread (a ``codex-app-server`` link): from a prompt typed into
the real Codex app-server to the wake call at the gateway, against an append to a Claude
transcript (the baseline) in the same run and the same ``serve``. Target: p99 under 250 ms.

Codex 0.171.0 runs on the mock model (tests/interop/install.sh installs it). The link row is
written into serve's database as the gateway writes it, on the thread's current turn. Each
sample also times the floor Codex itself sets: when the prompt is in the rollout, and when
the app-server's listing (its projection) shows it; the sidecar moves the gateway's marker
only to a turn the listing shows, so that the gateway's own check always finds it.
``serve`` ticks only hourly here, so every figure is the early check's.

Usage: python bench/codex_wake.py [--samples 30]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.opencode_wake import CLAUDE_LINE, sample
from bench.service import hooks_gateway, start_serve
from tests.harnesses.drivers import CodexAppServer, text_input
from tests.harnesses.harnesses import Harness, why_not_runnable
from tests.interop.gateway_rig import MockModelProcess

KEY = "agent:main:codex-adopted"


class Floor:
    """Watches, from a thread of its own, when a turn's prompt is in the rollout and when
    the projection has taken it."""

    def __init__(self, home: Path, thread: str) -> None:
        self.home = home
        self.thread = thread

    def when(self, path: Path, ordinal_after: int, text: str) -> tuple[float, float]:
        written = projected = 0.0
        needle = text.encode()
        deadline = time.perf_counter() + 30
        while (not written or not projected) and time.perf_counter() < deadline:
            if not written and needle in path.read_bytes():
                written = time.perf_counter()
            if not projected and self.projected() > ordinal_after and written:
                projected = time.perf_counter()
            time.sleep(0.002)
        return written, projected

    def projected(self) -> int:
        conn = sqlite3.connect(f"file:{self.home / 'thread_history_1.sqlite'}?mode=ro", uri=True)
        try:
            row = conn.execute(
                "SELECT next_rollout_ordinal FROM thread_history_projection_state"
                " WHERE thread_id = ?",
                (self.thread,),
            ).fetchone()
        finally:
            conn.close()
        return int(row[0]) if row else 0


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(int(len(ordered) * 0.99) - 1, 0)]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    why = why_not_runnable("codex")
    if why:
        raise SystemExit(why)
    woken: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
    runner, hooks_url = await hooks_gateway(woken)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "model").mkdir()
        model = MockModelProcess(tmp / "model")
        harness = Harness("codex", tmp / "codex", model)
        codex = CodexAppServer(harness)
        home = harness.work / "codex-home"
        (tmp / "claude" / "p").mkdir(parents=True)
        transcript = tmp / "claude" / "p" / "s.jsonl"
        transcript.write_bytes(CLAUDE_LINE % (0, 0))
        figures: dict[str, list[float]] = {"codex": [], "claude": [], "rollout": [], "listed": []}
        proc = None
        try:
            codex.turn("the first prompt")
            thread = codex.thread
            (rollout,) = home.rglob(f"rollout-*{thread}.jsonl")
            listed = codex.turns_listed(thread)
            proc, base, token = start_serve(
                tmp, hooks_url, more_roots=f'codex = "{home / "sessions"}"\n'
            )
            write_link(tmp / "state.db", thread, listed[0][0])
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            async with aiohttp.ClientSession(headers=headers) as http:
                body = {"kind": "claude", "path": str(transcript), "sessionKey": "agent:main:cl"}
                async with http.post(f"{base}/v1/links", data=orjson.dumps(body)) as r:
                    assert r.status == 200, await r.text()
                await asyncio.sleep(1.5)  # the links' files are watched
                floor = Floor(home, thread)
                for i in range(1, args.samples + 1):
                    text = f"typed {i}"
                    ordinal = floor.projected()
                    seen: dict[str, tuple[float, float]] = {}

                    def type_prompt(
                        text: str = text,
                        ordinal: int = ordinal,
                        seen: dict[str, tuple[float, float]] = seen,
                    ) -> None:
                        seen["start"] = (time.perf_counter(), 0.0)
                        watcher = threading.Thread(
                            target=lambda: seen.update(at=floor.when(rollout, ordinal, text))
                        )
                        watcher.start()
                        since = codex.mark()
                        codex.call("turn/start", threadId=thread, input=text_input(text))
                        assert "completed" == codex.completed(since)
                        watcher.join()

                    figures["codex"].append(
                        await sample(http, base, KEY, f"agent:wc{i}:main", type_prompt, woken)
                    )
                    start = seen["start"][0]
                    written, projected = seen["at"]
                    figures["rollout"].append(written - start)
                    figures["listed"].append(projected - start)

                    def append(i: int = i) -> None:
                        with transcript.open("ab") as f:
                            f.write(CLAUDE_LINE % (i, i))

                    figures["claude"].append(
                        await sample(
                            http, base, "agent:main:cl", f"agent:wl{i}:main", append, woken
                        )
                    )
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait()
            codex.close()
            model.stop()
            await runner.cleanup()
    for name, label in (
        ("rollout", "typed to rollout (Codex)"),
        ("listed", "typed to listed (Codex's projection)"),
        ("codex", "typed to wake (codex-app-server)"),
        ("claude", "append to wake (claude, baseline)"),
    ):
        values = figures[name]
        print(
            f"{label:<40} {len(values)} samples: median"
            f" {statistics.median(values) * 1000:.0f} ms, p99 {p99(values) * 1000:.0f} ms"
        )
    ours = p99(figures["codex"]) - p99(figures["listed"])
    print(
        f"codex p99 / claude p99: {p99(figures['codex']) / p99(figures['claude']):.2f};"
        f" above Codex's own listing: {ours * 1000:.0f} ms at p99"
        f" (target: p99 < 250 ms: {'met' if p99(figures['codex']) < 0.25 else 'NOT met'})"
    )


def write_link(db: Path, thread: str, turn: str) -> None:
    """The link as the gateway's Codex plugin writes it at adoption, and a watch of it."""
    ref = {"connectionFingerprint": "bench", "threadId": thread}
    marker = {"turnId": turn, "userMessageCount": 1}
    now = int(time.time() * 1000)
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO session_upstream_links VALUES (?, 'main', 'codex', 'gateway:local', ?,"
            " 'codex-app-server', ?, ?, NULL, ?, ?)",
            (KEY, thread, orjson.dumps(ref).decode(), orjson.dumps(marker).decode(), now, now),
        )


if __name__ == "__main__":
    asyncio.run(main())
