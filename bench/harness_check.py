"""Classification of a session a real harness wrote (Codex, Pi), against parsing every line.

Run: python bench/harness_check.py [--harness codex] [--turns 80] [--mb 100] [--rounds 3]

The real harness (``codex exec``, ``pi --print``; ``tests/interop/install.sh``,
``SESSIONWATCH_INTEROP_DIR``) runs ``--turns`` turns on the mock model of the tests; three
turns in four, the model runs a command (Codex's ``exec_command``, Pi's ``bash``) whose
output is some 13 KB, as a working session's are. Codex 0.171.0 writes that output twice
(the call's output, and the command's completed item), and completes every other item of a
turn too. The session's lines after its first are repeated to ``--mb`` MB, and checked from
its start to its end one scan cap (1 MiB) at a time, each check from the marker the one
before left, as the monitor checks a link (``check_file``).
Against it, in the same rounds: the same check parsing every line (no pre-filter), and a
loop of ``orjson.loads`` over every line (the floor of issue 40's whole-process replay).
Each side's best pass of each round counts; the ratios are medians over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

# Run as a script, this folder is first on sys.path and bench/monitor.py would shadow the
# ``monitor`` package; take it off.
sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).parent.resolve()]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' harness driver

from adapters import codex, pi  # noqa: E402
from adapters.base import OwnPool, Probe  # noqa: E402
from adapters.jsonl_check import TailSettings, check_file  # noqa: E402
from adapters.jsonl_format import JsonlFormat  # noqa: E402
from adapters.jsonl_scan import scan, select  # noqa: E402
from tests.harnesses.harnesses import Harness, installed_version, why_not_runnable  # noqa: E402
from tests.interop.gateway_rig import MockModelProcess  # noqa: E402

CAP = 1 << 20
COMMAND = "seq 1 1500; head -c 6000 /etc/services"
FORMATS: dict[str, JsonlFormat[Any]] = {"codex": codex.FORMAT, "pi": pi.FORMAT}
TOOLS = {  # each harness's shell tool, as the model calls it
    "codex": {"name": "exec_command", "input": {"cmd": COMMAND}},
    "pi": {"name": "bash", "input": {"command": COMMAND}},
}


def session(kind: str, work: Path, turns: int) -> Path:
    """A session of ``turns`` turns written by the real harness ``kind``."""
    work.mkdir(parents=True)
    model = MockModelProcess(work)
    try:
        harness = Harness(kind, work, model)
        model.script(
            text=("I read the output; the listing looks complete. " * 30).strip(),
            tool={"when": "please run", **TOOLS[kind]},
        )
        for i in range(turns):
            harness.prompt(f"please run the listing, step {i}" if i % 4 else f"a word, step {i}")
    finally:
        model.stop()
    (found,) = harness.root()[1].rglob("*.jsonl")
    return found


def grown(source: Path, path: Path, megabytes: int) -> None:
    """``source``'s first line, then the rest again and again to ``megabytes`` MB."""
    first, _, body = source.read_bytes().partition(b"\n")
    with path.open("wb") as out:
        out.write(first + b"\n")
        written = len(first) + 1
        while written < megabytes * 1_000_000:
            out.write(body)
            written += len(body)


def check_all(path: Path, fmt: JsonlFormat[Any]) -> int:
    """The monitor's check from the start to the end: the turns found."""
    settings = TailSettings(cap=CAP)
    marker: dict[str, Any] = {"offset": 0}
    turns = 0
    while True:
        probe = Probe(session_key="agent:main:bench", ref={"filePath": str(path)}, marker=marker)
        outcome = check_file(fmt, probe, settings, {})
        turns += len(outcome.turns)
        if outcome.marker is None or outcome.marker == marker:
            return turns
        marker = outcome.marker


def parse_all(path: Path) -> int:
    lines = 0
    with path.open("rb") as f:
        for line in f:
            orjson.loads(line)
            lines += 1
    return lines


def parsed_bytes(path: Path, fmt: JsonlFormat[Any]) -> int:
    """The bytes of the lines the check parses, the file read from its start: counted as
    ``scan`` hands each line the pre-filter let through to the state's look (``idle``)."""
    data = path.read_bytes()
    first = orjson.loads(data[: data.index(b"\n")])
    parsed = 0
    idle = fmt.idle

    def counted(state: Any, line: bytes) -> bool:
        nonlocal parsed
        if idle is not None and idle(state, line):
            return True
        parsed += len(line)
        return False

    counting = fmt._replace(idle=counted)
    lines = select(fmt, data, 0, len(data)).lines
    scan(counting, lines, fmt.state_from_first(first), OwnPool(), prefiltered=True)
    return parsed


def best(fn: Callable[[Path], int], path: Path, passes: int) -> tuple[float, int]:
    times, found = [], set()
    for _ in range(passes):
        start = time.perf_counter()
        found.add(fn(path))
        times.append(time.perf_counter() - start)
    assert len(found) == 1, found
    return min(times), found.pop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--harness", choices=sorted(FORMATS), default="codex")
    parser.add_argument("--turns", type=int, default=80)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    kind = args.harness
    why = why_not_runnable(kind)
    if why:
        raise SystemExit(why)
    fmt = FORMATS[kind]
    with tempfile.TemporaryDirectory() as tmp:
        source = session(kind, Path(tmp) / kind, args.turns)
        path = Path(tmp) / "big.jsonl"
        grown(source, path, args.mb)
        size = path.stat().st_size / 1e6
        every = fmt._replace(prefilter=None, idle=None)
        print(
            f"a session of {args.turns} turns by {kind} {installed_version(kind)}"
            f" ({source.stat().st_size / 1e6:.1f} MB), repeated to {size:.0f} MB; bytes"
            f" parsed: {parsed_bytes(path, fmt) / path.stat().st_size:.1%}"
        )
        sides: dict[str, Callable[[Path], int]] = {
            "ours": lambda p: check_all(p, fmt),
            "ours, every line parsed": lambda p: check_all(p, every),
            "orjson.loads of every line": parse_all,
        }
        seconds: dict[str, list[float]] = {name: [] for name in sides}
        turns: dict[str, int] = {}
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                took, found = best(sides[name], path, args.passes)
                seconds[name].append(took)
                turns.setdefault(name, found)
        assert turns["ours"] == turns["ours, every line parsed"], turns
        floor = seconds["orjson.loads of every line"]
        for name, taken in seconds.items():
            ratios = sorted(f / t for f, t in zip(floor, taken, strict=True))
            each = ", ".join(f"{x:.2f}" for x in ratios)
            print(
                f"{name}: {size / statistics.median(taken):,.0f} MB/s;"
                f" {statistics.median(ratios):.2f}x the orjson loop (rounds {each})"
            )


if __name__ == "__main__":
    main()
