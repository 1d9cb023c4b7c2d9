"""OpenCode's early check: from a prompt written to an OpenCode database to the wake call at
the gateway, against the same for an append to a Claude transcript (the baseline) in the
same run and the same ``serve``. Target: p99 under 1 s.

The OpenCode database is written the way OpenCode writes it (tests/opencode_db.py: its
table definitions, WAL mode, the message row and its parts in separate transactions); the
gateway is a hooks API on loopback that answers as OpenClaw's does. ``serve`` ticks only
hourly here, so every figure is the early check's.

Usage: python bench/opencode_wake.py [--samples 30]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.service import hooks_gateway, start_serve
from tests.opencode_db import OpenCodeDB

SID = "ses_bench"
CLAUDE_LINE = b'{"type":"user","uuid":"u%d","message":{"role":"user","content":"typed %d"}}\n'


async def sample(
    http: aiohttp.ClientSession,
    base: str,
    key: str,
    watcher: str,
    write: object,
    woken: asyncio.Queue[tuple[str, float]],
) -> float:
    async with http.post(
        f"{base}/v1/watches", data=orjson.dumps({"watcher": watcher, "target": key})
    ) as r:
        assert r.status == 200
    await asyncio.sleep(0.3)
    start = time.perf_counter()
    await asyncio.to_thread(write)  # type: ignore[arg-type]
    while True:
        who, at = await asyncio.wait_for(woken.get(), 30)
        if who == watcher:
            return at - start


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    woken: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
    runner, hooks_url = await hooks_gateway(woken)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "claude" / "p").mkdir(parents=True)
        oc = OpenCodeDB(tmp / "opencode.db")
        oc.session(SID)
        oc.prompt(SID, "the first prompt")
        transcript = tmp / "claude" / "p" / "s.jsonl"
        transcript.write_bytes(CLAUDE_LINE % (0, 0))
        opencode = f'opencode_db = "{tmp / "opencode.db"}"\n'
        proc, base, token = start_serve(tmp, hooks_url, more_roots=opencode)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        figures: dict[str, list[float]] = {"opencode": [], "claude": []}
        try:
            async with aiohttp.ClientSession(headers=headers) as http:
                for kind, path, thread in (
                    ("opencode", str(tmp / "opencode.db"), SID),
                    ("claude", str(transcript), None),
                ):
                    body = {"kind": kind, "path": path, "sessionKey": f"agent:main:{kind}"}
                    if thread:
                        body["thread"] = thread
                    async with http.post(f"{base}/v1/links", data=orjson.dumps(body)) as r:
                        assert r.status == 200, await r.text()
                await asyncio.sleep(1.0)  # the watch is armed on the new links' directories
                for i in range(1, args.samples + 1):
                    for kind in ("opencode", "claude"):

                        def write(kind: str = kind, i: int = i) -> None:
                            if kind == "opencode":
                                oc.prompt(SID, f"typed {i}")
                            else:
                                with transcript.open("ab") as f:
                                    f.write(CLAUDE_LINE % (i, i))

                        watcher = f"agent:w{kind}{i}:main"
                        figures[kind].append(
                            await sample(http, base, f"agent:main:{kind}", watcher, write, woken)
                        )
        finally:
            proc.terminate()
            proc.wait()
            await runner.cleanup()
    p99 = {}
    for kind, values in figures.items():
        values.sort()
        p99[kind] = values[max(int(len(values) * 0.99) - 1, 0)]
        print(
            f"{kind:<8} write to wake, {len(values)} samples: median"
            f" {statistics.median(values) * 1000:.0f} ms, p99 {p99[kind] * 1000:.0f} ms"
        )
    print(
        f"OpenCode p99 / Claude p99: {p99['opencode'] / p99['claude']:.2f}"
        f" (target: OpenCode p99 < 1000 ms: {'met' if p99['opencode'] < 1 else 'NOT met'})"
    )


if __name__ == "__main__":
    asyncio.run(main())
