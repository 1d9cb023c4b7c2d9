"""What open notice streams cost an idle ``serve``: the CPU it spends per second with 1 and
with ``--streams`` SSE streams open (``GET /v1/watchers/{key}/notices/stream``) and nothing
happening, and how long a notice then takes to reach every stream. Today's tree against an
earlier release built from the project's history (``git archive``), in the same run.

Run: python bench/streams.py [--streams 100] [--seconds 20] [--baseline e113073]

Before the change hub each stream looked at the store every 0.2 s on its own; with it, one
task per process looks, whatever the number of streams.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trees import REPO, source_of

MAIN = "agent:main:main"
# the ratio's floor for one stream's cost: an idle serve with one stream spends under 0.1 ms
# of CPU a second, and 100 streams' keep-alives (one every 15 s each) some 0.7 ms; against
# near nothing, a ratio says nothing of what streams cost
FLOOR_MS = 0.5
CHILD = "agent:main:subagent:bench"


def cpu_s(pid: int) -> float:
    """CPU seconds the process's threads have run so far, to the nanosecond (each thread's
    ``schedstat``). ``/proc/PID/stat`` counts in ticks of 10 ms: an idle serve spends about
    2.5 ms a second, so 20 s of it are five ticks, and one tick more or less moved the ratio
    by a fifth."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with open(task / "schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


def start_serve(src: Path, work: Path) -> tuple[subprocess.Popen[str], str, str, list[str]]:
    work.mkdir(parents=True)
    token = secrets.token_hex(16)
    (work / "token").write_text(token + "\n")
    (work / "token").chmod(0o600)
    config = work / "c.toml"
    config.write_text(
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{work / "token"}"\n'
        f'[roots]\nclaude = "{work / "claude"}"\n'
        "[monitor]\ninterval_s = 3600\ninitial_delay_s = 3600\nwatch_files = false\n"
    )
    base = [sys.executable, "-m", "monitor", "--db", str(work / "state.db"), "--config"]
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.Popen(
        [*base, str(config), "serve"], env=env, cwd=src, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        found = re.search(r"serving .* on (http://\S+)", line)
        if found:
            return proc, found.group(1), token, [*base, str(config)]
    raise SystemExit(f"serve at {src} did not start")


async def measure(src: Path, work: Path, streams: int, seconds: float) -> tuple[float, float]:
    """CPU ms per second while idle with ``streams`` open, and the seconds until a notice
    reached every one of them."""
    proc, address, token, cli = start_serve(src, work)
    env = {**os.environ, "PYTHONPATH": str(src)}

    def run(*args: str) -> None:
        subprocess.run([*cli, *args], env=env, cwd=src, check=True, capture_output=True)

    try:
        run("spawn", "--parent", MAIN, "--child", CHILD, "--run-id", "r1")
        headers = {"Authorization": f"Bearer {token}"}
        url = f"{address}/v1/watchers/{MAIN}/notices/stream"
        got: list[float] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:

            async def follow() -> None:
                async with http.get(url, headers=headers) as resp:
                    async for line in resp.content:
                        if line.startswith(b"event: notice"):
                            got.append(time.perf_counter())
                            return

            tasks = [asyncio.ensure_future(follow()) for _ in range(streams)]
            await asyncio.sleep(3)  # every stream open and settled
            before = cpu_s(proc.pid)
            await asyncio.sleep(seconds)
            idle_ms = (cpu_s(proc.pid) - before) / seconds * 1000
            sent = time.perf_counter()
            await asyncio.to_thread(
                run, "record", "--session", CHILD, "--kind", "human_direct_message",
                "--actor", "human",
            )  # fmt: skip
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
        return idle_ms, max(got) - sent
    finally:
        proc.terminate()
        proc.wait(30)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--baseline", default="e113073")
    a = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sw-streams-") as tmp:
        trees = {"this tree": REPO, a.baseline: source_of(a.baseline, Path(tmp) / "baseline")}
        results: dict[tuple[str, int], tuple[float, float]] = {}
        for name, src in trees.items():
            for n in (1, a.streams):
                work = Path(tmp) / f"{name.replace(' ', '-')}-{n}"
                results[name, n] = await measure(src, work, n, a.seconds)
                idle, latency = results[name, n]
                print(
                    f"{name:>10}: {n:4d} streams: idle {idle:6.1f} ms CPU/s,"
                    f" a notice reached all in {latency * 1000:6.0f} ms"
                )
        for name in trees:
            one, many = results[name, 1][0], results[name, a.streams][0]
            ratio = many / max(one, FLOOR_MS)
            print(f"{name:>10}: {a.streams} streams cost {ratio:.2f}x one")
        ours, theirs = results["this tree", a.streams][0], results[a.baseline, a.streams][0]
        print(f"at {a.streams} streams: this tree {ours / max(theirs, 0.01):.2f}x {a.baseline}")


if __name__ == "__main__":
    asyncio.run(main())
