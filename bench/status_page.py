"""What the status page costs: with no page open, and with one open.

Run: python bench/status_page.py [--links 300] [--idle-s 60] [--tick-s 60] [--events 3000]

A real ``sessionwatch serve`` with ``--links`` adopted, watched Claude transcripts and a
tick every ``--tick-s`` (the default interval; a short one shows the tick's share). The
"page" is a client doing what ``app.js`` does: it holds ``/ui/stream`` open and fetches
``/ui/live`` after each ``changed``. Measured in the same
run, without the page and then with it:

- the serve process's CPU while idle (ticks only), in % of one core, from /proc;
- the tick's mean duration, from ``/metrics``;
- ``POST /v1/events`` from 50 connections: requests/s and p99.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.service import cpu_s, load, start_serve


async def tick_mean_s(http: aiohttp.ClientSession, base: str) -> tuple[float, int]:
    async with http.get(f"{base}/metrics") as r:
        text = await r.text()
    values = {}
    for line in text.splitlines():
        if line.startswith("sessionwatch_tick_duration_seconds_"):
            name, value = line.split()
            values[name.rsplit("_", 1)[1]] = float(value)
    count = int(values.get("count", 0))
    return (values.get("sum", 0.0) / count if count else 0.0), count


class Page:
    """A browser's share of the work: the stream, and a fetch of the fragment per change."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.headers = {"Authorization": f"Bearer {token}"}
        self.fetches = 0
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        async with (
            aiohttp.ClientSession(headers=self.headers) as http,
            http.get(f"{self.base}/ui/stream", timeout=aiohttp.ClientTimeout(total=None)) as s,
        ):
            async for line in s.content:
                if line.startswith(b"event: changed"):
                    async with http.get(f"{self.base}/ui/live") as r:
                        await r.read()
                    self.fetches += 1

    def start(self) -> None:
        self.task = asyncio.ensure_future(self.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                await self.task


async def measure(
    label: str, pid: int, base: str, token: str, idle_s: float, events: int
) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        mean_before, n_before = await tick_mean_s(http, base)
        cpu_before, wall_before = cpu_s(pid), time.monotonic()
        await asyncio.sleep(idle_s)
        cpu = (cpu_s(pid) - cpu_before) / (time.monotonic() - wall_before) * 100
        mean_after, n_after = await tick_mean_s(http, base)
    ticks = n_after - n_before
    tick_ms = (mean_after * n_after - mean_before * n_before) / ticks * 1000 if ticks else 0.0
    body = orjson.dumps(
        {
            "sessionKey": "agent:main:bench:page",
            "kind": "human_direct_message",
            "actorType": "human",
            "payload": {"channel": "bench"},
        }
    )
    rps, p99 = await load(f"{base}/v1/events", "POST", [body] * events, token)
    print(
        f"{label}: idle CPU {cpu:.2f} % of a core over {idle_s:.0f} s; {ticks} ticks,"
        f" mean {tick_ms:.1f} ms; POST /v1/events {rps:,.0f} req/s, p99 {p99:.1f} ms"
    )
    return {"cpu": cpu, "tick_ms": tick_ms, "rps": rps, "p99": p99}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--links", type=int, default=300)
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--tick-s", type=float, default=60.0)
    parser.add_argument("--events", type=int, default=3000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        root = tmp / "claude" / "-work"
        root.mkdir(parents=True)
        proc, base, token = start_serve(tmp, None, interval_s=args.tick_s)
        try:
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            async with aiohttp.ClientSession(headers=headers) as http:
                for i in range(args.links):
                    path = root / f"s{i}.jsonl"
                    path.write_bytes(b'{"type":"user","uuid":"u","message":{"role":"user"}}\n')
                    key = f"agent:main:page:{i}"
                    link = {"kind": "claude", "path": str(path), "sessionKey": key}
                    async with http.post(f"{base}/v1/links", data=orjson.dumps(link)) as r:
                        assert r.status == 200, await r.text()
                    watch = {"watcher": "agent:main:main", "target": key}
                    async with http.post(f"{base}/v1/watches", data=orjson.dumps(watch)) as r:
                        assert r.status == 200, await r.text()
            await asyncio.sleep(min(2 * args.tick_s, 5.0))
            none = await measure("no page  ", proc.pid, base, token, args.idle_s, args.events)
            page = Page(base, token)
            page.start()
            await asyncio.sleep(1.0)
            one = await measure("one page ", proc.pid, base, token, args.idle_s, args.events)
            await page.stop()
            print(
                f"with a page open: idle CPU {one['cpu'] - none['cpu']:+.2f} points of a core"
                f" ({page.fetches} fragments fetched, {args.links} links);"
                f" tick {one['tick_ms'] / max(none['tick_ms'], 1e-9):.2f}x;"
                f" POST /v1/events {one['rps'] / none['rps']:.2f}x req/s,"
                f" p99 {one['p99']:.1f} ms against {none['p99']:.1f} ms"
            )
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    asyncio.run(main())
