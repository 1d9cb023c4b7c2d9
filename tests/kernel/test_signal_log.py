"""Recording, reconciliation and retention of the signal log (docs/specification.md
sections 4 and 5)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from monitor.clock import DAY_MS, HOUR_MS
from monitor.errors import BadInput, SchemaTooNew
from monitor.kernel import Kernel, NewEvent
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.retention import MAX_ROWS
from monitor.web import wire
from tests.helpers import KernelFactory, ManualClock, human

CHILD = "agent:main:subagent:child"


async def changes(kernel: Kernel, key: str, since: int) -> Any:
    """``session_status`` with ``changesSince``, as the API answers it (the database builds
    the JSON), checked equal to the answer made in Python from the kernel's rows."""
    built = orjson.loads(await kernel.changes_answer(key, agent_id=None, since=since))
    assert wire.status(await kernel.status(key, changes_since=since)) == built
    return built


async def test_duplicate_dedupe_key_returns_the_existing_row(kernel: Kernel) -> None:
    first = await human(kernel, CHILD, dedupe_key="upstream:x:1")
    again = await human(kernel, CHILD, dedupe_key="upstream:x:1")
    assert (first.duplicate, again.duplicate) == (False, True)
    assert first.event == again.event
    assert first.event.sequence == (wire.status(await kernel.status(CHILD)))["stateVersion"]


async def test_default_dedupe_keys_of_producer_kinds(kernel: Kernel) -> None:
    """A run's first terminal event wins; a spawn is recorded once per run."""
    done = await kernel.record(
        NewEvent(
            session_key=CHILD,
            kind=EventKind.RUN_COMPLETED,
            actor_type=ActorType.SYSTEM,
            run_id="r9",
        )
    )
    failed = await kernel.record(
        NewEvent(
            session_key=CHILD, kind=EventKind.RUN_FAILED, actor_type=ActorType.SYSTEM, run_id="r9"
        )
    )
    assert failed.duplicate
    assert "run-terminal:r9" == done.event.dedupe_key == failed.event.dedupe_key
    spawn = await kernel.spawn(parent="agent:main:main", child=CHILD, run_id="r9")
    assert spawn.event.dedupe_key == "child-spawned:r9"


@pytest.mark.parametrize(
    ("kind", "fields", "summary", "payload"),
    [
        (EventKind.CREATED, {"session_id": "s1"}, "session created", {}),
        (EventKind.RUN_COMPLETED, {"run_id": "a"}, "child run completed", {}),
        (
            EventKind.RUN_FAILED,
            {"run_id": "b", "payload": {"outcome": "cancelled"}},
            "child run cancelled",
            {"outcome": "cancelled"},
        ),
        (EventKind.RUN_FAILED, {"run_id": "c"}, "child run failed", {"outcome": "error"}),
        (EventKind.GOAL_CHANGED, {"summary": "goal created"}, "goal created", {}),
        (EventKind.GOAL_CHANGED, {}, "goal updated", {}),
        (EventKind.COMPACTED, {"dedupe_key": "compacted:op"}, "session compacted", {}),
        (
            EventKind.ADOPTED,
            {"payload": {"catalogId": "claude", "hostId": "local", "text": "secret"}},
            "adopted from claude",
            {"catalogId": "claude", "hostId": "local"},
        ),
        (
            EventKind.HUMAN_DIRECT_MESSAGE,
            {"payload": {"channel": "pi", "turns": 3, "message": "hi"}},
            "human message via pi",
            {"channel": "pi", "turns": 3},
        ),
        (
            EventKind.HUMAN_DIRECT_MESSAGE,
            {"summary": "human message via telegram"},
            "human message via telegram",
            {},  # the channel in the summary only, as the gateway's own rows have it
        ),
        (EventKind.HUMAN_DIRECT_MESSAGE, {}, "human message via unknown", {}),
    ],
)
async def test_summaries_are_templates_and_payloads_compact(
    kernel: Kernel, kind: EventKind, fields: dict[str, Any], summary: str, payload: dict[str, Any]
) -> None:
    result = await kernel.record(
        NewEvent(session_key=CHILD, kind=kind, actor_type=ActorType.SYSTEM, **fields)
    )
    assert (summary, payload) == (result.event.summary, result.event.payload)


@pytest.mark.parametrize(
    "fields",
    [
        {"summary": "the user said: please delete prod"},
        {"summary": "human message via two words"},
        {"payload": {"turns": 0}},
        {"payload": {"turns": "3"}},
        {"payload": {"channel": "line\nbreak"}},
        {"payload": [1, 2]},
        {"session_key": ""},
        {"session_key": "global"},  # bare key without an agent id
        {"session_key": CHILD, "agent_id": "other"},
        {"run_id": "a\nb"},
    ],
)
async def test_bad_input_is_refused_and_writes_nothing(
    kernel: Kernel, fields: dict[str, Any]
) -> None:
    args: dict[str, Any] = {"session_key": CHILD, **fields}
    with pytest.raises(BadInput):
        await kernel.record(
            NewEvent(kind=EventKind.HUMAN_DIRECT_MESSAGE, actor_type=ActorType.HUMAN, **args)
        )
    assert wire.state_versions(await kernel.state_versions([])) == []


async def test_occurred_at_is_clamped_to_the_last_day(kernel: Kernel, clock: ManualClock) -> None:
    future = await human(kernel, CHILD, occurred_at=clock.now + HOUR_MS)
    past = await human(kernel, CHILD, occurred_at=clock.now - 3 * DAY_MS)
    inside = await human(kernel, CHILD, occurred_at=clock.now - HOUR_MS)
    assert clock.now == future.event.occurred_at
    assert clock.now - DAY_MS == past.event.occurred_at
    assert clock.now - HOUR_MS == inside.event.occurred_at


async def test_status_without_changes_since_has_only_the_version(kernel: Kernel) -> None:
    assert wire.status(await kernel.status(CHILD)) == {
        "ok": True,
        "sessionKey": CHILD,
        "stateVersion": 0,
    }


async def test_deltas_are_typed_ascending_and_truncated_at_200(kernel: Kernel) -> None:
    for _ in range(205):
        await human(kernel, CHILD, payload={"channel": "telegram"})
    status = await changes(kernel, CHILD, 2)
    delta = status["stateChanges"]
    assert list(range(3, 203)) == [e["sequence"] for e in delta["events"]]
    assert delta["truncated"] is True
    assert (delta["earliestAvailableSequence"], delta["historyGap"]) == (1, False)
    assert {
        "sequence": 3,
        "kind": "human_direct_message",
        "actorType": "human",
        "summary": "human message via telegram",
        "occurredAt": delta["events"][0]["occurredAt"],
        "payload": {"channel": "telegram"},
    } == delta["events"][0]
    assert (await changes(kernel, CHILD, 5))["stateChanges"]["truncated"] is False
    for since, left in ((4, 201), (100, 105), (205, 0)):  # one more, a part, none
        page = (await changes(kernel, CHILD, since))["stateChanges"]
        assert (min(left, 200), left > 200) == (len(page["events"]), page["truncated"])
    assert status["stateVersion"] == 205

    def other_agent(r: Any) -> None:  # the gateway's row for another agent, same key
        r.conn.execute(
            "INSERT INTO session_state_events (session_key, agent_id, kind, actor_type,"
            " occurred_at, summary) VALUES (?, 'other', 'human_direct_message', 'human', 5,"
            " 'human message via x')",
            (CHILD,),
        )

    await kernel.commit(other_agent)  # a full page, then only the other agent's event
    assert (await changes(kernel, CHILD, 5))["stateChanges"]["truncated"] is False
    await human(kernel, CHILD)
    assert (await changes(kernel, CHILD, 5))["stateChanges"]["truncated"] is True


async def test_the_answer_built_by_the_database_is_the_one_made_in_python(
    kernel: Kernel,
) -> None:
    """Every kind, with and without actor, run and payload fields; rows as the gateway may
    write them (a payload field held as null, a payload that is not an object, fields the
    answer leaves out, only fields it shows, another agent under the same key); an unknown
    session."""
    await human(kernel, CHILD)
    await human(kernel, CHILD, payload={"channel": "claude", "turns": 3})
    for kind in EventKind:
        actor = "agent:main:subagent:peer"
        await kernel.record(
            NewEvent(session_key=CHILD, kind=kind, actor_type=ActorType.AGENT, actor_id=actor,
                     run_id=f"run-{kind.value}", payload={"channel": "api"}, dedupe_key=kind.value)
        )  # fmt: skip

    def gateway_rows(r: Any) -> None:
        for agent, payload in [
            ("main", '{"channel": null, "turns": 2, "extra": {"a": [1, null]}}'),
            ("main", "[1, 2]"),
            ("main", '"text"'),
            ("main", None),
            ("main", '{"outcome": "failed", "catalogId": "claude"}'),
            ("other", '{"channel": "x"}'),
            ("main", '{"note": "channel", "turns" : 3}'),  # a name as a value; spaced
            ("main", r'{"note": "a \"channel\" named", "outcome": "ok"}'),  # escaped
            # only the answer's fields: the payload goes in as stored
            ("main", '{"turns": 2, "channel": "x"}'),  # in another order, spaced
            ("main", '{"outcome": null}'),
            ("main", "{ }"),  # empty: left out
        ]:
            r.conn.execute(
                "INSERT INTO session_state_events (session_key, agent_id, kind, actor_type,"
                " occurred_at, summary, payload_json) VALUES (?, ?, 'human_direct_message',"
                " 'human', 5, 'human message via x', ?)",
                (CHILD, agent, payload),
            )

    await kernel.commit(gateway_rows)
    last = (await changes(kernel, CHILD, 0))["stateVersion"]
    for since in (0, 1, 2, last - 1, last, last + 7, 10**12):
        await changes(kernel, CHILD, since)
    assert 10 == len((await changes(kernel, CHILD, last))["stateChanges"]["events"])
    assert [] == (await changes(kernel, "agent:main:never", 0))["stateChanges"]["events"]

    def broken_rows(r: Any) -> None:  # not JSON: PostgreSQL's cast of it fails
        for payload in [
            '{"channel": "x"',
            "not json",
            '{"turns": [1, 2}',
            r'{"channel": "a\u0000"}',
        ]:
            r.conn.execute(
                "INSERT INTO session_state_events (session_key, agent_id, kind, actor_type,"
                " occurred_at, summary, payload_json) VALUES (?, 'main', 'human_direct_message',"
                " 'human', ?, 'human message via x', ?)",
                (CHILD, kernel.store.clock(), payload),
            )

    before = (await kernel.activity())[CHILD].last_hour
    await kernel.commit(broken_rows)
    after = (await kernel.activity())[CHILD].last_hour
    assert before + 4 == after  # a turn each: no payload says more
    for since in (0, last, last + 1, last + 4):
        await changes(kernel, CHILD, since)
    assert [None, None, None, {"channel": "a\u0000"}] == [
        e.get("payload") for e in (await changes(kernel, CHILD, last))["stateChanges"]["events"]
    ][-4:]


async def test_history_gap_only_when_really_pruned(kernel: Kernel, clock: ManualClock) -> None:
    """Sparse global sequences never look like a gap; pruned rows always do."""
    other = "agent:main:subagent:other"
    await human(kernel, CHILD)  # 1
    await human(kernel, other)  # 2
    await human(kernel, other)  # 3
    await human(kernel, CHILD)  # 4
    assert not (wire.status(await kernel.status(CHILD, changes_since=1)))["stateChanges"][
        "historyGap"
    ]
    clock.advance(31 * DAY_MS)
    await human(kernel, CHILD)  # 5
    await kernel.retention.prune()
    status = await changes(kernel, CHILD, 3)
    assert status["stateChanges"]["historyGap"] is True
    assert status["stateChanges"]["earliestAvailableSequence"] == 5
    assert not (wire.status(await kernel.status(CHILD, changes_since=4)))["stateChanges"][
        "historyGap"
    ]


async def test_head_survives_pruning_all_rows(kernel: Kernel, clock: ManualClock) -> None:
    await human(kernel, CHILD)
    await human(kernel, CHILD)
    clock.advance(31 * DAY_MS)
    result = await kernel.retention.prune()
    assert result.deleted_events == 2
    status = wire.status(await kernel.status(CHILD, changes_since=0))
    assert status["stateVersion"] == 2
    assert status["stateChanges"]["historyGap"] is True
    # As OpenClaw answers when every row is gone: one past the head.
    assert status["stateChanges"]["earliestAvailableSequence"] == 3
    assert (await human(kernel, CHILD)).event.sequence == 3  # autoincrement never reuses


async def test_prune_keeps_the_newest_50000_rows(kernel: Kernel, clock: ManualClock) -> None:
    def bulk(conn: sqlite3.Connection) -> None:
        conn.executemany(
            "INSERT INTO session_state_events (session_key, agent_id, kind, actor_type,"
            " occurred_at, summary) VALUES (?, 'main', 'human_direct_message', 'human', ?, 'x')",
            ((CHILD if i % 2 else "agent:main:b", clock.now) for i in range(MAX_ROWS + 10)),
        )

    await kernel.store.write(bulk)
    result = await kernel.retention.prune()
    assert result.deleted_events == 10
    b = wire.status(await kernel.status("agent:main:b", changes_since=8))
    assert b["stateChanges"]["historyGap"] is True
    assert not (wire.status(await kernel.status("agent:main:b", changes_since=9)))["stateChanges"][
        "historyGap"
    ]
    assert b["stateChanges"]["earliestAvailableSequence"] == 11


async def test_idle_cursors_expire_with_retention(kernel: Kernel, clock: ManualClock) -> None:
    """Dormant cursors (ambient or explicit) go after 30 days without an update."""
    await kernel.watch(
        watcher="agent:main:main", target="agent:main:telegram:group:g", ambient=True
    )
    await kernel.watch(watcher="agent:main:main", target=CHILD)
    clock.advance(20 * DAY_MS)
    await human(kernel, CHILD)  # refreshes the explicit cursor only
    clock.advance(11 * DAY_MS)
    assert (await kernel.retention.prune()).deleted_cursors == 1
    assert len(await kernel.notices(watcher="agent:main:main")) == 1


async def test_write_path_prunes_at_most_hourly(kernel: Kernel, clock: ManualClock) -> None:
    await human(kernel, CHILD)
    clock.advance(31 * DAY_MS)
    await human(kernel, CHILD)  # the first write of this kernel prunes the stale row
    assert (wire.status(await kernel.status(CHILD, changes_since=0)))["stateChanges"][
        "earliestAvailableSequence"
    ] == 2
    clock.advance(31 * DAY_MS - HOUR_MS)
    await human(kernel, CHILD)  # within the hour? no: an hour has passed, prunes again
    status = wire.status(await kernel.status(CHILD, changes_since=0))
    assert status["stateChanges"]["earliestAvailableSequence"] == 3


async def test_state_versions_for_a_list(kernel: Kernel) -> None:
    await human(kernel, CHILD)
    await human(kernel, "global", agent_id="a")
    await human(kernel, "global", agent_id="b")
    assert wire.state_versions(await kernel.state_versions([CHILD, "global", "agent:x:y"])) == [
        {"sessionKey": CHILD, "agentId": "main", "stateVersion": 1, "doing": None},
        {"sessionKey": "global", "agentId": "a", "stateVersion": 2, "doing": None},
        {"sessionKey": "global", "agentId": "b", "stateVersion": 3, "doing": None},
        {"sessionKey": "agent:x:y", "agentId": "x", "stateVersion": 0, "doing": None},
    ]


OLD_GATEWAY_DDL = """
CREATE TABLE sessions (id TEXT PRIMARY KEY, body TEXT);
INSERT INTO sessions VALUES ('s1', 'gateway row');
CREATE TABLE session_state_events (
  sequence INTEGER PRIMARY KEY AUTOINCREMENT, dedupe_key TEXT UNIQUE,
  session_key TEXT NOT NULL, session_id TEXT, agent_id TEXT NOT NULL, kind TEXT NOT NULL,
  actor_type TEXT NOT NULL, actor_id TEXT, run_id TEXT, occurred_at INTEGER NOT NULL,
  summary TEXT NOT NULL, payload_json TEXT);
CREATE TABLE session_state_heads (session_key TEXT NOT NULL, agent_id TEXT NOT NULL,
  last_sequence INTEGER NOT NULL, pruned_max_sequence INTEGER NOT NULL DEFAULT 0,
  updated_at INTEGER NOT NULL, PRIMARY KEY (session_key, agent_id));
CREATE TABLE session_watch_cursors (watcher_session_key TEXT NOT NULL,
  target_session_key TEXT NOT NULL, last_seen_sequence INTEGER NOT NULL DEFAULT 0,
  notified_sequence INTEGER NOT NULL DEFAULT 0, material_sequence INTEGER NOT NULL DEFAULT 0,
  updated_at INTEGER NOT NULL, PRIMARY KEY (watcher_session_key, target_session_key));
INSERT INTO session_state_events (session_key, agent_id, kind, actor_type, occurred_at, summary)
  VALUES ('agent:main:subagent:child', 'main', 'goal_changed', 'human', 1790000000000,
          'goal updated');
INSERT INTO session_state_heads VALUES ('agent:main:subagent:child', 'main', 41, 0, 1790000000000);
UPDATE sqlite_sequence SET seq = 41 WHERE name = 'session_state_events';
INSERT INTO session_watch_cursors
  VALUES ('agent:main:main', 'agent:main:subagent:child', 0, 0, 0, 1790000000000);
"""


async def test_opens_a_gateway_database_of_the_older_shape(
    db_path: Path, open_kernel: KernelFactory
) -> None:
    with sqlite3.connect(db_path) as conn:
        conn.executescript(OLD_GATEWAY_DDL)
    kernel: Kernel = await open_kernel()
    assert (await human(kernel, CHILD)).event.sequence == 42  # continues after the gateway's
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT * FROM sessions").fetchall() == [("s1", "gateway row")]
        cols = [r[1] for r in conn.execute("PRAGMA table_info(session_watch_cursors)")]
        assert cols[:6] == [
            "watcher_session_key",
            "target_session_key",
            "last_seen_sequence",
            "notified_sequence",
            "material_sequence",
            "updated_at",
        ]
        assert {"watcher_store_path", "provenance"} <= set(cols)
        legacy = conn.execute("SELECT watcher_store_path, provenance FROM session_watch_cursors")
        assert legacy.fetchall() == [(None, "explicit")]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "session_upstream_links" in tables
    assert await kernel.notices(watcher="agent:main:main") == []  # legacy cursor: silent


async def test_a_newer_schema_is_refused(db_path: Path, open_kernel: KernelFactory) -> None:
    await (await open_kernel()).close()
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE sessionwatch_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(SchemaTooNew, match="schema version 99"):
        await open_kernel()


async def test_tables_are_strict_and_wal(db_path: Path, kernel: Kernel) -> None:
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE type='table'").fetchall()
    strict = {name for name, sql in rows if sql and sql.rstrip().endswith("STRICT")}
    assert {
        "session_state_events",
        "session_state_heads",
        "session_watch_cursors",
        "session_upstream_links",
    } <= strict
