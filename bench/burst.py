"""A prompt typed behind a burst of tool output: from the write (the output and then the
prompt, appended to an adopted Claude transcript) to the watcher's notice, against the same
prompt with no burst before it (the baseline), in the same run and the same sidecar.
Target: under 2 s behind 50 MiB, with the 1 MiB scan cap (each check reads a MiB; one
that stops at the cap checks again at once). ``serve`` ticks hourly here: every figure is
the early checks'.

Usage: python bench/burst.py [--mib 50] [--samples 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor.serve.root import running
from tests.helpers import make_config, user_line
from tests.upstream.test_burst import output_line

MAIN = "agent:main:main"
TARGET_S = 2.0


async def typed(sidecar: object, path: Path, burst: bytes, n: int) -> float:
    """Seconds from the write to the notice; the notice is drained after."""
    kernel = sidecar.kernel  # type: ignore[attr-defined]
    start = time.perf_counter()
    with path.open("ab") as f:
        f.write(burst + user_line(f"prompt {n}", f"p{n}"))
    while not await kernel.notices(watcher=MAIN):
        await asyncio.sleep(0.005)
    took = time.perf_counter() - start
    await kernel.notices(watcher=MAIN, drain=True)
    return took


async def main(mib: int, samples: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = make_config(Path(tmp))
        async with running(config, Path(tmp) / "state.db") as sidecar:
            assert sidecar is not None
            path = Path(config.roots.claude) / "burst.jsonl"
            path.write_bytes(user_line("first", "u0"))
            key = "agent:main:burst"
            await sidecar.monitor.adoption.adopt(kind="claude", path=str(path), session_key=key)
            await sidecar.kernel.watch(watcher=MAIN, target=key)
            burst = b"".join(output_line(n, 64 * 1024) for n in range(mib * 16))
            plain, behind = [], []
            for n in range(samples):
                plain.append(await typed(sidecar, path, b"", 2 * n))
                behind.append(await typed(sidecar, path, burst, 2 * n + 1))
    base, late = statistics.median(plain), statistics.median(behind)
    verdict = "ok" if max(behind) < TARGET_S else "MISSED"
    print(f"no burst (baseline): median {base * 1000:.0f} ms")
    print(
        f"behind {mib} MiB: median {late * 1000:.0f} ms, worst {max(behind) * 1000:.0f} ms"
        f" ({late / base:.1f}x the baseline); target < {TARGET_S:.0f} s: {verdict}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=50)
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.mib, args.samples))
