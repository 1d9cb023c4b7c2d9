"""Every speed target once, each against its baseline in the same run, and whether it holds.

Run before any change to the store, the API or the CLI's start-up (docs/performance.md):

    python bench/targets.py [--quick] [--against d4ce48e] [--rounds 2] [--only service,cli]

It runs the benches below as they are run by hand, reads the ratio each prints, and prints
one line per target: the figure, the target, and ``ok`` or ``MISSED``. It exits 1 when a
target is missed, so a change that makes one thing faster and another slower is seen before
it lands. ``--quick`` runs smaller workloads (noisier; for a first look). The start-up
floor is ``python -c "import sqlite3, orjson"``.

``--against REF`` also runs every bench on a git worktree of an earlier release, its own
bench scripts on its own code, interleaved with this tree's (bench by bench, ``--rounds``
times each, the order flipping each round, so that both see the same moments of the
machine). Each side's best figure of its rounds is compared (the target's own figure, or
an absolute one where the target is a ratio to an in-run baseline that itself got faster:
the CPU of 100 idle streams, the node's worst p99), and a figure more than ``NOISE`` (10 %)
worse than the release's is ``WORSE``, and the exit status is 1.

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
| an OpenCode prompt to its wake: p99 < 1 s (Claude's: < 250 ms) | bench/opencode_wake.py |
| a prompt in a Codex thread the gateway adopted, to its wake: p99 < 250 ms | bench/codex_wake.py |
| a prompt behind 50 MiB of tool output, to its notice: under 2 s | bench/burst.py |
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from trees import REPO, worktree

NOISE = 0.10  # against a release: how much worse a figure may be before it counts


def _largest(pattern: str, output: str) -> float | None:
    """The largest figure ``pattern`` finds in ``output`` (None when it finds none)."""
    found = [float(f) for f in re.findall(pattern, output, re.MULTILINE)]
    return max(found) if found else None


class Target(NamedTuple):
    what: str
    bench: str
    pattern: str  # a regex over the bench's output; its groups are the figure
    holds: Callable[..., bool]
    shown: str  # the target, in words
    higher: bool = False  # against a release: whether a higher figure is the better one
    compared: int = -1  # ... and which of the pattern's groups is compared
    # ... or the figure compared, read from the whole output (when a ratio to an in-run
    # baseline would mislead: the baseline itself got faster)
    versus: Callable[[str], float | None] | None = None


TARGETS = [
    Target(
        "POST /v1/events, 50 clients",
        "service",
        r"^POST /v1/events: .*p99 ([\d.]+) ms;.*ratio ([\d.]+)",
        lambda p99, ratio: float(ratio) >= 0.30 and float(p99) < 50,
        ">= 0.30x bare aiohttp, p99 < 50 ms",
        higher=True,
    ),
    Target(
        "one event at a time",
        "kernel",
        r"^\(a\) .*ratio ([\d.]+)",
        lambda ratio: float(ratio) >= 0.5,
        ">= 0.5x plain sqlite3",
        higher=True,
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
            higher=True,
        )
        for order in ("old", "2.1")
    ),
    Target(
        "100 idle notice streams",
        "streams",
        r"^ this tree: 100 streams cost ([\d.]+)x one",
        lambda ratio: float(ratio) <= 1.5,
        "<= 1.5x one stream",
        versus=lambda out: _largest(r"^ this tree: +100 streams: idle +([\d.]+) ms CPU/s", out),
    ),
    Target(
        "a prompt on a node over TLS",
        "node_latency",
        r"^node over TLS / local, p99, worst kind: ratio ([\d.]+)",
        lambda ratio: float(ratio) <= 2.0,
        "p99 <= 2x the local p99, each kind",
        versus=lambda out: _largest(r"node over TLS median +\d+ ms p99 +(\d+) ms", out),
    ),
    Target(
        "Claude append to wake",
        "opencode_wake",
        r"^claude +write to wake, .*p99 (\d+) ms",
        lambda p99: float(p99) < 250,
        "p99 < 250 ms",
    ),
    Target(
        "Codex (gateway's link) to wake",
        "codex_wake",
        r"^typed to wake \(codex-app-server\) +\d+ samples: .*p99 (\d+) ms",
        lambda p99: float(p99) < 250,
        "p99 < 250 ms",
    ),
    Target(
        "a prompt behind 50 MiB of output",
        "burst",
        r"^behind \d+ MiB: median \d+ ms, worst (\d+) ms",
        lambda worst: float(worst) < 2000,
        "under 2 s",
    ),
    Target(
        "OpenCode write to wake",
        "opencode_wake",
        r"^opencode +write to wake, .*p99 (\d+) ms",
        lambda p99: float(p99) < 1000,
        "p99 < 1000 ms",
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
            "opencode_wake": ["--samples", "10"],
            "codex_wake": ["--samples", "10"],
            "burst": ["--mib", "10", "--samples", "1"],
        }
    return {
        "service": ["--requests", "3000", "--rounds", "3", "--samples", "10"],
        "kernel": ["--events", "3000"],
        "cli": ["--runs", "9", "--replay-mb", "200"],
        "streams": ["--seconds", "20"],
        "node_latency": ["--samples", "30"],
        "opencode_wake": ["--samples", "30"],
        "codex_wake": ["--samples", "30"],
        "burst": ["--mib", "50", "--samples", "3"],
    }


def run(tree: Path, bench: str, extra: list[str]) -> str:
    """One bench of ``tree``, on ``tree``'s own code; its output (its failure said)."""
    print(f"running bench/{bench}.py {' '.join(extra)} in {tree}", file=sys.stderr, flush=True)
    done = subprocess.run(
        [sys.executable, str(tree / "bench" / f"{bench}.py"), *extra],
        capture_output=True,
        text=True,
        check=False,
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    if done.returncode != 0:
        print(f"bench/{bench}.py failed in {tree}:\n{done.stderr[-2000:]}", file=sys.stderr)
    return done.stdout


def figures(target: Target, outputs: list[str]) -> list[tuple[str, ...]]:
    """The target's figures in each output that has them."""
    found = (re.search(target.pattern, out, re.MULTILINE) for out in outputs)
    return [f.groups() for f in found if f is not None]


def compared(target: Target, outputs: list[str]) -> float | None:
    """The figure compared against a release: the best of the rounds."""
    if target.versus is not None:
        values = [v for v in map(target.versus, outputs) if v is not None]
    else:
        values = [float(groups[target.compared]) for groups in figures(target, outputs)]
    if not values:
        return None
    return max(values) if target.higher else min(values)


def best(target: Target, found: list[tuple[str, ...]]) -> tuple[str, ...]:
    """The round whose compared figure is the best."""
    pick = max if target.higher else min
    return pick(found, key=lambda groups: float(groups[target.compared]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads, noisier")
    parser.add_argument("--against", default="", help="a git ref to run alongside")
    parser.add_argument("--rounds", type=int, default=2, help="with --against: rounds each")
    parser.add_argument("--only", default="", help="these benches, comma-separated")
    a = parser.parse_args()
    only = set(filter(None, a.only.split(",")))
    rounds = max(a.rounds, 1) if a.against else 1
    outputs: dict[str, dict[str, list[str]]] = {"this tree": {}, a.against: {}}
    with contextlib.ExitStack() as stack:
        trees = {"this tree": REPO}
        if a.against:
            trees[a.against] = stack.enter_context(worktree(a.against))
        for bench, extra in arguments(a.quick).items():
            if only and bench not in only:
                continue
            for n in range(rounds):
                order = list(trees.items()) if n % 2 == 0 else list(trees.items())[::-1]
                for name, tree in order:
                    outputs[name].setdefault(bench, []).append(run(tree, bench, extra))
    missed = 0
    for target in TARGETS:
        if only and target.bench not in only:
            continue
        ours = figures(target, outputs["this tree"].get(target.bench, []))
        if not ours:
            print(f"{target.what:32} no figure from bench/{target.bench}.py   MISSED")
            missed += 1
            continue
        groups = best(target, ours)
        ok = target.holds(*groups)
        missed += not ok
        line = f"{target.what:32} {' / '.join(groups):>14}  target {target.shown:44}"
        line += " ok" if ok else " MISSED"
        if a.against:
            mine = compared(target, outputs["this tree"].get(target.bench, []))
            base = compared(target, outputs[a.against].get(target.bench, []))
            if mine is None or base is None:
                line += f"  {a.against}: no figure"
            else:
                worse = mine < base * (1 - NOISE) if target.higher else mine > base * (1 + NOISE)
                missed += worse
                line += f"  compared {mine:g} against {base:g}: {'WORSE' if worse else 'no worse'}"
        print(line)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
