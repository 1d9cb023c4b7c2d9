"""CLI start-up: whole-process time of the one-shot commands against Python's floor.

Run: python bench/cli.py [--runs 15] [--replay-mb 200]

Each command runs as a fresh process (the installed ``sessionwatch`` entry point, as a
gateway or a hook would shell out to it) ``--runs`` times, interleaved with the floor,
``python -c "import sqlite3, orjson"``; the median of each is compared. Target: at most
1.4x the floor for ``status``, ``record`` and ``notices --drain`` (it was 2x).

The floor's modules come compiled (``.pyc``), as ``pip install .`` leaves ours. An editable
install under ``PYTHONDONTWRITEBYTECODE=1`` (this workplace sets it) keeps no bytecode, so
every run would compile sessionwatch's modules anew (about 25 ms here): the bench compiles
them first (``compileall``, which that variable does not stop), and says whether it did.

The replay part writes a Claude transcript of ``--replay-mb`` MB (bench/monitor.py's
realistic generator) and times ``sessionwatch replay`` on it as a whole process against a
plain process that parses every line with orjson (target: at least as fast, a ratio of 1.0
or more).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
PLAIN_PARSE = """
import sys, orjson
n = 0
with open(sys.argv[1], "rb") as f:
    for line in f:
        orjson.loads(line)
        n += 1
print(n)
"""


def _time(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def _entry_point() -> str:
    found = shutil.which("sessionwatch", path=os.path.dirname(sys.executable))
    return found or shutil.which("sessionwatch") or "sessionwatch"


def bench_commands(runs: int, tmp: Path) -> None:
    env = {**os.environ, "SESSIONWATCH_DB": str(tmp / "state.db")}
    sw = _entry_point()
    child = "agent:main:subagent:bench"
    subprocess.run(
        [sw, "spawn", "--parent", "agent:main:main", "--child", child, "--run-id", "r"],
        check=True,
        stdout=subprocess.DEVNULL,
        env=env,
    )
    commands = {
        "status": [sw, "status", child, "--changes-since", "0"],
        "record": [
            sw,
            "record",
            "--session",
            child,
            "--kind",
            "human_direct_message",
            "--actor",
            "human",
        ],
        "notices --drain": [sw, "notices", "--watcher", "agent:main:main", "--drain"],
    }
    floor_argv = [sys.executable, "-c", "import sqlite3, orjson"]
    times: dict[str, list[float]] = {name: [] for name in ["floor", *commands]}
    for _ in range(runs):
        for name, argv in [("floor", floor_argv), *commands.items()]:
            times[name].append(_time(argv, env))
    floor = statistics.median(times["floor"])
    print(f"floor (python -c 'import sqlite3, orjson'): {floor * 1000:.0f} ms median of {runs}")
    for name in commands:
        median = statistics.median(times[name])
        print(
            f"sessionwatch {name}: {median * 1000:.0f} ms, {median / floor:.2f}x the floor"
            " (target <= 1.4x)"
        )


def compile_ours() -> int:
    """Compile the packages the entry point imports, as ``pip install .`` does; how many
    modules had no bytecode."""
    import compileall

    # Run as a script, this folder is first on sys.path, and bench/monitor.py is not ours.
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
    missing = 0
    for name in ("monitor", "adapters"):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations is not None
        for folder in spec.submodule_search_locations:
            for source in Path(folder).rglob("*.py"):
                cached = importlib.util.cache_from_source(str(source))
                missing += not os.path.exists(cached)
            compileall.compile_dir(folder, quiet=1)
    return missing


def _generate(path: Path, megabytes: int) -> None:
    """bench/monitor.py's realistic Claude transcript (prompts, assistant blocks, tool calls
    and results, progress, snapshots)."""
    spec = importlib.util.spec_from_file_location("bench_monitor", BENCH / "monitor.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.generate(path, megabytes)


def bench_replay(megabytes: int, tmp: Path) -> None:
    path = tmp / "big.jsonl"
    _generate(path, megabytes)
    size = path.stat().st_size / 1024 / 1024
    plain = [sys.executable, "-c", PLAIN_PARSE, str(path)]
    ours = [_entry_point(), "replay", "--adapter", "claude", str(path)]
    env = dict(os.environ)
    _time(plain, env)  # warm the page cache
    t_plain = min(_time(plain, env) for _ in range(2))
    t_ours = min(_time(ours, env) for _ in range(2))
    print(
        f"replay of {size:.0f} MB as a whole process: {t_ours:.2f} s; a plain orjson loop over"
        f" every line {t_plain:.2f} s; ratio {t_plain / t_ours:.2f} (target >= 1.0)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--replay-mb", type=int, default=200)
    args = parser.parse_args()
    missing = compile_ours()
    print(f"bytecode: {missing} of sessionwatch's modules had none and were compiled first")
    with tempfile.TemporaryDirectory() as tmp:
        bench_commands(args.runs, Path(tmp))
        if args.replay_mb:
            bench_replay(args.replay_mb, Path(tmp))


if __name__ == "__main__":
    main()
