"""Log lines written per hour by an idle ``serve``: 100 adopted, watched links at a 1-second
tick, half of them unreachable (led outside the roots), nothing typed. Today's tree against
an earlier release built from the project's history (``git archive``), in the same run.

Run: python bench/log_growth.py [--seconds 120] [--links 100] [--baseline c1dd981]

Each ``serve`` runs for ``--seconds`` after its start-up lines; the lines it wrote after
start-up are counted and scaled to an hour.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trees import REPO, source_of


def lines_per_hour(src: Path, work: Path, links: int, seconds: float) -> tuple[int, float]:
    work.mkdir(parents=True)
    root, outside = work / "claude" / "p", work / "outside"
    root.mkdir(parents=True)
    outside.mkdir()
    config = work / "c.toml"
    config.write_text(
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{work / "token"}"\n'
        f'[roots]\nclaude = "{work / "claude"}"\n'
        "[monitor]\ninterval_s = 1\ninitial_delay_s = 1\n"
    )
    env = {**os.environ, "PYTHONPATH": str(src)}
    base = [sys.executable, "-m", "monitor", "--db", str(work / "state.db"), "--config"]

    def cli(*args: str) -> None:
        subprocess.run([*base, str(config), *args], env=env, cwd=src, check=True,
                       capture_output=True)  # fmt: skip

    for n in range(links):
        path = root / f"s{n}.jsonl"
        path.write_bytes(b'{"type":"user","uuid":"u0","message":{"role":"user","content":"x"}}\n')
        key = f"agent:main:adopted:s{n}"
        cli("adopt", "--kind", "claude", "--path", str(path), "--session-key", key,
            "--session-id", f"s{n}")  # fmt: skip
        cli("watch", "--watcher", "agent:main:main", "--target", key)
        if n % 2:  # from now on it leads outside the roots: every check is inconclusive
            (outside / path.name).write_bytes(path.read_bytes())
            path.unlink()
            path.symlink_to(outside / path.name)
    log = work / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*base, str(config), "serve"], env=env, cwd=src, stderr=out)
        try:
            while not re.search(r"serving .* on http", log.read_text()):
                if proc.poll() is not None:
                    raise RuntimeError("serve exited: " + log.read_text())
                time.sleep(0.1)
            time.sleep(3)  # the first ticks say each link's state once
            start = log.read_text().count("\n")
            time.sleep(seconds)
            end = log.read_text().count("\n")
        finally:
            proc.terminate()
            proc.wait()
    return end - start, (end - start) * 3600 / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--links", type=int, default=100)
    parser.add_argument("--baseline", default="c1dd981")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        runs = {
            f"release {args.baseline}": source_of(args.baseline, tmp / "baseline"),
            "this tree": REPO,
        }
        print(
            f"idle serve, {args.links} links (half unreachable), a tick every second,"
            f" {args.seconds:g} s each after start-up:"
        )
        for name, src in runs.items():
            lines, hourly = lines_per_hour(src, tmp / name.replace(" ", "-"), args.links,
                                           args.seconds)  # fmt: skip
            print(f"  {name}: {lines} lines, {hourly:,.0f} lines per hour")


if __name__ == "__main__":
    main()
