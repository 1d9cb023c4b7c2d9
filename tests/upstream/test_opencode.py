"""The OpenCode adapter against real OpenCode databases."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from adapters.base import Probe, text_hash
from adapters.opencode import OpenCodeAdapter, UserMessage, classify_user_messages, human_text
from monitor.config import Config, RootsConfig
from monitor.kernel import Kernel
from monitor.upstream import UpstreamMonitor
from monitor.web import wire
from tests.opencode_db import OpenCodeDB

SID = "ses_1"


@pytest.fixture
def oc(tmp_path: Path) -> OpenCodeDB:
    db = OpenCodeDB(tmp_path / "opencode.db")
    db.session(SID)
    return db


def probe(db: OpenCodeDB, marker: dict[str, Any], sid: str = SID, **kw: Any) -> Probe:
    return Probe(
        session_key="agent:main:adopted:oc",
        ref={"dbPath": str(db.path), "threadId": sid},
        marker=marker,
        **kw,
    )


@pytest.mark.parametrize(
    ("parts", "counts"),
    [
        ([{"type": "text", "text": "fix the build"}], True),
        ([{"type": "text", "text": "x", "synthetic": True}], False),
        ([{"type": "text", "text": "x", "ignored": True}], False),
        ([{"type": "text", "text": "go on", "metadata": {"compaction_continue": True}}], False),
        ([{"type": "text", "text": "hi"}, {"type": "compaction", "auto": True}], False),
        ([{"type": "file", "mime": "image/png", "filename": "a.png", "url": "data:"}], False),
        (
            [
                {
                    "type": "text",
                    "synthetic": True,
                    "ignored": True,
                    "text": "The following tool was executed by the user",
                }
            ],
            False,
        ),
        ([{"type": "subtask", "prompt": "review", "agent": "general"}], False),
        (
            [
                {"type": "text", "text": "@README.md"},
                {"type": "text", "synthetic": True, "text": "Called the Read tool"},
                {
                    "type": "file",
                    "mime": "text/plain",
                    "filename": "README.md",
                    "source": {
                        "type": "file",
                        "path": "README.md",
                        "text": {"value": "@README.md", "start": 0, "end": 10},
                    },
                },
            ],
            False,
        ),
        (
            [
                {"type": "text", "text": "look at @README.md and fix it"},
                {
                    "type": "file",
                    "mime": "text/plain",
                    "filename": "README.md",
                    "source": {"text": {"value": "@README.md", "start": 8, "end": 18}},
                },
            ],
            True,
        ),
        (
            [{"type": "text", "text": "real text"}, {"type": "text", "text": "x", "ignored": True}],
            True,
        ),
    ],
)
def test_conservative_classification(parts: list[dict[str, Any]], counts: bool) -> None:
    assert counts == (human_text(parts) is not None)


def test_compaction_replays_are_suppressed_within_the_lookback() -> None:
    def m(i: int, text: str) -> UserMessage:
        return UserMessage(id=f"msg_{i:03d}", parts=[{"type": "text", "text": text}])

    history = [m(i, f"prompt {i}") for i in range(60)]
    replayed = [m(60, "prompt 30"), m(61, "prompt 5"), m(62, "brand new")]
    result = classify_user_messages(history + replayed, "msg_059")
    assert ["msg_061", "msg_062"] == [t.native_id for t in result.turns]  # 5 is 55 back
    assert "msg_062" == result.consumed_to


def test_attachments_are_normalized_for_replay_detection() -> None:
    image = {"type": "file", "mime": "image/png", "filename": "a.png", "url": "data:xyz"}
    first = UserMessage(id="msg_1", parts=[{"type": "text", "text": "see"}, image])
    again = UserMessage(
        id="msg_2", parts=[{"type": "text", "text": "see"}, {**image, "url": "data:other"}]
    )
    assert [] == classify_user_messages([first, again], "msg_1").turns


async def test_exports_only_when_the_sequence_advanced(oc: OpenCodeDB) -> None:
    adapter = OpenCodeAdapter()
    marker = await adapter.baseline({"dbPath": str(oc.path), "threadId": SID})
    [quiet] = await adapter.check([probe(oc, marker)])
    assert ("quiet", 0) == (quiet.status, adapter.exports)
    mid = oc.prompt(SID, "typed in opencode")
    oc.reply(SID)
    [active] = await adapter.check([probe(oc, marker)])
    assert ("activity", [mid], 1) == (
        active.status,
        [t.native_id for t in active.turns],
        adapter.exports,
    )
    assert mid == active.dedupe_id
    assert active.marker is not None
    assert {"seq": 4, "lastHumanMessageId": mid} == {
        k: active.marker[k] for k in ("seq", "lastHumanMessageId")
    }


async def test_a_half_written_turn_is_reported_once_when_its_text_arrives(
    oc: OpenCodeDB,
) -> None:
    adapter = OpenCodeAdapter()
    marker = await adapter.baseline({"dbPath": str(oc.path), "threadId": SID})
    mid = oc.message(SID)  # the message row, parts not yet
    [first] = await adapter.check([probe(oc, marker)])
    assert [] == first.turns
    assert first.marker is not None
    oc.part(SID, mid, type="text", text="arrives a tick later")
    [second] = await adapter.check([probe(oc, first.marker)])
    assert [mid] == [t.native_id for t in second.turns]
    assert second.marker is not None
    [third] = await adapter.check([probe(oc, second.marker)])
    assert [] == third.turns


async def test_a_regressed_sequence_rebaselines_without_export(oc: OpenCodeDB) -> None:
    adapter = OpenCodeAdapter()
    [out] = await adapter.check([probe(oc, {"seq": 99, "lastHumanMessageId": None})])
    assert ("quiet", {"seq": 0, "lastHumanMessageId": None}, 0) == (
        out.status,
        out.marker,
        adapter.exports,
    )


async def test_missing_session_missing_db_and_failed_query(oc: OpenCodeDB, tmp_path: Path) -> None:
    adapter = OpenCodeAdapter()
    [gone] = await adapter.check([probe(oc, {"seq": 0}, sid="ses_gone")])
    assert "missing" == gone.status
    nodb = OpenCodeDB.__new__(OpenCodeDB)
    nodb.path = tmp_path / "absent.db"
    [absent] = await adapter.check([probe(nodb, {"seq": 0})])
    assert "missing" == absent.status
    broken = tmp_path / "broken.db"
    broken.write_bytes(b"this is not a database" * 100)
    nodb.path = broken
    [failed] = await adapter.check([probe(nodb, {"seq": 0})])
    assert "inconclusive" == failed.status


async def test_without_event_sequence_time_updated_is_the_signal(tmp_path: Path) -> None:
    oc = OpenCodeDB(tmp_path / "old.db", events=False)
    oc.session(SID)
    adapter = OpenCodeAdapter()
    marker = await adapter.baseline({"dbPath": str(oc.path), "threadId": SID})
    mid = oc.prompt(SID, "typed")
    [out] = await adapter.check([probe(oc, marker)])
    assert [mid] == [t.native_id for t in out.turns]


async def test_a_null_sequence_counts_as_zero(oc: OpenCodeDB) -> None:
    with oc.connect() as conn:
        conn.execute("DELETE FROM event_sequence")
    adapter = OpenCodeAdapter()
    [out] = await adapter.check([probe(oc, {"seq": 0, "lastHumanMessageId": None})])
    assert ("quiet", 0) == (out.status, adapter.exports)


async def test_child_sessions_are_not_adoptable(oc: OpenCodeDB) -> None:
    oc.session("ses_child", parent=SID)
    with pytest.raises(Exception, match="not adoptable"):
        await OpenCodeAdapter().baseline({"dbPath": str(oc.path), "threadId": "ses_child"})


async def test_at_most_four_exports_at_a_time(oc: OpenCodeDB) -> None:
    ids = [f"ses_p{i}" for i in range(10)]
    for sid in ids:
        oc.session(sid)
        oc.prompt(sid, f"hello {sid}")
    adapter = OpenCodeAdapter()
    peak, running = [0], [0]
    real = adapter.sessions.export

    async def tracked(*args: Any) -> Any:
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        try:
            await asyncio.sleep(0.02)  # hold the slot, so overlapping exports would show
            return await real(*args)
        finally:
            running[0] -= 1

    adapter.sessions.export = tracked  # type: ignore[method-assign]
    outcomes = await adapter.check([probe(oc, {"seq": 0}, sid=s) for s in ids])
    assert all(o.status == "activity" for o in outcomes)
    assert 1 <= peak[0] <= 4


async def test_self_echo_and_real_text_mixed_with_ignored(oc: OpenCodeDB) -> None:
    adapter = OpenCodeAdapter()
    marker = await adapter.baseline({"dbPath": str(oc.path), "threadId": SID})
    oc.prompt(SID, "sent by the gateway")
    mid = oc.message(SID)
    oc.part(SID, mid, type="text", text="hidden", ignored=True)
    oc.part(SID, mid, type="text", text="typed by a person")
    [out] = await adapter.check([probe(oc, marker, own=((1, text_hash("sent  by the gateway")),))])
    assert [mid] == [t.native_id for t in out.turns]


async def test_end_to_end_adopt_from_the_catalog_and_tick(
    oc: OpenCodeDB, kernel: Kernel, tmp_path: Path
) -> None:
    oc.session("ses_child", parent=SID)
    config = Config(roots=RootsConfig(opencode_db=str(oc.path), claude=str(tmp_path / "none")))
    monitor = UpstreamMonitor.from_config(kernel, config)
    catalog = (await monitor.sessions.find("opencode")).as_json()
    assert ([SID], 1) == ([s["nativeId"] for s in catalog["sessions"]], catalog["skipped"])
    key = "agent:main:adopted:oc"
    adopted = wire.adopted(
        await monitor.adoption.adopt_catalog(
            catalog["sessions"][0]["catalogId"], session_key=key, session_id="s1"
        )
    )
    assert adopted["declined"] is None
    await kernel.watch(watcher="agent:main:main", target=key)
    oc.prompt(SID, "hello from opencode")
    assert [("activity", 1)] == [(r.outcome, r.turns) for r in await monitor.ticker.tick()]
    events = (wire.status(await kernel.status(key, changes_since=1)))["stateChanges"]["events"]
    assert ["human message via opencode"] == [e["summary"] for e in events]


def test_replay_cli_lists_turns(oc: OpenCodeDB) -> None:
    first = oc.prompt(SID, "one")
    oc.reply(SID)
    oc.prompt(SID, "one")  # a replay of the first
    third = oc.prompt(SID, "two")
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
            SID,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [
        {"type": "turn", "offset": None, "id": first},
        {"type": "turn", "offset": None, "id": third},
    ] == lines[:-1]
    with sqlite3.connect(oc.path) as conn:
        seq = conn.execute(
            "SELECT seq FROM event_sequence WHERE aggregate_id = ?", (SID,)
        ).fetchone()[0]
    assert {"seq": seq, "lastHumanMessageId": third} == lines[-1]["marker"]
    assert {"unknownTypes": {}, "unclassifiedUserRecords": 0} == {
        k: lines[-1]["drift"][k] for k in ("unknownTypes", "unclassifiedUserRecords")
    }  # the summary carries drift as the other formats' do


async def test_an_unknown_part_type_and_a_newer_version_show_as_drift(oc: OpenCodeDB) -> None:
    adapter = OpenCodeAdapter()
    marker = await adapter.baseline({"dbPath": str(oc.path), "threadId": SID})
    mid = oc.message(SID)
    oc.part(SID, mid, type="hologram", data="x")
    oc.part(SID, mid, type="text", text="typed")
    with oc.connect() as conn:
        conn.execute("UPDATE session SET version = '9.0.0' WHERE id = ?", (SID,))
    [out] = await adapter.check([probe(oc, marker)])
    assert out.marker is not None and out.drift is not None
    drift = out.marker["drift"]
    assert ({"hologram": 1}, "9.0.0", True) == (
        drift["unknownTypes"],
        drift["version"],
        drift["newerThanTested"],
    )


async def test_opencode_migrating_its_own_schema_is_drift_never_missing(oc: OpenCodeDB) -> None:
    """A newer OpenCode schema is read where its tables still answer (a column and a table
    added); one whose tables no longer answer (the session table renamed) is format drift,
    inconclusive with that reason, and never a miss."""
    conn = sqlite3.connect(oc.path)
    with conn:
        conn.execute("ALTER TABLE session ADD COLUMN workspace_id TEXT")
        conn.execute("CREATE TABLE session_share_v2 (id TEXT PRIMARY KEY)")
    adapter = OpenCodeAdapter()
    [read] = await adapter.check([probe(oc, {"seq": 0})])
    assert read.status == "quiet"
    with conn:
        conn.execute("ALTER TABLE session RENAME TO session_v3")
    conn.close()
    for _ in range(4):
        [out] = await adapter.check([probe(oc, {"seq": 0})])
        assert out.status == "inconclusive"
        assert out.reason is not None and out.reason.startswith("format drift: OpenCode's schema")
