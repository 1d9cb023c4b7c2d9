"""Monitor speed: replay throughput and the cost of a quiet tick.

Run: python bench/monitor.py [--mb 100] [--links 10000]

(a) replay (tailer + Claude classifier, 1 MiB ticks) over a generated Claude transcript,
    against a plain loop of ``orjson.loads`` over the same lines (the baseline);
(b) one tick over N watched links whose files did not grow, with the share spent in
    ``os.stat`` (measured as a bare stat loop over the same files).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import orjson

# Run as a script, this file's folder is first on sys.path and its name would shadow the
# ``monitor`` package; take it off.
sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).parent.resolve()]

from adapters.base import Settings  # noqa: E402
from adapters.registry import entry  # noqa: E402
from monitor.config import Config, RootsConfig  # noqa: E402
from monitor.kernel import Kernel  # noqa: E402
from monitor.upstream import UpstreamMonitor  # noqa: E402
from monitor.upstream.replay import replay  # noqa: E402


def claude_lines(rng: random.Random) -> list[bytes]:
    """One realistic turn, keys in Claude Code's order: a prompt, assistant blocks, tool
    calls and their results (message first, then ``toolUseResult``), progress, sidecars."""
    pad = "lorem ipsum dolor sit amet " * rng.randint(20, 400)
    head = {
        "parentUuid": "p",
        "isSidechain": False,
        "userType": "external",
        "cwd": "/w/project",
        "sessionId": "0b9c-41f2",
        "version": "2.1.34",
        "gitBranch": "main",
    }
    out: list[dict[str, object]] = [
        {
            **head,
            "type": "user",
            "message": {"role": "user", "content": "fix the tests"},
            "uuid": f"u{rng.random()}",
            "timestamp": "2026-03-01T10:00:00Z",
            "origin": {"kind": "human"},
        },
        {"type": "file-history-snapshot", "messageId": "m", "snapshot": {"files": pad[:200]}},
    ]
    for _ in range(rng.randint(2, 6)):
        out.append(
            {
                **head,
                "type": "assistant",
                "message": {
                    "role": "assistant",
                    "content": [{"type": "text", "text": pad}],
                    "stop_reason": "tool_use",
                },
                "uuid": "a",
            }
        )
        out.append({**head, "type": "progress", "data": {"output": pad[:500]}, "uuid": "g"})
        out.append(
            {
                **head,
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [{"tool_use_id": "toolu_1", "type": "tool_result", "content": pad}],
                },
                "uuid": "t",
                "toolUseResult": {"stdout": pad, "stderr": ""},
            }
        )
    out.append({**head, "type": "assistant", "message": _answer(pad[:400]), "uuid": "e"})
    return [orjson.dumps(r) for r in out]


def _answer(text: str) -> dict[str, object]:
    """The message that ends a turn: text, ``stop_reason`` ``end_turn`` (as every release
    writes it; tests/fixtures/states)."""
    return {
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 80},
    }


def claude_lines_2_1(rng: random.Random) -> list[bytes]:
    """One turn as Claude Code 2.1.332 writes it (read off the harness corpus): the queued
    prompt, the prompt (its type before its message), attachments (their own type after
    their payload), request bookkeeping (its type first), assistant blocks (their type after
    the message), tool results, the last prompt and the cost."""
    pad = "lorem ipsum dolor sit amet " * rng.randint(20, 400)
    session = {"sessionId": "0b9c-41f2"}
    tail = {"userType": "external", "cwd": "/w/project", **session, "version": "2.1.332"}
    uuid = f"u{rng.random()}"
    at = "2026-03-01T10:00:00.000Z"
    out: list[dict[str, object]] = [
        {
            "type": "queue-operation",
            "operation": "enqueue",
            "timestamp": at,
            **session,
            "content": "fix the tests",
        },
        {"type": "queue-operation", "operation": "dequeue", "timestamp": at, **session},
        {
            "parentUuid": "p",
            "isSidechain": False,
            "promptId": "q",
            "type": "user",
            "message": {"role": "user", "content": "fix the tests"},
            "uuid": uuid,
            "timestamp": at,
            "permissionMode": "default",
            "promptSource": "user",
            **tail,
        },
        {
            "parentUuid": uuid,
            "isSidechain": False,
            "attachment": {"type": "prompt_snapshot", "systemPrompt": [pad]},
            "type": "attachment",
            "uuid": "s",
            "timestamp": at,
            **tail,
        },
        {
            "type": "api-request-shape",
            **session,
            "shapeHash": "h",
            "timestamp": at,
            "shape": {"tools": [pad[:2000]]},
        },
        {
            "type": "api-request-blob",
            **session,
            "hash": "b",
            "message": {"role": "user", "content": [{"type": "text", "text": pad}]},
        },
    ]
    for _ in range(rng.randint(2, 6)):
        out.append(
            {
                "type": "api-request",
                **session,
                "id": "r",
                "timestamp": at,
                "params": {"model": "claude"},
            }
        )
        out.append(
            {
                "parentUuid": "p",
                "isSidechain": False,
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude",
                    "content": [
                        {"type": "text", "text": pad},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "Bash",
                            "input": {"command": "pytest"},
                        },
                    ],
                    "stop_reason": "tool_use",
                    "stop_sequence": None,
                    "usage": {"input_tokens": 12, "output_tokens": 80},
                },
                "requestRef": "r",
                "type": "assistant",
                "uuid": "a",
                "timestamp": at,
                "effort": "medium",
                **tail,
            }
        )
        out.append(
            {
                "parentUuid": "a",
                "isSidechain": False,
                "promptId": "q",
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [{"tool_use_id": "toolu_1", "type": "tool_result", "content": pad}],
                },
                "uuid": "t",
                "timestamp": at,
                "toolUseResult": {"stdout": pad, "stderr": ""},
                "sourceToolAssistantUUID": "a",
                **tail,
            }
        )
    answer = {"parentUuid": "t", "isSidechain": False, "message": _answer(pad[:400])}
    out.append({**answer, "type": "assistant", "uuid": "e", "timestamp": at, **tail})
    out.append({"type": "last-prompt", "lastPrompt": "fix the tests", "leafUuid": "e", **session})
    out.append({"type": "cost-state", **session, "totalCostUSD": 0.1})
    return [orjson.dumps(r) for r in out]


ORDERS = {"old": claude_lines, "2.1": claude_lines_2_1}


def generate(path: Path, megabytes: int, order: str = "old") -> int:
    """A Claude transcript of about ``megabytes`` MiB, turn after turn in one release's key
    order: ``old`` (each record's type before its message) or ``2.1`` (Claude Code
    2.1.332's)."""
    rng = random.Random(7)
    target = megabytes * 1024 * 1024
    written = lines = 0
    turn = ORDERS[order]
    with path.open("wb") as f:
        while written < target:
            for line in turn(rng):
                f.write(line + b"\n")
                written += len(line) + 1
                lines += 1
    return lines


def bench_replay(path: Path) -> tuple[float, float, int]:
    entry("claude").build(Settings())  # the adapter's modules load before the clock starts
    start = time.perf_counter()
    with path.open("rb") as f:
        for line in f:
            orjson.loads(line)
    baseline = time.perf_counter() - start
    start = time.perf_counter()
    summary = list(replay("claude", str(path), thread=None, own_texts=[], settings=Settings()))[-1]
    ours = time.perf_counter() - start
    return baseline, ours, int(summary["humanTurns"])


async def bench_tick(tmp: Path, n: int) -> tuple[float, float]:
    root = tmp / "claude"
    root.mkdir()
    paths = []
    for i in range(n):
        p = root / f"s{i}.jsonl"
        p.write_bytes(b'{"type":"summary"}\n')
        paths.append(p)
    db = tmp / "state.db"
    kernel = await Kernel.open(db)

    def seed(conn: sqlite3.Connection) -> None:
        now = kernel.clock()
        for i, p in enumerate(paths):
            key = f"agent:main:adopted:{i}"
            conn.execute(
                "INSERT INTO session_upstream_links (session_key, agent_id, catalog_id,"
                " host_id, thread_id, upstream_kind, upstream_ref_json, last_marker_json,"
                " created_at, updated_at)"
                " VALUES (?, 'main', 'claude', 'gateway:local', ?, 'claude-cli', ?, ?, ?, ?)",
                (
                    key,
                    f"s{i}",
                    orjson.dumps({"filePath": str(p)}).decode(),
                    orjson.dumps({"offset": p.stat().st_size}).decode(),
                    now,
                    now,
                ),
            )
            conn.execute(
                "INSERT INTO sessionwatch_sessions (session_key, agent_id, session_id,"
                " run_active, created_at, updated_at) VALUES (?, 'main', ?, 0, ?, ?)",
                (key, f"s{i}", now, now),
            )
            conn.execute(
                "INSERT INTO session_watch_cursors (watcher_session_key, watcher_store_path,"
                " target_session_key, updated_at) VALUES ('agent:main:main', 'default', ?, ?)",
                (key, now),
            )

    await kernel.store.write(seed)
    monitor = UpstreamMonitor.from_config(kernel, Config(roots=RootsConfig(claude=str(root))))
    await monitor.ticker.tick()  # warm the page cache once, as a running service would be
    start = time.perf_counter()
    results = await monitor.ticker.tick()
    elapsed = time.perf_counter() - start
    assert len(results) == n and all(r.outcome == "quiet" for r in results)
    start = time.perf_counter()
    for p in paths:
        os.stat(p)
    stat_time = time.perf_counter() - start
    await kernel.close()
    return elapsed, stat_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--links", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.jsonl"
        lines = generate(path, args.mb)
        baseline, ours, turns = bench_replay(path)
        mb = path.stat().st_size / 1024 / 1024
        print(
            f"(a) replay of a {mb:.0f} MB Claude transcript ({lines:,} lines, {turns:,} turns):"
            f" {mb / ours:.0f} MB/s; orjson.loads loop {mb / baseline:.0f} MB/s;"
            f" ratio {baseline / ours:.2f} (target >= 1.0)"
        )
        path.unlink()
        elapsed, stat_time = asyncio.run(bench_tick(Path(tmp), args.links))
        print(
            f"(b) one tick over {args.links:,} watched, unchanged links: {elapsed * 1000:.0f} ms"
            f" (target < 500 ms); os.stat share {stat_time * 1000:.0f} ms"
            f" ({stat_time / elapsed:.0%})"
        )


if __name__ == "__main__":
    main()
