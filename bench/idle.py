"""What an idle ``serve`` costs, and the detection it still gives: wakeups a second and CPU
seconds an hour with 0, 100 and 1,000 watched Claude sessions and nothing written, counted
from /proc for every thread (voluntary and involuntary context switches; utime + stime);
then prompts typed into the sessions, one at a time, timed to their notices. The same for a
baseline release in the same run (a git worktree of ``--against``), each ``serve`` a real
process on its own SQLite file, with the default tick (60 s) and file watching.

Targets (1,000 sessions): at most 1 wakeup a second, at most 2 CPU s an hour, and typed to
recorded at p99 under 250 ms.

Usage: python bench/idle.py [--sessions 0,100,1000] [--seconds 60] [--typed 30]
       [--against d4ce48e]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from trees import worktree

ROOT = Path(__file__).resolve().parent.parent
MAIN = "agent:main:main"
TICKS = os.sysconf("SC_CLK_TCK")

SETUP = """
import asyncio, sys
from pathlib import Path
from monitor.config import Config, RootsConfig
from monitor.kernel import Kernel
from monitor.upstream import UpstreamMonitor

async def main(db, root, n):
    kernel = await Kernel.open(db)
    monitor = UpstreamMonitor.from_config(kernel, Config(roots=RootsConfig(claude=root)))
    for i in range(n):
        key = f"agent:main:idle:{i}"
        await monitor.adoption.adopt(kind="claude", path=f"{root}/s{i}.jsonl", session_key=key)
        await kernel.watch(watcher="agent:main:main", target=key)
    await kernel.close()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


class Figures(NamedTuple):
    wakeups_s: float
    cpu_s_h: float
    p50_ms: float
    p99_ms: float


def user_line(text: str, uuid: str) -> bytes:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    return (
        f'{{"type":"user","uuid":"{uuid}","timestamp":"{stamp}",'
        f'"message":{{"role":"user","content":"{text}"}}}}\n'
    ).encode()


def switches_and_cpu(pid: int) -> tuple[int, float]:
    """Context switches of every thread so far, and the process's CPU seconds."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for line in (task / "status").read_text().splitlines():
                if line.endswith("ctxt_switches:") or "ctxt_switches:" in line:
                    total += int(line.split()[1])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return total, (int(fields[11]) + int(fields[12])) / TICKS


def pending(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(
            conn.execute(
                "SELECT count(*) FROM session_watch_cursors WHERE watcher_session_key = ?"
                " AND material_sequence > last_seen_sequence",
                (MAIN,),
            ).fetchone()[0]
        )
    finally:
        conn.close()


@contextlib.contextmanager
def serving(tree: Path, tmp: Path, db: Path, root: Path) -> Iterator[subprocess.Popen[str]]:
    config = tmp / "sw.toml"
    config.write_text(
        f'[roots]\nclaude = "{root}"\n[api]\nlisten = "127.0.0.1:0"\n'
        f'token_file = "{tmp / "token"}"\n[monitor]\ninitial_delay_s = 1\n'
    )
    env = {**os.environ, "PYTHONPATH": str(tree), "OPENCLAW_GATEWAY_PORT": "9"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "--db", str(db), "--config", str(config), "serve"],
        cwd=tree,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    # its log after the start-up line is kept in $IDLE_LOG (else dropped), read on so that
    # it never blocks on a full pipe
    log = Path(os.environ.get("IDLE_LOG", os.devnull)).open("w")  # noqa: SIM115
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if re.search(r"serving .* on https?://", line):
                break
        else:
            raise SystemExit(f"serve from {tree} exited before it served")
        drain = subprocess.Popen(["cat"], stdin=proc.stderr, stdout=log)
        try:
            yield proc
        finally:
            drain.kill()
    finally:
        log.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def settled(pid: int) -> None:
    """Until ``serve`` is at rest after its start: no CPU used over 3 s (the first tick, its
    catch-up check of every link and their writes are done), at most 2 minutes."""
    deadline = time.monotonic() + 120
    time.sleep(3)
    _, before = switches_and_cpu(pid)
    while time.monotonic() < deadline:
        time.sleep(3)
        _, now = switches_and_cpu(pid)
        if now - before < 0.02:
            return
        before = now


def measure(tree: Path, sessions: int, seconds: float, typed: int) -> Figures:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        root, db = tmp / "claude", tmp / "state.db"
        root.mkdir()
        for i in range(sessions):
            (root / f"s{i}.jsonl").write_bytes(user_line("before", f"b{i}"))
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run(
            [sys.executable, "-c", SETUP, str(db), str(root), str(sessions)],
            cwd=tree,
            env=env,
            check=True,
        )
        with serving(tree, tmp, db, root) as proc:
            settled(proc.pid)  # the first tick (1 s after start) and its writes are done
            s0, c0 = switches_and_cpu(proc.pid)
            t0 = time.monotonic()
            time.sleep(seconds)
            s1, c1 = switches_and_cpu(proc.pid)
            span = time.monotonic() - t0
            took: list[float] = []
            targets = random.sample(range(sessions), min(typed, sessions))
            for n, i in enumerate(targets):
                start = time.perf_counter()
                with (root / f"s{i}.jsonl").open("ab") as f:
                    f.write(user_line(f"prompt {n}", f"p{n}"))
                while pending(db) < n + 1:
                    if time.perf_counter() - start > 30:
                        raise SystemExit(f"{tree}: no notice 30 s after a prompt")
                    time.sleep(0.002)
                took.append((time.perf_counter() - start) * 1000)
                time.sleep(0.3)  # one prompt at a time
    took.sort()
    p99 = took[min(len(took) - 1, int(len(took) * 0.99))] if took else 0.0
    return Figures(
        (s1 - s0) / span, (c1 - c0) / span * 3600, statistics.median(took) if took else 0.0, p99
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", default="0,100,1000")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--typed", type=int, default=30)
    parser.add_argument("--against", default="d4ce48e", help="a git ref; '' for none")
    args = parser.parse_args()
    sizes = [int(n) for n in args.sessions.split(",")]
    with contextlib.ExitStack() as stack:
        trees = {"this tree": ROOT}
        if args.against:
            trees[args.against] = stack.enter_context(worktree(args.against))
        for n in sizes:
            figures = {
                name: measure(tree, n, args.seconds, args.typed) for name, tree in trees.items()
            }
            for name, f in figures.items():
                print(
                    f"{n:>5} sessions, {name}: {f.wakeups_s:.2f} wakeups/s,"
                    f" {f.cpu_s_h:.2f} CPU s/h, typed to notice p50 {f.p50_ms:.0f} ms,"
                    f" p99 {f.p99_ms:.0f} ms"
                )
            if args.against:
                ours, base = figures["this tree"], figures[args.against]
                print(
                    f"{n:>5} sessions: wakeups {ours.wakeups_s / max(base.wakeups_s, 1e-9):.3f}x,"
                    f" CPU {ours.cpu_s_h / max(base.cpu_s_h, 1e-9):.3f}x the baseline"
                )
            if n >= 1000:
                f = figures["this tree"]
                ok = f.wakeups_s <= 1 and f.cpu_s_h <= 2 and f.p99_ms < 250
                print(f"target at {n}: <= 1 wakeup/s, <= 2 CPU s/h, p99 < 250 ms:",
                      "ok" if ok else "MISSED")  # fmt: skip


if __name__ == "__main__":
    main()
