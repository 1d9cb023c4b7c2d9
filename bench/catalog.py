"""Catalog speed: listing 10,000 native sessions (target under 2 s).

Run: python bench/catalog.py [--sessions 10000]

Generates Claude project files (half of them with a title record at the end), Codex
rollouts and Pi sessions in the real shapes, plus sub-agent files that must be skipped,
then times the catalog of every local format (each adapter's ``catalog()``) against a
plain ``os.walk`` + ``os.stat`` of the same tree (the floor any listing pays).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).parent.resolve()]

from adapters.catalog import CatalogListing  # noqa: E402
from adapters.registry import entry, roots_of  # noqa: E402
from monitor.config import Config, RootsConfig  # noqa: E402
from monitor.upstream.configured import adapter_settings  # noqa: E402


async def scan_catalog(roots: RootsConfig) -> CatalogListing:
    settings = adapter_settings(Config(roots=roots))
    found = CatalogListing()
    for kind in roots_of(roots.given):  # every format with a root: the local ones
        found.extend(await entry(kind).build(settings).catalog())
    return found


def _bodies() -> dict[str, bytes]:
    """Thirty lines of the model's answers, in each format's own shape (as each harness
    writes them, so that each format's pre-filter sees what it sees in service)."""
    text = "x" * 800
    claude = {  # every record of Claude Code's names the session and its directory
        "type": "assistant",
        "uuid": "a",
        "sessionId": "S",
        "cwd": "/w",
        "version": "2.1.34",
        "message": {"role": "assistant", "content": text},
    }
    codex = {
        "timestamp": "2026-03-01T10:00:00.000Z",
        "type": "response_item",
        "payload": {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text}],
        },
    }
    pi = {
        "type": "message",
        "id": "m",
        "parentId": None,
        "timestamp": "2026-03-01T10:00:00.000Z",
        "message": {"role": "assistant", "content": [{"type": "text", "text": text}]},
    }
    return {
        kind: b"".join(orjson.dumps(record) + b"\n" for _ in range(30))
        for kind, record in (("claude", claude), ("codex", codex), ("pi", pi))
    }


def generate(root: Path, n: int) -> None:
    bodies = _bodies()
    body = bodies["claude"]
    for i in range(n):
        kind = ("claude", "codex", "pi")[i % 3]
        if kind == "claude":
            d = root / "claude" / f"proj{i % 50}"
            d.mkdir(parents=True, exist_ok=True)
            head = (
                orjson.dumps(
                    {
                        "type": "user",
                        "uuid": "u",
                        "cwd": f"/w/{i}",
                        "message": {"role": "user", "content": "hi"},
                    }
                )
                + b"\n"
            )
            tail = orjson.dumps({"type": "custom-title", "customTitle": f"T{i}"}) + b"\n"
            (d / f"s{i}.jsonl").write_bytes(head + body + (tail if i % 2 else b""))
        elif kind == "codex":
            d = root / "codex" / "2026" / "03" / f"{i % 28 + 1:02d}"
            d.mkdir(parents=True, exist_ok=True)
            meta = {
                "type": "session_meta",
                "payload": {"id": f"t{i}", "cwd": "/w", "source": "cli"},
            }
            prompt = {
                "timestamp": "2026-03-01T10:00:00.000Z",
                "type": "event_msg",
                "payload": {"type": "user_message", "message": f"fix the tests {i}"},
            }
            (d / f"rollout-2026-03-01T10-00-00-t{i}.jsonl").write_bytes(
                orjson.dumps(meta) + b"\n" + orjson.dumps(prompt) + b"\n" + bodies["codex"]
            )
        else:
            d = root / "pi" / f"--w-{i % 40}--"
            d.mkdir(parents=True, exist_ok=True)
            header = {
                "type": "session",
                "version": 3,
                "id": f"p{i}",
                "cwd": "/w",
                "timestamp": "2026-03-01T10:00:00Z",
            }
            prompt = {
                "type": "message",
                "id": "u",
                "parentId": None,
                "timestamp": "2026-03-01T10:00:00.000Z",
                "message": {"role": "user", "content": [{"type": "text", "text": f"go on {i}"}]},
            }
            (d / f"2026-03-01T10-00-00-000Z_p{i}.jsonl").write_bytes(
                orjson.dumps(header) + b"\n" + orjson.dumps(prompt) + b"\n" + bodies["pi"]
            )
    sub = root / "claude" / "proj0" / "s0" / "subagents"
    sub.mkdir(parents=True, exist_ok=True)
    (sub / "agent-1.jsonl").write_bytes(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        generate(root, args.sessions)
        roots = RootsConfig(
            claude=str(root / "claude"),
            codex=str(root / "codex"),
            pi=str(root / "pi"),
            opencode_db=str(root / "none.db"),
        )
        start = time.perf_counter()
        for dirpath, _, files in os.walk(root):
            for f in files:
                os.stat(os.path.join(dirpath, f))
        floor = time.perf_counter() - start
        start = time.perf_counter()
        catalog = asyncio.run(scan_catalog(roots))
        elapsed = time.perf_counter() - start
        print(
            f"catalog of {len(catalog.entries):,} sessions ({catalog.skipped} skipped,"
            f" {len(catalog.errors)} errors): {elapsed:.2f} s (target < 2 s);"
            f" os.walk + os.stat floor {floor:.2f} s; ratio {elapsed / floor:.1f}x the floor"
        )


if __name__ == "__main__":
    main()
