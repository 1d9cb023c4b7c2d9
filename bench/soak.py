"""A soak with a verdict: steady API load, appends, links and an open status page.

Run: python bench/soak.py [--minutes 30] [--rate 40] [--sample-s 10] [--links 20]
     [--interval-s 1]

``sessionwatch serve`` runs as a real process, ticking every ``--interval-s``, with
``--links`` adopted and watched Claude transcripts: one typed into every second, half left
quiet, and the other half led outside the roots (each tick finds them unreadable). The
load, from this process over loopback: ``--rate`` requests per second (recording an event,
a status read with ``changesSince``, a notice drain, in turn), one appended prompt per
second, and the status page's live stream held open for the whole run. Every ``--sample-s``
seconds it samples the server's RSS, open fds and threads (from /proc), the database's size
with its ``-wal``, the log lines written so far, and the mean tick time (from /metrics). It
prints the first and last samples, the slope of each per hour (least squares over the
samples after the first tenth, the warm-up), and whether each slope is flat within its
bound:

- RSS: under 4 MiB per hour; open fds and threads: under 1 per hour; tick time: under
  10 ms per hour. The database and the log lines are reported with their slopes: both
  grow with what is recorded (retention starts at 30 days; each recorded turn is a line).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

BOUNDS = {"rss_mib": 4.0, "fds": 1.0, "threads": 1.0, "tick_ms": 10.0}  # per hour
# reported without a bound: they grow with what is recorded (an event about every 0.075 s,
# a turn every second), which is the point; the idle log is bench/log_growth.py's
REPORTED = ("db_mib", "log_lines")


def proc_stats(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    return {"rss_mib": rss / 1024, "fds": fds, "threads": threads}


def slope_per_hour(times: list[float], values: list[float]) -> float:
    n = len(times)
    if n < 2:
        return 0.0
    mt, mv = sum(times) / n, sum(values) / n
    den = sum((t - mt) ** 2 for t in times)
    num = sum((t - mt) * (v - mv) for t, v in zip(times, values, strict=True))
    return 0.0 if den == 0 else num / den * 3600


def command(tmp: Path, *args: str) -> list[str]:
    """``sessionwatch`` on the soak's database and configuration."""
    base = ["-m", "monitor", "--db", str(tmp / "state.db"), "--config", str(tmp / "c.toml")]
    return [sys.executable, *base, *args]


def cli(tmp: Path, *args: str) -> Any:
    out = subprocess.run(command(tmp, *args), capture_output=True, check=True)
    return json.loads(out.stdout)


async def tick_ms(http: aiohttp.ClientSession, base: str) -> float:
    async with http.get(f"{base}/metrics") as r:
        text = await r.text()
    total = re.search(r"sessionwatch_tick_duration_seconds_sum (\S+)", text)
    count = re.search(r"sessionwatch_tick_duration_seconds_count (\S+)", text)
    if not total or not count or float(count.group(1)) == 0:
        return 0.0
    return float(total.group(1)) / float(count.group(1)) * 1000


def files_stats(tmp: Path) -> dict[str, float]:
    db = sum(p.stat().st_size for p in tmp.glob("state.db*") if p.is_file())
    lines = (tmp / "serve.log").read_text(errors="replace").count("\n")
    return {"db_mib": db / 2**20, "log_lines": lines}


async def watch_page(http: aiohttp.ClientSession, base: str, seen: list[int]) -> None:
    """The status page's live stream, held open and read to the end of the run."""
    async with http.get(f"{base}/ui/stream") as r:
        async for _ in r.content:
            seen[0] += 1


async def drive(
    base: str, token: str, tmp: Path, transcript: Path, args: argparse.Namespace, pid: int
) -> list[dict[str, float]]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    key = "agent:main:subagent:soak"
    event = {"sessionKey": key, "kind": "human_direct_message", "actorType": "human"}
    samples: list[dict[str, float]] = []
    start = time.monotonic()
    end = start + args.minutes * 60
    next_sample, next_append, n = start, start, 0
    page_lines = [0]
    async with aiohttp.ClientSession(headers=headers) as http:
        page = asyncio.ensure_future(watch_page(http, base, page_lines))
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_sample:
                samples.append(
                    {
                        "t": now - start,
                        **proc_stats(pid),
                        **files_stats(tmp),
                        "tick_ms": await tick_ms(http, base),
                    }
                )
                next_sample += args.sample_s
            if now >= next_append:
                with transcript.open("ab") as f:
                    f.write(
                        json.dumps(
                            {
                                "type": "user",
                                "uuid": f"s{n}",
                                "message": {"role": "user", "content": f"soak {n}"},
                            }
                        ).encode()
                        + b"\n"
                    )
                next_append += 1.0
            n += 1
            which = n % 3
            if which == 0:
                async with http.post(f"{base}/v1/events", json=event) as r:
                    await r.read()
            elif which == 1:
                async with http.get(
                    f"{base}/v1/sessions/{key}/status?changesSince={max(0, n - 30)}"
                ) as r:
                    await r.read()
            else:
                async with http.post(f"{base}/v1/watchers/agent:main:main/notices/drain") as r:
                    await r.read()
            await asyncio.sleep(max(0.0, 1 / args.rate - (time.monotonic() - now)))
        page.cancel()
    if page_lines[0] == 0:
        raise RuntimeError("the status page's stream sent nothing")
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=float, default=40)
    parser.add_argument("--sample-s", type=float, default=10)
    parser.add_argument("--links", type=int, default=20)
    parser.add_argument("--interval-s", type=float, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "claude" / "p").mkdir(parents=True)
        transcript = tmp / "claude" / "p" / "soak.jsonl"
        transcript.write_bytes(b"")
        (tmp / "c.toml").write_text(
            f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp / "token"}"\n'
            f'[roots]\nclaude = "{tmp / "claude"}"\n'
            f"[monitor]\ninterval_s = {args.interval_s}\ninitial_delay_s = 1\n"
        )
        outside = tmp / "outside"
        outside.mkdir()
        for n in range(args.links):
            path = transcript if n == 0 else tmp / "claude" / "p" / f"s{n}.jsonl"
            path.write_bytes(b"")
            key = "agent:main:adopted:soak" if n == 0 else f"agent:main:adopted:s{n}"
            cli(tmp, "adopt", "--kind", "claude", "--path", str(path), "--session-key", key,
                "--session-id", f"s{n}")  # fmt: skip
            cli(tmp, "watch", "--watcher", "agent:main:main", "--target", key)
            if n >= args.links // 2:  # from now on it leads outside the roots
                (outside / path.name).write_bytes(b"")
                path.unlink()
                path.symlink_to(outside / path.name)
        cli(tmp, "watch", "--watcher", "agent:main:main", "--target", "agent:main:subagent:soak")
        log = (tmp / "serve.log").open("w")  # read, not piped: a full pipe would stall serve
        proc = subprocess.Popen(command(tmp, "serve"), stderr=log)
        base = ""
        while not base:
            time.sleep(0.1)
            match = re.search(r"serving .* on (http://\S+)", (tmp / "serve.log").read_text())
            if match:
                base = match.group(1)
            elif proc.poll() is not None:
                raise RuntimeError("serve exited: " + (tmp / "serve.log").read_text())
        try:
            token = (tmp / "token").read_text().strip()
            samples = asyncio.run(drive(base, token, tmp, transcript, args, proc.pid))
        finally:
            proc.terminate()
            proc.wait()
            log.close()
    report(samples, args)


def report(samples: list[dict[str, float]], args: argparse.Namespace) -> None:
    steady = samples[len(samples) // 10 :]
    times = [s["t"] for s in steady]
    first, last = samples[0], samples[-1]
    print(
        f"soak: {args.minutes:g} min at {args.rate:g} req/s and 1 append/s, {args.links} links"
        f" (half outside the roots), a tick every {args.interval_s:g} s, the status page's"
        f" stream open; {len(samples)} samples"
    )
    flat = True
    for name, bound in BOUNDS.items():
        slope = slope_per_hour(times, [s[name] for s in steady])
        ok = slope < bound  # a leak grows; a count that falls back after a peak is not one
        flat &= ok
        print(
            f"  {name}: start {first[name]:.1f}, end {last[name]:.1f}, slope {slope:+.2f}/h"
            f" (bound {bound:g}/h): {'flat' if ok else 'NOT flat'}"
        )
    for name in REPORTED:
        slope = slope_per_hour(times, [s[name] for s in steady])
        print(f"  {name}: start {first[name]:.1f}, end {last[name]:.1f}, slope {slope:+.2f}/h")
    print("verdict: " + ("flat" if flat else "NOT flat"))


if __name__ == "__main__":
    main()
