"""Every speed target once, each against its baseline in the same run, and whether it holds.

Run before any change to the store, the API or the CLI's start-up (docs/performance.md):

    python bench/targets.py [--quick]

It runs the benches below as they are run by hand, reads the ratio each prints, and prints
one line per target: the figure, the target, and ``ok`` or ``MISSED``. It exits 1 when a
target is missed, so a change that makes one thing faster and another slower is seen before
it lands. ``--quick`` runs smaller workloads (noisier; for a first look). The start-up
floor is ``python -c "import sqlite3, orjson"``.

| target | bench |
|---|---|
| ``POST /v1/events`` at 50 clients >= 0.30x bare aiohttp, p99 < 50 ms | bench/service.py |
| one event at a time >= 0.5x plain sqlite3 | bench/kernel.py (a) |
| ``changesSince`` at 50,000 rows: p99 < 2 ms | bench/kernel.py (b) |
| prune at the cap < 100 ms | bench/kernel.py (c) |
| one-shot ``status`` (also next to OpenClaw), ``record``, ``notices --drain`` <= 1.4x | cli.py |
| whole-process ``replay`` of a Claude transcript (each key order) >= 1.5x orjson | cli.py |
| 100 idle notice streams cost <= 1.5x one | bench/streams.py |
| a prompt on a node over TLS to its wake: p99 <= 2x local, each kind | bench/node_latency.py |
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

BENCH = Path(__file__).resolve().parent


class Target(NamedTuple):
    what: str
    bench: str
    pattern: str  # a regex over the bench's output; its groups are the figure
    holds: Callable[..., bool]
    shown: str  # the target, in words


TARGETS = [
    Target(
        "POST /v1/events, 50 clients",
        "service",
        r"^POST /v1/events: .*p99 ([\d.]+) ms;.*ratio ([\d.]+)",
        lambda p99, ratio: float(ratio) >= 0.30 and float(p99) < 50,
        ">= 0.30x bare aiohttp, p99 < 50 ms",
    ),
    Target(
        "one event at a time",
        "kernel",
        r"^\(a\) .*ratio ([\d.]+)",
        lambda ratio: float(ratio) >= 0.5,
        ">= 0.5x plain sqlite3",
    ),
    Target(
        "changesSince at 50,000 rows",
        "kernel",
        r"^\(b\) .*p99 ([\d.]+) ms",
        lambda p99: float(p99) < 2,
        "p99 < 2 ms",
    ),
    Target(
        "prune at the cap",
        "kernel",
        r"^\(c\) .*: ([\d.]+) ms",
        lambda ms: float(ms) < 100,
        "< 100 ms",
    ),
    *(
        Target(
            f"one-shot {command}",
            "cli",
            rf"^sessionwatch {re.escape(command)}: .* ([\d.]+)x the floor",
            lambda ratio: float(ratio) <= 1.4,
            "<= 1.4x python -c 'import sqlite3, orjson'",
        )
        for command in ("status", "record", "notices --drain", "status, next to OpenClaw")
    ),
    *(
        Target(
            f"whole-process replay, {order} key order",
            "cli",
            rf"^replay of .*\({re.escape(order)} key order\).*ratio ([\d.]+)",
            lambda ratio: float(ratio) >= 1.5,
            ">= 1.5x a plain orjson loop",
        )
        for order in ("old", "2.1")
    ),
    Target(
        "100 idle notice streams",
        "streams",
        r"^ this tree: 100 streams cost ([\d.]+)x one",
        lambda ratio: float(ratio) <= 1.5,
        "<= 1.5x one stream",
    ),
    Target(
        "a prompt on a node over TLS",
        "node_latency",
        r"^node over TLS / local, p99, worst kind: ratio ([\d.]+)",
        lambda ratio: float(ratio) <= 2.0,
        "p99 <= 2x the local p99, each kind",
    ),
]


def arguments(quick: bool) -> dict[str, list[str]]:
    if quick:
        return {
            "service": ["--requests", "1000", "--rounds", "1", "--samples", "3"],
            "kernel": ["--events", "1000", "--samples", "500"],
            "cli": ["--runs", "5", "--replay-mb", "50"],
            "streams": ["--seconds", "5"],
            "node_latency": ["--samples", "10"],
        }
    return {
        "service": ["--requests", "3000", "--rounds", "3", "--samples", "10"],
        "kernel": ["--events", "3000"],
        "cli": ["--runs", "9", "--replay-mb", "200"],
        "streams": ["--seconds", "20"],
        "node_latency": ["--samples", "30"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads, noisier")
    a = parser.parse_args()
    outputs: dict[str, str] = {}
    for bench, extra in arguments(a.quick).items():
        print(f"running bench/{bench}.py {' '.join(extra)}", file=sys.stderr, flush=True)
        done = subprocess.run(
            [sys.executable, str(BENCH / f"{bench}.py"), *extra],
            capture_output=True,
            text=True,
            check=False,
        )
        outputs[bench] = done.stdout
        if done.returncode != 0:
            print(f"bench/{bench}.py failed:\n{done.stderr[-2000:]}", file=sys.stderr)
    missed = 0
    for target in TARGETS:
        found = re.search(target.pattern, outputs.get(target.bench, ""), re.MULTILINE)
        if found is None:
            print(f"{target.what:32} no figure from bench/{target.bench}.py   MISSED")
            missed += 1
            continue
        ok = target.holds(*found.groups())
        missed += not ok
        figure = " / ".join(found.groups())
        print(f"{target.what:32} {figure:>14}  target {target.shown:44} {'ok' if ok else 'MISSED'}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
