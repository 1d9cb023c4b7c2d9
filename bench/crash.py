"""The crash loop at length: ``serve`` SIGKILLed N times while prompts are typed.

Run: python bench/crash.py [--cycles 1000] [--seed 1] [--write docs/reliability.md]

Each cycle starts ``serve`` on one database and kills it with SIGKILL at a moment drawn from
start-up, mid-tick, right after an append and during a burst (tests/crash_loop.py). At the
end every prompt written must be recorded exactly once and ``PRAGMA integrity_check`` must
say ok. Prints the figures; ``--write`` puts them in the reliability document's crash table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).parent.resolve()]
sys.path.insert(0, str(ROOT))

from tests.crash_loop import run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        verdict = run(Path(tmp), args.cycles, args.seed)
    elapsed = time.perf_counter() - start
    written = sum(verdict["written"].values())
    recorded = sum(verdict["recorded"].values())
    lost = sum(max(0, w - verdict["recorded"][k]) for k, w in verdict["written"].items())
    extra = sum(max(0, r - verdict["written"][k]) for k, r in verdict["recorded"].items())
    print(
        f"{args.cycles} SIGKILL cycles in {elapsed:.0f} s (seed {args.seed}):"
        f" {written} prompts written, {recorded} recorded, {lost} lost, {extra} repeated;"
        f" integrity_check {verdict['integrity']}; kill moments {verdict['moments']}"
    )
    print(f"per transcript written {verdict['written']} recorded {verdict['recorded']}")
    print(
        f"wakes: {verdict['opened']} notices opened, {len(verdict['never_woken'])} never"
        f" woken, {verdict['repeated']} woken twice (a call cut by a kill),"
        f" {len(verdict['woken_more_than_twice'])} more than twice"
    )
    if lost or extra or verdict["integrity"] != "ok":
        raise SystemExit(1)
    if verdict["never_woken"] or verdict["woken_more_than_twice"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
