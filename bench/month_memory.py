"""Memory over a simulated month inside one real ``serve``: RSS per simulated week, its
slope, and the allocation sites that grow from week 1 to week 4.

    python bench/month_memory.py [--days 35] [--events 1000]

The whole service runs in this process (``running``: the store, the kernel, delivery to a
hooks stand-in on loopback, the tick component, file watching, retention, the API on
loopback) on a wall clock and delivery's timers that the bench moves together, a day at a
time (a wake's coalescing window, timed on the timers' monotonic clock, closes as in a real
day). Each simulated day, over the real HTTP API: 40 sub-agent sessions spawned under the
main session, ``--events`` events on them, a prompt typed into each of three adopted Claude
transcripts and an early check, the main session's notices drained, a status with
``changesSince``, the links and the metrics read; then retention when it is due; the wakes
the hooks stand-in took are counted, and let go. It runs the month twice: without
tracemalloc, for the RSS (sampled from /proc at the end of each week, after a full
collection), and with it, to compare the allocations at the end of week 1 and week 4 by line
(the sites that grew are printed, largest first). The slope is least squares over weeks 2
to 5 (week 1 is warm-up: caches, the SQLite page cache, the first of everything).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

# Run as a script, this folder is first on sys.path and bench/monitor.py would shadow the
# package: drop it.
sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).parent.resolve()]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp  # noqa: E402
import orjson  # noqa: E402

from monitor.clock import DAY_MS  # noqa: E402
from monitor.config import ApiConfig, Config, MonitorConfig, RootsConfig  # noqa: E402
from monitor.serve.root import running  # noqa: E402
from tests.helpers import T0, ManualClock, ManualTimers, user_line  # noqa: E402
from tests.hooks_gateway import running_hooks_gateway  # noqa: E402

MAIN = "agent:main:main"
LINKS = ("a", "b", "c")
CHILDREN_PER_DAY = 40


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def slope(points: list[tuple[float, float]]) -> float:
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points) or 1.0
    return sum((x - mx) * (y - my) for x, y in points) / den


async def month(days: int, events: int, trace: bool) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="sw-month-"))
    root = tmp / "claude"
    root.mkdir()
    clock = ManualClock(T0)
    timers = ManualTimers(clock)
    weeks: list[float] = []
    snapshots: dict[int, tracemalloc.Snapshot] = {}
    wakes = 0
    async with running_hooks_gateway() as hooks:
        config = Config(
            roots=RootsConfig(claude=str(root)),
            api=ApiConfig(listen="127.0.0.1:0", token_file=str(tmp / "token")),
            monitor=MonitorConfig(initial_delay_s=DAY_MS, interval_s=3600, watch_files=True),
            gateway=hooks.config(tmp),
        )
        async with running(config, tmp / "state.db", clock=clock, timers=timers) as sidecar:
            assert sidecar is not None
            token = (tmp / "token").read_text().strip()
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            base = sidecar.addresses[0]
            async with aiohttp.ClientSession(headers=headers) as http:

                async def call(method: str, path: str, body: Any = None) -> Any:
                    data = None if body is None else orjson.dumps(body)
                    async with http.request(method, base + path, data=data) as r:
                        raw = await r.read()
                        assert r.status == 200, (path, r.status, raw[:200])
                        return raw

                files = {name: root / f"{name}.jsonl" for name in LINKS}
                for name, path in files.items():
                    path.write_bytes(user_line("the first prompt", f"{name}-0"))
                    key = f"agent:main:adopted:{name}"
                    await call("POST", "/v1/links", {"kind": "claude", "path": str(path),
                                                     "sessionKey": key})  # fmt: skip
                    await call("POST", "/v1/watches", {"watcher": MAIN, "target": key})
                for day in range(days):
                    await timers.advance(T0 + day * DAY_MS + 9 * 3600_000 - clock.now)
                    children = [f"agent:main:subagent:d{day}-c{i}" for i in range(CHILDREN_PER_DAY)]
                    for i, child in enumerate(children):
                        await call("POST", "/v1/spawns", {"parent": MAIN, "child": child,
                                                          "runId": f"d{day}-r{i}"})  # fmt: skip
                    for n in range(events):
                        await call("POST", "/v1/events", {
                            "sessionKey": children[n % CHILDREN_PER_DAY],
                            "kind": "goal_changed", "actorType": "human",
                        })  # fmt: skip
                    for name, path in files.items():
                        with path.open("ab") as f:
                            f.write(user_line(f"day {day}", f"{name}-{day + 1}"))
                    await sidecar.ticks.run_tick()
                    await call("POST", f"/v1/watchers/{MAIN}/notices/drain")
                    await call("GET", f"/v1/sessions/{children[0]}/status?changesSince=0")
                    await call("GET", "/v1/links")
                    await call("GET", "/metrics")
                    await timers.advance(3600_000)
                    await sidecar.kernel.retention.when_due()
                    if sidecar.delivery is not None:
                        await sidecar.delivery.settled()
                    wakes += len(hooks.wakes)  # counted, and not kept: the stand-in is not
                    hooks.wakes.clear()  # the sidecar, and its list would grow in this process
                    if day % 7 == 6:
                        gc.collect()
                        weeks.append(rss_mib())
                        week = len(weeks)
                        if trace and week in (1, 4):
                            snapshots[week] = tracemalloc.take_snapshot()
                        print(f"  week {week}: RSS {weeks[-1]:.1f} MiB", file=sys.stderr)
    return {"weeks": weeks, "snapshots": snapshots, "wakes": wakes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=35)
    parser.add_argument("--events", type=int, default=1000, help="events a day")
    a = parser.parse_args()
    print("untraced run (RSS):", file=sys.stderr)
    plain = asyncio.run(month(a.days, a.events, trace=False))
    weeks = plain["weeks"]
    print("RSS at the end of each simulated week (MiB): " + ", ".join(f"{w:.1f}" for w in weeks))
    later = [(float(i), w) for i, w in enumerate(weeks, start=1) if i >= 2]
    if len(later) >= 2:
        per_week = slope(later)
        print(
            f"RSS slope over weeks 2-{len(weeks)}: {per_week:+.2f} MiB a simulated week"
            f" ({per_week * 4.3:+.1f} MiB a month); wakes delivered: {plain['wakes']}"
        )
    print("traced run (tracemalloc, 1 frame a site):", file=sys.stderr)
    tracemalloc.start()
    traced = asyncio.run(month(min(a.days, 28), a.events, trace=True))
    tracemalloc.stop()
    first, fourth = traced["snapshots"][1], traced["snapshots"][4]
    stats = [s for s in fourth.compare_to(first, "lineno") if s.size_diff > 0]
    total = sum(s.size_diff for s in stats)
    print(f"allocations grown from week 1 to week 4: {total / 1024:.1f} KiB in {len(stats)}"
          " sites; the largest:")  # fmt: skip
    for stat in stats[:12]:
        frame = stat.traceback[0]
        where = os.path.relpath(frame.filename, Path(__file__).resolve().parent.parent)
        grown = f"{stat.size_diff / 1024:+8.1f} KiB {stat.count_diff:+6d} blocks"
        print(f"  {grown}  {where}:{frame.lineno}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
