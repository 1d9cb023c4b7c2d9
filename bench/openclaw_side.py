"""OpenClaw's own code beside ours, on the same inputs, in interleaved rounds of one run.

Run: python bench/openclaw_side.py [--rounds 3] [--samples 1000] [--events 3000]

OpenClaw's compiled functions run under Node 24 through ``tests/interop/openclaw_driver.mjs``
(each call timed inside Node, so Node's start-up is not counted); ours run in this process.
Needs ``tests/interop/install.sh`` (``SESSIONWATCH_INTEROP_DIR``, default
``~/.cache/sessionwatch/interop``).

(a) changesSince: one database of 50,000 events over 200 sessions, made by OpenClaw and
    shared by both. Each call asks a session for its events after a version ``back`` of
    its own events ago (200: a full page; 10: a few). OpenClaw: ``listSessionStateEventsSince``
    (what its ``session_status`` tool calls). Ours: the API's answer, JSON built by the
    database (``Kernel.changes_answer``), and the answer as it was made before: the rows
    (``Kernel.status``), then the JSON in Python (``wire.status``, ``models.answer``).
(b) recording, one event at a time on a target with 10 watchers: OpenClaw's
    ``recordSessionStateEvent`` against ``Kernel.record`` (as ``bench/kernel.py`` (d)).
(c) Claude classification of a generated transcript (``--mb``, bench/monitor.py's realistic
    generator, or ``--transcript``), checked from its start to its end one scan cap (1 MiB) at
    a time, each check from the marker the one before it left. OpenClaw:
    ``checkClaudeUpstreamActivity`` (what its Claude provider's ``checkUpstreamActivity``
    runs for a local link). Ours: the monitor's own check of a link, ``check_file`` (read,
    pre-filter, parse, classify, the next marker). Both count the same turns. Each round
    takes each side's best of ``--passes``, the two taking turns going first; the median of
    the rounds' ratios is printed with its range, and the ratio of the two sides' best
    passes over the whole run: on a shared machine a neighbour only ever slows a pass down,
    so the best pass is the closest to the code's own speed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run as a script, this folder is first on sys.path and bench/monitor.py would shadow the
# ``monitor`` package; take it off.
sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).parent.resolve()]

from adapters import claude  # noqa: E402
from adapters.base import OwnPool, Probe  # noqa: E402
from adapters.jsonl_check import TailSettings, check_file  # noqa: E402
from adapters.jsonl_scan import scan, select  # noqa: E402
from monitor.clock import now_ms  # noqa: E402
from monitor.kernel import Kernel  # noqa: E402
from monitor.web import models, wire  # noqa: E402

BENCH = Path(__file__).resolve().parent
sys.path.append(str(BENCH))
from kernel import INTEROP, NODE, OPENCLAW, kernel_async, openclaw_records, run_openclaw  # noqa: E402

ROWS = 50_000
SESSIONS = 200


def fill(state: Path) -> Path:
    """OpenClaw makes its database; the events go in as it would write them."""
    watch = {"watcherSessionKey": "agent:main:main", "targetSessionKey": "agent:main:none"}
    run_openclaw(state, [{"fn": "registerSessionStateWatch", "args": [watch]}])
    db = state / "state" / "openclaw.sqlite"
    conn = sqlite3.connect(db)
    now = now_ms()
    with conn:
        conn.executemany(
            "INSERT INTO session_state_events (session_key, agent_id, kind, actor_type,"
            " occurred_at, summary, payload_json) VALUES (?, 'main', 'human_direct_message',"
            " 'human', ?, 'human message via bench', '{\"channel\":\"bench\"}')",
            ((f"agent:main:s{i % SESSIONS}", now) for i in range(ROWS)),
        )
        conn.execute(
            "INSERT INTO session_state_heads (session_key, agent_id, last_sequence,"
            " pruned_max_sequence, updated_at) SELECT session_key, agent_id, max(sequence), 0,"
            " ? FROM session_state_events GROUP BY session_key, agent_id",
            (now,),
        )
    conn.close()
    return db


def queries(db: Path, back: int, samples: int, seed: int) -> list[tuple[str, int]]:
    """(session, since): the version ``back`` of the session's own events ago."""
    conn = sqlite3.connect(db)
    starts = dict(
        conn.execute(
            "SELECT session_key, sequence FROM (SELECT session_key, sequence, row_number()"
            " OVER (PARTITION BY session_key ORDER BY sequence DESC) AS n"
            " FROM session_state_events) WHERE n = ?",
            (back + 1,),
        ).fetchall()
    )
    conn.close()
    rng = random.Random(seed)
    keys = sorted(starts)
    return [(k, starts[k]) for k in (rng.choice(keys) for _ in range(samples))]


async def ours(db: Path, asked: list[tuple[str, int]]) -> tuple[list[float], list[float]]:
    """Each way of answering over every query in turn, as OpenClaw's calls and the floor's
    run: one way's calls interleaved with the other's would time each with the caches the
    other left."""
    kernel = await Kernel.open(db)
    built: list[float] = []
    rows: list[float] = []
    try:
        for key, since in asked:
            start = time.perf_counter()
            await kernel.changes_answer(key, agent_id="main", since=since)
            built.append((time.perf_counter() - start) * 1000)
        for key, since in asked:
            start = time.perf_counter()
            found = await kernel.status(key, agent_id="main", changes_since=since)
            models.answer(models.Status, wire.status(found))
            rows.append((time.perf_counter() - start) * 1000)
    finally:
        await kernel.close()
    return built, rows


FLOOR_SQL = (
    "SELECT sequence, session_key, agent_id, kind, actor_type, actor_id, session_id, run_id,"
    " occurred_at, summary, payload_json, dedupe_key FROM session_state_events"
    " WHERE session_key = ? AND agent_id = 'main' AND sequence > ? ORDER BY sequence LIMIT 201"
)


def floor(db: Path, asked: list[tuple[str, int]]) -> list[float]:
    """The page's rows, read by sqlite3 alone in one statement: what any reader pays."""
    conn = sqlite3.connect(db)
    out = []
    for key, since in asked:
        start = time.perf_counter()
        conn.execute(FLOOR_SQL, (key, since)).fetchall()
        out.append((time.perf_counter() - start) * 1000)
    conn.close()
    return out


def theirs(state: Path, asked: list[tuple[str, int]]) -> list[float]:
    each = [[key, "main", since, 200] for key, since in asked]
    (result,) = run_openclaw(state, [{"fn": "listSessionStateEventsSince", "each": each}])
    assert len(result["last"]["events"]) > 0
    return [float(x) for x in result["ms"]]


CAP = 1 << 20  # both sides' scan cap


def transcript(path: Path, megabytes: int, order: str) -> None:
    spec = importlib.util.spec_from_file_location("bench_monitor", BENCH / "monitor.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.generate(path, megabytes, order)


def checked_from(path: Path) -> list[int]:
    """The markers a check from 0 steps through: up to the last line end of each cap."""
    data = path.read_bytes()
    out, offset = [], 0
    while offset < len(data):
        nl = data.rfind(b"\n", offset, offset + CAP)
        if nl < 0:
            raise SystemExit(f"{path}: a line longer than {CAP} bytes at {offset}")
        out.append(offset)
        offset = nl + 1
    return out


def classify_theirs(state: Path, path: Path, markers: list[int], passes: int) -> tuple[float, int]:
    """OpenClaw's check over the whole transcript, ``passes`` times in one Node process:
    the best pass's seconds, the turns found."""
    each = [
        [
            [
                {
                    "sessionKey": "agent:main:bench",
                    "hostId": "gateway:local",
                    "threadId": "bench",
                    "upstreamKind": "claude-cli",
                    "upstreamRef": {"filePath": str(path)},
                    "marker": {"offset": m},
                    "ownRecentUserTexts": [],
                }
            ]
        ]
        for m in markers
    ]
    op = {"fn": "checkClaudeUpstreamActivity", "each": each, "keep": True}
    results = run_openclaw(state, [op] * passes)
    turns = {sum(a["humanTurns"] for found in r["all"] for a in found) for r in results}
    assert len(turns) == 1, turns
    return min(sum(r["ms"]) for r in results) / 1000, turns.pop()


def classify_ours(path: Path, passes: int) -> tuple[float, int]:
    """The monitor's check over the whole transcript, ``passes`` times: the best pass's
    seconds, the turns found."""
    settings = TailSettings(cap=CAP)
    best = float("inf")
    for _ in range(passes):
        marker: dict[str, Any] = {"offset": 0}
        turns = 0
        elapsed = 0.0
        while True:
            probe = Probe(
                session_key="agent:main:bench", ref={"filePath": str(path)}, marker=marker
            )
            start = time.perf_counter()
            outcome = check_file(claude.FORMAT, probe, settings, {})
            elapsed += time.perf_counter() - start
            turns += len(outcome.turns)
            if outcome.marker is None or outcome.marker == marker:
                break
            marker = outcome.marker
        best = min(best, elapsed)
    return best, turns


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--events", type=int, default=3000, help="recorded per side (b)")
    parser.add_argument("--mb", type=int, default=150, help="the transcript's size (c)")
    parser.add_argument(
        "--order",
        choices=["old", "2.1"],
        action="append",
        help="the generated transcript's key order (c): older releases', or Claude Code"
        " 2.1.332's; repeat for both (default: both)",
    )
    parser.add_argument("--transcript", type=Path, help="classify this one instead (c)")
    parser.add_argument(
        "--passes", type=int, default=3, help="each side's passes over it a round, best kept (c)"
    )
    parser.add_argument("--only", choices=["a", "b", "c"], help="run one part")
    args = parser.parse_args()
    if not (NODE.exists() and (OPENCLAW / "dist").is_dir()):
        raise SystemExit(f"OpenClaw's package is not installed in {INTEROP}")
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "openclaw-state"
        db = fill(state)
        for back in (200, 10) if args.only in (None, "a") else ():
            oc: list[float] = []
            built: list[float] = []
            rows: list[float] = []
            bare: list[float] = []
            for r in range(args.rounds):
                asked = queries(db, back, args.samples, seed=r)
                oc += theirs(state, asked)
                bare += floor(db, asked)
                b, w = asyncio.run(ours(db, asked))
                built += b
                rows += w
            o50, o99 = statistics.median(oc), pct(oc, 0.99)
            pairs = (
                ("JSON by the database", built),
                ("rows, JSON in Python (before)", rows),
                ("floor: the rows by sqlite3 alone", bare),
            )
            for name, mine in pairs:
                m50, m99 = statistics.median(mine), pct(mine, 0.99)
                print(
                    f"(a) changesSince {back} events back, {name}: p50 {m50:.3f} ms, p99"
                    f" {m99:.3f} ms; OpenClaw p50 {o50:.3f} ms, p99 {o99:.3f} ms; ratio"
                    f" p50 {o50 / m50:.1f}x, p99 {o99 / m99:.1f}x (target >= 5x)"
                )
        recorded: list[tuple[float, float]] = []
        for r in range(args.rounds if args.only in (None, "b") else 0):
            (Path(tmp) / f"rec{r}").mkdir()
            theirs_rate = openclaw_records(Path(tmp) / f"rec{r}", args.events)
            assert theirs_rate is not None
            ours_rate = asyncio.run(kernel_async(Path(tmp) / f"rec{r}.db", args.events))
            recorded.append((ours_rate, theirs_rate))
        if recorded:
            ratios = sorted(o / t for o, t in recorded)
            each = ", ".join(f"{x:.2f}" for x in ratios)
            print(
                f"(b) recording, 10 watchers: ours"
                f" {statistics.median(o for o, _ in recorded):,.0f} events/s, OpenClaw"
                f" {statistics.median(t for _, t in recorded):,.0f}; ratio"
                f" {statistics.median(ratios):.2f}x (rounds {each}; target >= 4x)"
            )
        if args.only in (None, "c"):
            classification(args, state, Path(tmp))


def classification(args: argparse.Namespace, state: Path, tmp: Path) -> None:
    if args.transcript is not None:
        classify_one(args, state, args.transcript, str(args.transcript))
        return
    for order in args.order or ["old", "2.1"]:
        path = tmp / f"claude-{order}.jsonl"
        transcript(path, args.mb, order)
        classify_one(args, state, path, f"generated, {order} key order")
        path.unlink()


def classify_one(args: argparse.Namespace, state: Path, path: Path, name: str) -> None:
    size = path.stat().st_size
    markers = checked_from(path)
    path.read_bytes()  # in the page cache for both
    pairs = []
    for r in range(args.rounds):  # each side goes first in every other round
        if r % 2:
            t_ours, n_ours = classify_ours(path, args.passes)
        t_theirs, n_theirs = classify_theirs(state, path, markers, args.passes)
        if not r % 2:
            t_ours, n_ours = classify_ours(path, args.passes)
        if n_ours != n_theirs:
            print(f"(c) the two found different turns: ours {n_ours}, OpenClaw {n_theirs}")
        pairs.append((t_ours, t_theirs))
    ratios = sorted(t / o for o, t in pairs)
    ours_rate = size / min(o for o, _ in pairs) / 1e6
    theirs_rate = size / min(t for _, t in pairs) / 1e6
    print(
        f"(c) Claude classification of {size / 1e6:.0f} MB ({name}), {len(markers)} checks,"
        f" {n_ours} turns: ours {ours_rate:,.0f} MB/s, OpenClaw checkUpstreamActivity"
        f" {theirs_rate:,.0f} MB/s (best passes); ratio {statistics.median(ratios):.2f}x"
        f" (rounds {', '.join(f'{x:.2f}' for x in ratios)}; target >= 5x); ratio of the"
        f" two best passes {ours_rate / theirs_rate:.2f}x"
    )
    parts = classify_parts(path, markers, args.passes)
    theirs_best = min(t for _, t in pairs)
    print(
        "(c)   where ours goes, each step alone and best of the passes (OpenClaw's best"
        " over it): "
        + "; ".join(f"{what} {t * 1000:.1f} ms ({theirs_best / t:.1f}x)" for what, t in parts)
    )


def classify_parts(path: Path, markers: list[int], passes: int) -> list[tuple[str, float]]:
    """The check's steps timed alone over the same scan caps: reading them, visiting every
    line (its end found, its shape looked at), one head search a line (the pre-filter's
    first step), the whole pre-filter (:func:`select`), and the parse and classification of
    the lines it lets through."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        for m in markers:
            chunk = os.pread(fd, CAP, m)
            chunks.append(chunk[: chunk.rfind(b"\n") + 1])
    finally:
        os.close(fd)
    fmt = claude.FORMAT
    picks = [select(fmt, c, 0, len(c)) for c in chunks]

    def read() -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            for m in markers:
                os.pread(fd, CAP, m)
        finally:
            os.close(fd)

    def visit(search: Callable[[bytes, int, int], object] | None) -> Callable[[], None]:
        def run() -> None:
            for chunk in chunks:
                pos, stop, find = 0, len(chunk), chunk.find
                while pos < stop:
                    start, end = pos, find(b"\n", pos)
                    pos = end + 1
                    if chunk[start] == 0x7B and chunk[end - 1] == 0x7D and search is not None:
                        search(chunk, start, min(end, start + claude.HEAD))

        return run

    def scanned() -> None:
        for pick in picks:
            scan(fmt, pick.lines, fmt.state_from_marker({}), OwnPool(), prefiltered=True)

    steps: list[tuple[str, Callable[[], object]]] = [
        ("reading", read),
        ("visiting the lines", visit(None)),
        ("with one head search", visit(claude._HEAD.search)),
        ("the pre-filter", lambda: [select(fmt, c, 0, len(c)) for c in chunks]),
        ("parsing and classifying", scanned),
    ]
    out = []
    for what, step in steps:
        best = float("inf")
        for _ in range(passes):
            start = time.perf_counter()
            step()
            best = min(best, time.perf_counter() - start)
        out.append((what, best))
    return out


if __name__ == "__main__":
    main()
