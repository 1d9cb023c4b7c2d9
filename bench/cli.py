"""CLI start-up: whole-process time of the one-shot commands against Python's floor.

Run: python bench/cli.py [--runs 9] [--replay-mb 200] [--baseline REV]

The commands run as ``pip install .`` leaves them: this tree's ``monitor`` and ``adapters``
are copied into the site-packages of a throwaway venv and compiled, with an entry-point
script like pip's; the venv reaches the dependencies through a path line to this
interpreter's site-packages. (An editable install would not do: its import hook loads
``pathlib`` in every process, the floor's included, and hides what our modules cost.)

Each command runs as a fresh process (as a gateway or a hook shells out to it) ``--runs``
times, interleaved with the floor, ``python -c "import sqlite3, orjson"``, and with the same
commands of ``--baseline`` (a git revision, installed the same way) when given. Best of the
runs against the floor's best; the medians are printed too. Target: at most 1.4x the floor
for ``status``, ``record`` and ``notices --drain``, and for ``status`` next to OpenClaw with
no configuration at all (the store found through ``$OPENCLAW_STATE_DIR``). ``status`` run
through ``main()`` with Python's own exit is printed too: the entry point (``run()``) skips
the interpreter's teardown, and that line shows what the teardown would add.

The replay part writes a Claude transcript of ``--replay-mb`` MB (bench/monitor.py's
realistic generator, in the key order of older releases and in Claude Code 2.1.332's) and
times ``sessionwatch replay`` on it as a whole process against a plain process that parses
every line with orjson, interleaved, best of ``--runs`` each (target: a ratio of 1.5 or
more); the ratio of the medians is printed too.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import io
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PLAIN_PARSE = """
import sys, orjson
n = 0
with open(sys.argv[1], "rb") as f:
    for line in f:
        orjson.loads(line)
        n += 1
print(n)
"""
# what pip writes for a console script
ENTRY_POINT = """#!{python}
import re
import sys
from {module} import {function}
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit({function}())
"""
KEY = "agent:main:subagent:bench"


def _time(argv: list[str], env: dict[str, str]) -> float:
    """One run, from the root directory: ``python -c`` puts the directory it runs in first
    on its path, and from this checkout that would import this tree's ``monitor`` into the
    baseline's interpreter."""
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env, cwd="/")
    return time.perf_counter() - start


def install(where: Path, revision: str | None = None) -> Path:
    """A venv holding this tree's packages (or ``revision``'s) as ``pip install .`` leaves
    them, compiled; its ``sessionwatch`` script."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    deps = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    (site / "bench-deps.pth").write_text("".join(f"{d}\n" for d in deps))
    if revision is None:
        pyproject = (REPO / "pyproject.toml").read_text()
        for package in ("monitor", "adapters"):
            shutil.copytree(
                REPO / package, site / package, ignore=shutil.ignore_patterns("__pycache__")
            )
    else:
        pyproject = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{revision}:pyproject.toml"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", revision, "monitor", "adapters"],
            check=True,
            capture_output=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(site, filter="data")
    for package in ("monitor", "adapters"):
        compileall.compile_dir(str(site / package), quiet=1)
    script = where / "bin" / "sessionwatch"
    entry = tomllib.loads(pyproject)["project"]["scripts"]["sessionwatch"]  # as pip reads it
    module, function = entry.split(":")
    script.write_text(ENTRY_POINT.format(python=python, module=module, function=function))
    script.chmod(0o755)
    return script


def _commands(sw: Path) -> dict[str, list[str]]:
    return {
        "status": [str(sw), "status", KEY, "--changes-since", "0"],
        "record": [
            *(str(sw), "record", "--session", KEY),
            *("--kind", "human_direct_message", "--actor", "human"),
        ],
        "notices --drain": [str(sw), "notices", "--watcher", "agent:main:main", "--drain"],
        "status, next to OpenClaw": [str(sw), "status", KEY],
        # not a target: what the interpreter's teardown costs, which run() skips
        "status, with Python's own exit": [
            str(sw.parent / "python"),
            *("-c", "import sys; from monitor.cli import main; sys.exit(main())"),
            *("status", KEY, "--changes-since", "0"),
        ],
    }


def bench_commands(runs: int, tmp: Path, ours: Path, baseline: str | None) -> None:
    """Each tree on databases of its own, made by itself (a tree refuses a schema newer
    than its own): a plain store, and an OpenClaw state directory whose database is the
    store."""
    trees = {"this tree": ours}
    if baseline:
        trees[baseline] = install(tmp / "base", baseline)
    python = str(ours.parent / "python")
    spawn = ["spawn", "--parent", "agent:main:main", "--child", KEY, "--run-id", "r"]
    plain: dict[str, dict[str, str]] = {}
    beside: dict[str, dict[str, str]] = {}
    for n, (tree, sw) in enumerate(trees.items()):
        env = {**os.environ, "SESSIONWATCH_DB": str(tmp / f"state-{n}.db")}
        env.pop("SESSIONWATCH_CONFIG", None)
        state = tmp / f"openclaw-{n}"  # an OpenClaw state directory whose database is the store
        (state / "state").mkdir(parents=True)
        openclaw = {k: v for k, v in env.items() if k != "SESSIONWATCH_DB"}
        openclaw["OPENCLAW_STATE_DIR"] = str(state)
        db = {**openclaw, "SESSIONWATCH_DB": str(state / "state" / "openclaw.sqlite")}
        for e in (env, db):
            subprocess.run([str(sw), *spawn], check=True, stdout=subprocess.DEVNULL, env=e)
        plain[tree], beside[tree] = env, openclaw
    floor_argv = [python, "-c", "import sqlite3, orjson"]
    plan = [("floor", floor_argv, plain["this tree"])]
    for tree, sw in trees.items():
        for name, argv in _commands(sw).items():
            e = beside[tree] if "OpenClaw" in name else plain[tree]
            plan.append((f"{tree}: {name}", argv, e))
    times: dict[str, list[float]] = {label: [] for label, _, _ in plan}
    for _ in range(runs):
        for label, argv, e in plan:
            times[label].append(_time(argv, e))
    floor, floor_median = min(times["floor"]), statistics.median(times["floor"])
    print(
        f"floor (python -c 'import sqlite3, orjson'): {floor * 1000:.1f} ms best of {runs},"
        f" median {floor_median * 1000:.1f} ms"
    )
    for tree in trees:
        for name in _commands(trees[tree]):
            best, median = (
                min(times[f"{tree}: {name}"]),
                statistics.median(times[f"{tree}: {name}"]),
            )
            line = (
                f"{best * 1000:.1f} ms best of {runs}, {best / floor:.2f}x the floor"
                f" (medians: {median * 1000:.1f} ms, {median / floor_median:.2f})"
            )
            if tree == "this tree":
                target = "" if "own exit" in name else " (target <= 1.4x)"
                print(f"sessionwatch {name}: {line}{target}")
            else:
                print(f"  {tree}: {name}: {line}")


def _generate(path: Path, megabytes: int, order: str) -> None:
    """bench/monitor.py's realistic Claude transcript (prompts, assistant blocks, tool calls
    and results, progress, snapshots), in one release's key order."""
    spec = importlib.util.spec_from_file_location("bench_monitor", BENCH / "monitor.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.generate(path, megabytes, order)


def bench_replay(megabytes: int, tmp: Path, ours_sw: Path, runs: int = 5) -> None:
    for order in ("old", "2.1"):
        path = tmp / f"big-{order}.jsonl"
        _generate(path, megabytes, order)
        size = path.stat().st_size / 1024 / 1024
        plain = [str(ours_sw.parent / "python"), "-c", PLAIN_PARSE, str(path)]
        ours = [str(ours_sw), "replay", "--adapter", "claude", str(path)]
        env = dict(os.environ)
        _time(plain, env)  # warm the page cache
        t_plain, t_ours = [], []
        for _ in range(runs):  # interleaved: the machine's drift falls on both
            t_plain.append(_time(plain, env))
            t_ours.append(_time(ours, env))
        medians = statistics.median(t_plain) / statistics.median(t_ours)
        print(
            f"replay of {size:.0f} MB ({order} key order) as a whole process: {min(t_ours):.2f} s;"
            f" a plain orjson loop over every line {min(t_plain):.2f} s (best of {runs}); ratio"
            f" {min(t_plain) / min(t_ours):.2f} (target >= 1.5; of the medians {medians:.2f})"
        )
        path.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--replay-mb", type=int, default=200)
    parser.add_argument(
        "--baseline", help="a git revision to run alongside, installed the same way"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ours = install(Path(tmp) / "ours")
        bench_commands(args.runs, Path(tmp), ours, args.baseline)
        if args.replay_mb:
            bench_replay(args.replay_mb, Path(tmp), ours, args.runs)


if __name__ == "__main__":
    main()
