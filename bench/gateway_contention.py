"""Two real processes on one SQLite file: how long the sidecar's writes wait while the real
OpenClaw gateway writes to the same database.

It starts a mock model, ``openclaw gateway run`` in a scratch state directory and
``sessionwatch serve`` on the gateway's own database (both from tests/interop, which
``tests/interop/install.sh`` installs). The sidecar then records ``--events`` events through
``POST /v1/events``, one client at ``--rate`` per second, twice: with the gateway idle (the
baseline) and while the gateway runs agent turns back to back (``POST /hooks/agent`` into a
session, ``--turns`` at a time, each writing its session and transcript to the same file),
and records events of its own (its ``agent`` method, called through its CLI in a loop,
records a ``human_direct_message`` in a watched session). It prints the latency of
the sidecar's writes in both phases and their ratio, the gateway events written meanwhile,
and the lock errors either side logged (there must be none).

Usage: SESSIONWATCH_INTEROP_DIR=DIR python bench/gateway_contention.py [--events 400]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.interop import NODE, OPENCLAW
from tests.interop.gateway_rig import Gateway, MockModelProcess, Sidecar, why_not_runnable

PEER = "agent:main:dashboard:load"
TARGET = "agent:main:dashboard:recorded"


async def record(sidecar: Sidecar, n: int, rate: float, tag: str) -> list[float]:
    token = (sidecar.work / "token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    url = f"http://127.0.0.1:{sidecar.port}/v1/events"
    latencies = []
    async with aiohttp.ClientSession(headers=headers) as http:
        for i in range(n):
            body = {
                "sessionKey": TARGET,
                "kind": "goal_changed",
                "actorType": "agent",
                "summary": "goal updated",
                "dedupeKey": f"{tag}-{i}",
            }
            start = time.perf_counter()
            async with http.post(url, data=orjson.dumps(body)) as resp:
                assert resp.status == 200, await resp.text()
            latencies.append(time.perf_counter() - start)
            await asyncio.sleep(max(0.0, 1 / rate - latencies[-1]))
    return latencies


async def gateway_turns(gateway: Gateway, stop: asyncio.Event, concurrency: int) -> int:
    headers = {"Authorization": f"Bearer {gateway.hooks_token}"}
    done = 0

    async def one_lane(lane: int) -> None:
        nonlocal done
        async with aiohttp.ClientSession(headers=headers) as http:
            i = 0
            while not stop.is_set():
                body = {
                    "message": f"load {lane}-{i}",
                    "sessionKey": f"{PEER}-{lane}",
                    "sessionMode": "persistent",
                    "waitForCompletion": True,
                }
                async with http.post(f"{gateway.base}/hooks/agent", json=body) as resp:
                    await resp.read()
                    if resp.status == 200:
                        done += 1
                i += 1

    async def recording_lane() -> None:
        """The gateway's own session-state writes: its ``agent`` method records a
        ``human_direct_message`` in a watched session (through its CLI: a process each)."""
        i = 0
        while not stop.is_set():
            params = {
                "sessionKey": f"{PEER}-events",
                "message": f"typed {i}",
                "idempotencyKey": f"e{i}",
            }
            argv = gateway.command(
                str(NODE),
                str(OPENCLAW / "openclaw.mjs"),
                "gateway",
                "call",
                "agent",
                "--params",
                orjson.dumps(params).decode(),
                "--json",
            )
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
            )
            await proc.wait()
            i += 1

    await asyncio.gather(*(one_lane(n) for n in range(concurrency)), recording_lane())
    return done


def summary(name: str, latencies: list[float]) -> float:
    latencies = sorted(latencies)
    p99 = latencies[max(int(len(latencies) * 0.99) - 1, 0)] * 1000
    print(
        f"{name}: {len(latencies)} writes, median {statistics.median(latencies) * 1000:.1f} ms,"
        f" p99 {p99:.1f} ms, max {latencies[-1] * 1000:.1f} ms"
    )
    return p99


def count_events(db: Path, pattern: str) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        sql = "SELECT count(*) FROM session_state_events WHERE session_key LIKE ?"
        return int(conn.execute(sql, (pattern,)).fetchone()[0])
    finally:
        conn.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=400)
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--turns", type=int, default=2)
    args = parser.parse_args()
    why = why_not_runnable()
    if why:
        sys.exit(f"cannot run: {why}")
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        work.chmod(0o700)
        model = MockModelProcess(work)
        gateway = Gateway(work, model, user=None)
        gateway.start()
        (work / "sw").mkdir(mode=0o700)
        (work / "sw" / "claude").mkdir()
        sidecar = Sidecar(
            work / "sw", gateway, claude_root=work / "sw" / "claude", hooks_token="unused"
        )
        sidecar.start()
        try:
            for lane in [*range(args.turns), "events"]:
                sidecar.cli("watch", "--watcher", "agent:main:main", "--target", f"{PEER}-{lane}")
            idle = await record(sidecar, args.events, args.rate, "idle")
            before = count_events(gateway.db, PEER + "%")
            stop = asyncio.Event()
            turns = asyncio.ensure_future(gateway_turns(gateway, stop, args.turns))
            await asyncio.sleep(2.0)  # the first turns are under way
            busy = await record(sidecar, args.events, args.rate, "busy")
            stop.set()
            done = await turns
            written = count_events(gateway.db, PEER + "%") - before
            recorded = count_events(gateway.db, TARGET)
        finally:
            sidecar.stop()
            gateway.stop()
            model.stop()
        p99_idle = summary("sidecar writes, gateway idle   ", idle)
        p99_busy = summary("sidecar writes, gateway writing", busy)
        print(f"p99 ratio busy/idle: {p99_busy / p99_idle:.2f}")
        print(f"gateway: {done} agent turns completed, {written} session-state events written")
        print(f"sidecar: {recorded} of {2 * args.events} events recorded")
        locked = sum(
            "database is locked" in text for text in (sidecar.log_text(), gateway.log_text())
        )
        print(f"logs that mention 'database is locked': {locked}")


if __name__ == "__main__":
    asyncio.run(main())
