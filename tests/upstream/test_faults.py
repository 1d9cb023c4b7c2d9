"""Hostile files and bytes: FIFOs, directories, symlink swaps, odd bytes, drift, compactions,
self-echo used up, a replaced gateway session. Real files, FIFOs and symlinks throughout."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from adapters.base import own_text_hash
from monitor.config import Config, RootsConfig
from monitor.kernel import Kernel
from monitor.upstream import UpstreamMonitor
from monitor.web import wire
from tests.opencode_db import OpenCodeDB

KEY = "agent:main:adopted:x"
OTHER = "agent:main:adopted:y"
MAIN = "agent:main:main"


def prompt(text: str, uuid: str = "u", **extra: Any) -> bytes:
    record = {"type": "user", "uuid": uuid, "message": {"role": "user", "content": text}}
    return orjson.dumps({**record, **extra}) + b"\n"


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


@pytest.fixture
def monitor(kernel: Kernel, roots: RootsConfig) -> UpstreamMonitor:
    return UpstreamMonitor.from_config(kernel, Config(roots=roots))


async def adopt(monitor: UpstreamMonitor, path: Path, key: str = KEY) -> None:
    result = wire.adopted(
        await monitor.adoption.adopt(
            kind="claude", path=str(path), session_key=key, session_id="s1"
        )
    )
    assert result["declined"] is None
    assert await monitor.kernel.watch(watcher=MAIN, target=key)


async def tick(monitor: UpstreamMonitor) -> dict[str, tuple[str, int, str | None]]:
    """One tick, which must come back: a hang fails the test instead of stalling it."""
    results = await asyncio.wait_for(monitor.ticker.tick(), 30)
    return {r.session_key: (r.outcome, r.turns, r.reason) for r in results}


async def test_a_fifo_is_never_opened_and_stalls_no_other_link(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    fifo_path, other = Path(roots.claude) / "a.jsonl", Path(roots.claude) / "b.jsonl"
    fifo_path.write_bytes(b"")
    other.write_bytes(b"")
    await adopt(monitor, fifo_path)
    await adopt(monitor, other, OTHER)
    fifo_path.unlink()
    os.mkfifo(fifo_path)
    append(other, prompt("still seen"))
    first = await tick(monitor)
    assert ("inconclusive", 0, "not a regular file (a FIFO)") == first[KEY]
    assert ("activity", 1) == first[OTHER][:2]
    append(other, prompt("and again"))
    second = await tick(monitor)
    assert ("inconclusive", 0, "not a regular file (a FIFO)") == second[KEY]
    assert ("activity", 1) == second[OTHER][:2]
    listed = {x["sessionKey"]: x for x in wire.links(await monitor.links())}
    assert {"outcome": "inconclusive", "reason": "not a regular file (a FIFO)"} == listed[KEY][
        "status"
    ]


async def test_a_directory_in_place_of_the_transcript_is_shown_in_links(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    path = Path(roots.claude) / "a.jsonl"
    path.write_bytes(b"")
    await adopt(monitor, path)
    path.unlink()
    path.mkdir()
    assert ("inconclusive", 0, "not a regular file (a directory)") == (await tick(monitor))[KEY]
    (listed,) = wire.links(await monitor.links())
    assert "not a regular file (a directory)" == listed["status"]["reason"]


async def test_adopting_a_fifo_is_declined_as_not_a_regular_file(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    path = Path(roots.claude) / "a.jsonl"
    os.mkfifo(path)
    result = wire.adopted(
        await monitor.adoption.adopt(kind="claude", path=str(path), session_key=KEY)
    )
    assert "not a regular file (a FIFO)" in result["declined"]


async def test_the_catalog_skips_a_fifo_without_opening_it(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    os.mkfifo(Path(roots.claude) / "proj-a.jsonl")
    found = (await asyncio.wait_for(monitor.sessions.find("claude"), 30)).as_json()
    assert [] == found["sessions"]
    assert ["not a regular file (a FIFO)"] == [e["reason"] for e in found["errors"]]


def test_replay_of_a_fifo_exits_2_with_a_clear_message(tmp_path: Path) -> None:
    fifo_path = tmp_path / "t.jsonl"
    os.mkfifo(fifo_path)
    proc = subprocess.run(
        [sys.executable, "-m", "monitor", "replay", "--adapter", "claude", str(fifo_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 2 == proc.returncode
    assert "not a regular file (a FIFO)" in proc.stderr


async def test_a_symlink_out_of_the_roots_is_not_read(
    monitor: UpstreamMonitor, roots: RootsConfig, tmp_path: Path
) -> None:
    path = Path(roots.claude) / "a.jsonl"
    path.write_bytes(b"")
    await adopt(monitor, path)
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_bytes(prompt("not ours to read"))
    path.unlink()
    path.symlink_to(outside)
    assert ("inconclusive", 0, "outside the configured roots") == (await tick(monitor))[KEY]
    assert 1 == (wire.status(await monitor.kernel.status(KEY)))["stateVersion"]  # only the adoption


async def test_prompts_with_odd_bytes_are_turns(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    path = Path(roots.claude) / "a.jsonl"
    path.write_bytes(b"")
    await adopt(monitor, path)
    append(path, b'{"type":"user","uuid":"s","message":{"role":"user","content":"\\ud83d cut"}}\n')
    append(path, b'{"type":"user","uuid":"l","message":{"role":"user","content":"caf\xe9"}}\n')
    assert ("activity", 2) == (await tick(monitor))[KEY][:2]


async def test_drift_is_counted_per_link_and_shown(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    path = Path(roots.claude) / "a.jsonl"
    path.write_bytes(b"")
    await adopt(monitor, path)
    append(path, b'{"type":"world_state","x":1}\n{"type":"world_state","x":2}\n')
    append(path, prompt("new shape", version="9.0.0"))
    await tick(monitor)
    (listed,) = wire.links(await monitor.links())
    drift = listed["drift"]
    assert ({"world_state": 2}, "9.0.0", True) == (
        drift["unknownTypes"],
        drift["version"],
        drift["newerThanTested"],
    )


async def test_a_native_compaction_is_recorded_once_and_notifies_no_one(
    monitor: UpstreamMonitor, roots: RootsConfig, db_path: Path
) -> None:
    path = Path(roots.claude) / "a.jsonl"
    path.write_bytes(b"")
    await adopt(monitor, path)
    boundary = {"type": "system", "subtype": "compact_boundary", "uuid": "cb1"}
    summary = {
        "type": "user",
        "uuid": "cs1",
        "parentUuid": "cb1",
        "isCompactSummary": True,
        "message": {"role": "user", "content": "This session is being continued"},
    }
    append(path, orjson.dumps(boundary) + b"\n" + orjson.dumps(summary) + b"\n")
    assert ("quiet", 0) == (await tick(monitor))[KEY][:2]
    with sqlite3.connect(db_path) as conn:
        rows = conn.execute(
            "SELECT kind, dedupe_key FROM session_state_events WHERE kind = 'compacted'"
        ).fetchall()
    assert [("compacted", f"compacted:{KEY}:claude:cb1")] == rows
    assert [] == await monitor.kernel.notices(watcher=MAIN)


async def test_self_echo_suppresses_one_prompt_and_is_used_up(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    """The gateway sent "deploy now" once: its echo is not a turn, a person typing the same
    words afterwards is."""
    path = Path(roots.claude) / "a.jsonl"
    path.write_bytes(b"")
    await adopt(monitor, path)
    await monitor.kernel.gateway_sessions.remember_own_message(KEY, own_text_hash("deploy now"))
    append(path, prompt("deploy now", "e1"))
    assert ("quiet", 0) == (await tick(monitor))[KEY][:2]
    append(path, prompt("deploy now", "e2"))
    assert ("activity", 1) == (await tick(monitor))[KEY][:2]


async def test_a_replaced_gateway_session_starts_a_fresh_missing_streak(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    path = Path(roots.claude) / "a.jsonl"
    path.write_bytes(b"")
    await adopt(monitor, path)
    path.unlink()
    for _ in range(2):
        assert "missing" == (await tick(monitor))[KEY][0]
    await monitor.kernel.gateway_sessions.upsert(KEY, session_id="s2")
    for _ in range(2):
        assert ("missing", 0, "no such file") == (await tick(monitor))[KEY]
    assert [KEY] == [x["sessionKey"] for x in wire.links(await monitor.links())]
    assert ("missing", 0, "upstream_missing recorded") == (await tick(monitor))[KEY]


async def test_opencode_staged_parts_are_reported_once_when_the_text_arrives(
    tmp_path: Path,
) -> None:
    """A bare file part first, the text later, then the reply: 0, 0, 1, 0 turns."""
    from adapters.base import Probe
    from adapters.opencode import OpenCodeAdapter

    oc = OpenCodeDB(tmp_path / "opencode.db")
    oc.session("ses_1")
    adapter = OpenCodeAdapter()
    ref = {"dbPath": str(oc.path), "threadId": "ses_1"}
    marker = await adapter.baseline(ref)
    counts = []

    async def check() -> None:
        nonlocal marker
        [out] = await adapter.check([Probe(session_key=KEY, ref=ref, marker=marker)])
        assert out.marker is not None
        marker = out.marker
        counts.append(len(out.turns))

    mid = oc.message("ses_1")
    await check()
    oc.part("ses_1", mid, type="file", mime="image/png", filename="a.png", url="data:")
    await check()
    oc.part("ses_1", mid, type="text", text="what is in this picture?")
    await check()
    oc.reply("ses_1")
    await check()
    assert [0, 0, 1, 0] == counts


def test_opencode_replay_key_leaves_out_ignored_and_synthetic_alike() -> None:
    from adapters.opencode import UserMessage, classify_user_messages

    original = UserMessage(
        id="msg_1",
        parts=[
            {"type": "text", "text": "hidden", "ignored": True},
            {"type": "text", "text": "please keep going"},
        ],
    )
    replay = UserMessage(id="msg_2", parts=[{"type": "text", "text": "please keep going"}])
    assert [] == classify_user_messages([original, replay], "msg_1").turns


def test_opencode_replay_refuses_a_child_session(tmp_path: Path) -> None:
    oc = OpenCodeDB(tmp_path / "opencode.db")
    oc.session("ses_root")
    oc.session("ses_child", parent="ses_root")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "monitor",
            "replay",
            "--adapter",
            "opencode",
            str(oc.path),
            "--session",
            "ses_child",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert 2 == proc.returncode
    assert "child session (a sub-agent run) is not adoptable" in proc.stderr


async def test_why_a_watched_link_was_not_checked_shows_in_links(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    path = Path(roots.claude) / "a.jsonl"
    path.write_bytes(b"")
    await adopt(monitor, path)
    await monitor.kernel.gateway_sessions.upsert(KEY, run_active=True)
    assert ("skipped", 0, "run active") == (await tick(monitor))[KEY]
    (listed,) = wire.links(await monitor.links())
    assert {"outcome": "skipped", "reason": "run active"} == listed["status"]
    await monitor.kernel.gateway_sessions.upsert(KEY, run_active=False)
    append(path, prompt("after the run"))
    assert ("activity", 1) == (await tick(monitor))[KEY][:2]
    (listed,) = wire.links(await monitor.links())
    assert listed["status"] is None
