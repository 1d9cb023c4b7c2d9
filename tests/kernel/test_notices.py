"""The cursor and notice protocol (docs/specification.md section 6)."""

from __future__ import annotations

from typing import Any

import pytest

from monitor.kernel import Kernel, KernelSettings, NewEvent
from monitor.kernel.events import ActorType, EventKind
from monitor.web import wire
from tests.helpers import KernelFactory, ManualClock, WakeLog, human, notice, texts

MAIN = "agent:main:main"
CHILD = "agent:main:subagent:child"
GROUP = "agent:main:telegram:group:room-1"


async def test_spawn_seeds_parent_cursor_at_the_spawn_sequence(kernel: Kernel) -> None:
    """The parent watches the child from the spawn on; earlier history never notifies."""
    await human(kernel, CHILD)
    spawned = await kernel.spawn(parent=MAIN, child=CHILD, run_id="r1")
    assert await texts(kernel, MAIN) == []
    await human(kernel, CHILD)
    assert [notice(CHILD, spawned.event.sequence)] == await texts(kernel, MAIN)


async def test_freezes_one_watermark_while_material_events_continue(kernel: Kernel) -> None:
    """Twenty quick changes still give one byte-stable notice line."""
    await kernel.spawn(parent=MAIN, child=CHILD, run_id="r1")
    opened = []
    for _ in range(20):
        opened += (await human(kernel, CHILD)).notices
    assert len(opened) == 1
    assert [notice(CHILD, 1)] == await texts(kernel, MAIN)


async def test_drain_acks_and_reopens_once_for_interleaved_work(kernel: Kernel) -> None:
    """Work after the freeze reopens exactly one fresh notice; then the queue is empty."""
    await kernel.spawn(parent=MAIN, child=CHILD, run_id="r1")
    first = await human(kernel, CHILD)
    await human(kernel, CHILD)
    await human(kernel, CHILD)
    assert [notice(CHILD, 1)] == await texts(kernel, MAIN, drain=True)
    assert [notice(CHILD, first.event.sequence)] == await texts(kernel, MAIN, drain=True)
    assert await texts(kernel, MAIN, drain=True) == []


async def test_drain_without_interleaved_work_does_not_reopen(kernel: Kernel) -> None:
    await kernel.spawn(parent=MAIN, child=CHILD, run_id="r1")
    await human(kernel, CHILD)
    assert len(await texts(kernel, MAIN, drain=True)) == 1
    assert await texts(kernel, MAIN) == []


async def test_log_only_kinds_queue_nothing(kernel: Kernel) -> None:
    """run_completed, run_failed, compacted, adopted, imported, created never notify."""
    await kernel.spawn(parent=MAIN, child=CHILD, run_id="r1")
    for kind, extra in [
        (EventKind.RUN_COMPLETED, {"run_id": "r1"}),
        (EventKind.RUN_FAILED, {"run_id": "r2", "payload": {"outcome": "timeout"}}),
        (EventKind.COMPACTED, {"dedupe_key": "compacted:op1"}),
        (EventKind.ADOPTED, {}),
        (EventKind.IMPORTED, {}),
        (EventKind.CREATED, {"session_id": "s1"}),
    ]:
        result = await kernel.record(
            NewEvent(session_key=CHILD, kind=kind, actor_type=ActorType.SYSTEM, **extra)
        )
        assert result.notices == ()
    assert await texts(kernel, MAIN) == []


async def test_no_reopen_for_log_only_events_between_freeze_and_drain(kernel: Kernel) -> None:
    await kernel.spawn(parent=MAIN, child=CHILD, run_id="r1")
    await human(kernel, CHILD)
    await kernel.record(
        NewEvent(
            session_key=CHILD,
            kind=EventKind.RUN_COMPLETED,
            actor_type=ActorType.SYSTEM,
            run_id="r1",
        )
    )
    assert len(await texts(kernel, MAIN, drain=True)) == 1
    assert await texts(kernel, MAIN) == []


async def test_upstream_missing_and_goal_changed_notify(kernel: Kernel) -> None:
    await kernel.spawn(parent=MAIN, child=CHILD, run_id="r1")
    missing = await kernel.record(
        NewEvent(
            session_key=CHILD,
            kind=EventKind.UPSTREAM_MISSING,
            actor_type=ActorType.SYSTEM,
            payload={"channel": "claude"},
        )
    )
    assert [notice(CHILD, 1)] == [n.text for n in missing.notices]
    assert missing.event.summary == "upstream missing via claude"
    await kernel.notices(watcher=MAIN, drain=True)
    goal = await kernel.record(
        NewEvent(session_key=CHILD, kind=EventKind.GOAL_CHANGED, actor_type=ActorType.HUMAN)
    )
    assert len(goal.notices) == 1


async def test_watcher_is_not_told_about_its_own_events(kernel: Kernel) -> None:
    """Self-suppression: actor id equal to the watcher key notifies nobody else either way."""
    await kernel.spawn(parent=MAIN, child=CHILD, run_id="r1")
    own = await kernel.record(
        NewEvent(
            session_key=CHILD,
            kind=EventKind.GOAL_CHANGED,
            actor_type=ActorType.AGENT,
            actor_id=MAIN,
        )
    )
    assert own.notices == ()
    assert await texts(kernel, MAIN) == []


async def test_explicit_watch_starts_at_current_version_and_reregister_keeps_cursor(
    kernel: Kernel,
) -> None:
    peer = "agent:ops:main"
    await human(kernel, CHILD)
    await human(kernel, CHILD)
    assert await kernel.watch(watcher=peer, target=CHILD)
    assert await texts(kernel, peer) == []
    await human(kernel, CHILD)
    assert await kernel.watch(watcher=peer, target=CHILD)
    assert [notice(CHILD, 2)] == await texts(kernel, peer)


@pytest.mark.parametrize(
    ("watcher", "target"),
    [("global", CHILD), (MAIN, "global"), (MAIN, MAIN), ("agent:main", CHILD)],
)
async def test_watch_refuses_unqualified_or_self(kernel: Kernel, watcher: str, target: str) -> None:
    assert not await kernel.watch(watcher=watcher, target=target)


async def test_global_sessions_log_per_agent_and_notify_nobody(kernel: Kernel) -> None:
    """Bare ``global`` keys get the log and changesSince per agent, no cursor or notice."""
    a = await human(kernel, "global", agent_id="alpha")
    b = await human(kernel, "global", agent_id="beta")
    assert a.notices + b.notices == ()
    alpha = wire.status(await kernel.status("global", agent_id="alpha", changes_since=0))
    beta = wire.status(await kernel.status("global", agent_id="beta", changes_since=0))
    assert [a.event.sequence] == [e["sequence"] for e in alpha["stateChanges"]["events"]]
    assert [b.event.sequence] == [e["sequence"] for e in beta["stateChanges"]["events"]]


async def test_store_change_carries_nothing_over(kernel: Kernel) -> None:
    """Re-registering from another store starts afresh at the target's version."""
    await kernel.watch(watcher=MAIN, target=CHILD, store_path="/a/sessions.json")
    await human(kernel, CHILD)
    assert len(await texts(kernel, MAIN, store_path="/a/sessions.json")) == 1
    await kernel.watch(watcher=MAIN, target=CHILD, store_path="/b/sessions.json")
    assert await texts(kernel, MAIN, store_path="/b/sessions.json") == []
    assert await texts(kernel, MAIN, store_path="/a/sessions.json") == []
    await human(kernel, CHILD)
    assert [notice(CHILD, 1)] == await texts(kernel, MAIN, store_path="/b/sessions.json")


async def test_legacy_cursor_without_store_path_notifies_until_reregistered(
    kernel: Kernel,
) -> None:
    """A row an older writer left with a NULL store path delivers nothing until watched."""

    def legacy(conn: object) -> None:
        conn.execute(  # type: ignore[attr-defined]
            "INSERT INTO session_watch_cursors (watcher_session_key, target_session_key,"
            " last_seen_sequence, notified_sequence, material_sequence, updated_at)"
            " VALUES (?, ?, 0, 0, 0, ?)",
            (MAIN, CHILD, kernel.clock()),
        )

    await kernel.store.write(legacy)
    assert (await human(kernel, CHILD)).notices == ()
    assert await texts(kernel, MAIN) == []
    assert await kernel.watch(watcher=MAIN, target=CHILD)
    second = await human(kernel, CHILD)
    assert [notice(CHILD, 1)] == [n.text for n in second.notices]


async def test_reset_drops_watcher_cursors_and_keeps_target_history(kernel: Kernel) -> None:
    await kernel.spawn(parent=MAIN, child=CHILD, run_id="r1")
    await human(kernel, CHILD)
    await kernel.gateway_sessions.reset(MAIN)
    assert await texts(kernel, MAIN) == []
    assert (wire.status(await kernel.status(CHILD)))["stateVersion"] == 2
    assert (await human(kernel, CHILD)).notices == ()


async def test_delete_removes_events_head_and_cursors_on_both_sides(kernel: Kernel) -> None:
    await kernel.spawn(parent=MAIN, child=CHILD, run_id="r1")
    await kernel.watch(watcher=CHILD, target="agent:main:other")
    await human(kernel, CHILD)
    await kernel.gateway_sessions.delete(CHILD)
    status = wire.status(await kernel.status(CHILD, changes_since=0))
    assert status["stateVersion"] == 0
    assert status["stateChanges"]["events"] == []
    assert await texts(kernel, MAIN) == []

    def count(conn: object) -> int:
        return int(conn.execute("SELECT count(*) FROM session_watch_cursors").fetchone()[0])  # type: ignore[attr-defined]

    assert await kernel.store.read(count) == 0


async def test_restart_sees_the_same_pending_notices(open_kernel: KernelFactory) -> None:
    first: Kernel = await open_kernel()
    await first.spawn(parent=MAIN, child=CHILD, run_id="r1")
    await human(first, CHILD)
    await human(first, CHILD)
    second: Kernel = await open_kernel()
    assert [notice(CHILD, 1)] == [n.text for n in await second.sweep()]
    assert [notice(CHILD, 1)] == await texts(second, MAIN)


async def test_sweep_self_heals_a_lost_freeze(kernel: Kernel) -> None:
    """A cursor with material work but no frozen watermark is frozen and re-enqueued."""
    await kernel.watch(watcher=MAIN, target=CHILD)

    def lose(conn: object) -> None:
        conn.execute("UPDATE session_watch_cursors SET material_sequence = 5")  # type: ignore[attr-defined]

    await kernel.store.write(lose)
    assert [notice(CHILD, 0)] == [n.text for n in await kernel.sweep()]
    assert [notice(CHILD, 0)] == await texts(kernel, MAIN, drain=True)
    assert await texts(kernel, MAIN) == []


async def test_main_watchers_woken_and_coalesced_nested_only_queued(
    open_kernel: KernelFactory, clock: ManualClock
) -> None:
    """Main sessions wake at once and at most once per 20 s; sub-agent watchers never."""
    wakes = WakeLog()
    kernel: Kernel = await open_kernel(wake=wakes)
    assert wakes.timers is not None
    nested = "agent:main:subagent:manager"
    await kernel.spawn(parent=MAIN, child=CHILD, run_id="r1")
    await kernel.spawn(parent=nested, child="agent:main:subagent:leaf", run_id="r2")
    await human(kernel, CHILD)
    await human(kernel, "agent:main:subagent:leaf")
    await wakes.settled()
    assert wakes.woken == [MAIN]
    await kernel.notices(watcher=MAIN, drain=True)
    await wakes.timers.advance(5_000)
    await human(kernel, CHILD)  # inside the window: one trailing wake is scheduled
    await kernel.notices(watcher=MAIN, drain=True)
    await human(kernel, CHILD)
    await wakes.settled()
    assert wakes.woken == [MAIN]
    assert wakes.timers.delays_ms == [15_000]
    await wakes.timers.advance(15_000)
    await wakes.settled()
    assert wakes.woken == [MAIN, MAIN]
    await wakes.timers.advance(21_000)
    await kernel.notices(watcher=MAIN, drain=True)
    await kernel.notices(watcher=MAIN, drain=True)
    await human(kernel, CHILD)
    await wakes.settled()
    assert wakes.woken == [MAIN, MAIN, MAIN]


async def test_ambient_group_watch_is_queue_only_and_promoted_by_explicit(
    open_kernel: KernelFactory,
) -> None:
    wakes = WakeLog()
    kernel: Kernel = await open_kernel(wake=wakes)
    assert await kernel.watch(watcher=MAIN, target=GROUP, ambient=True)
    result = await human(kernel, GROUP)
    assert [notice(GROUP, 0)] == [n.text for n in result.notices]
    await wakes.settled()
    assert wakes.woken == []
    await kernel.notices(watcher=MAIN, drain=True)
    assert await kernel.watch(watcher=MAIN, target=GROUP)  # explicit: promoted
    assert await kernel.watch(watcher=MAIN, target=GROUP, ambient=True)  # never downgraded
    await human(kernel, GROUP)
    await wakes.settled()
    assert wakes.woken == [MAIN]


@pytest.mark.parametrize(
    ("watcher", "target"),
    [
        ("agent:ops:main", GROUP),  # not the group's own agent
        (MAIN, MAIN),  # a group routed into main is not watched
        (MAIN, CHILD),  # not a group session
        ("agent:main:subagent:x", GROUP),  # only the main session watches ambiently
    ],
)
async def test_ambient_watch_refused(kernel: Kernel, watcher: str, target: str) -> None:
    assert not await kernel.watch(watcher=watcher, target=target, ambient=True)


async def test_ambient_watch_off_under_shared_group_scope(open_kernel: KernelFactory) -> None:
    kernel: Kernel = await open_kernel(settings=KernelSettings(group_scope="shared"))
    assert not await kernel.watch(watcher=MAIN, target=GROUP, ambient=True)


async def test_session_created_notice_is_batched_and_switchable(
    open_kernel: KernelFactory,
) -> None:
    kernel: Kernel = await open_kernel()
    await kernel.gateway_sessions.upsert(CHILD, session_id="s1")
    await kernel.gateway_sessions.upsert("agent:main:subagent:two", session_id="s2")
    await kernel.gateway_sessions.upsert(CHILD, session_id="s1", run_active=True)  # an update
    await kernel.gateway_sessions.upsert(MAIN, session_id="s0")  # main itself: no notice
    await kernel.gateway_sessions.upsert("agent:main:cron:job", session_id="s3")  # internal: none
    assert 0 == len(await kernel.notices(watcher=MAIN))  # not a stale-state notice
    text = (await kernel.inbox(watcher=MAIN, drain=True)).created
    assert text is not None
    assert [
        "Recent session creations (bounded summary; older entries may be omitted):",
        "- New session created: agent:main:subagent:two",
        f"- New session created: {CHILD}",
    ] == text.splitlines()
    status = wire.status(await kernel.status(CHILD, changes_since=0))
    assert [e["kind"] for e in status["stateChanges"]["events"]] == ["created"]
    assert (await kernel.inbox(watcher=MAIN)).created is None  # drained
    quiet: Kernel = await open_kernel(settings=KernelSettings(notify_on_create=False))
    await quiet.gateway_sessions.upsert("agent:main:subagent:three", session_id="s4")
    assert (await quiet.inbox(watcher=MAIN, drain=True)).created is None


async def ours(kernel: Kernel, watcher: str) -> list[str]:
    """The targets of ``watcher``'s notices that a sidecar opened (what it wakes for)."""
    return [n.target for n in await kernel.pending() if n.watcher == watcher]


async def test_created_summary_is_capped_at_8_kib_and_the_queue_at_100(
    kernel: Kernel, clock: ManualClock
) -> None:
    """The newest first: the cap drops the oldest; the queue keeps the newest 100."""
    for i in range(150):
        clock.advance(1)
        key = f"agent:main:subagent:{i:040d}"
        await kernel.gateway_sessions.upsert(key, session_id=f"s{i}")
    text = (await kernel.inbox(watcher=MAIN)).created
    assert text is not None
    assert len(text) <= 8192
    lines = text.splitlines()[1:]
    assert f"- New session created: agent:main:subagent:{149:040d}" == lines[0]
    assert len(lines) < 100
    count = await kernel.read(
        lambda c: c.execute("SELECT count(*) FROM sessionwatch_created_notices").fetchone()[0]
    )
    assert 100 == count


async def test_a_group_turn_makes_main_an_ambient_watcher_once(
    open_kernel: KernelFactory,
) -> None:
    """The first human turn registers one ambient watch; later turns queue without a wake."""
    wakes = WakeLog()
    kernel: Kernel = await open_kernel(wake=wakes)
    first = await human(kernel, GROUP)
    assert () == first.notices  # the watch starts after the first turn
    second = await human(kernel, GROUP)
    third = await human(kernel, GROUP)
    assert [notice(GROUP, first.event.sequence)] == [n.text for n in second.notices]
    assert () == third.notices  # coalesced into the pending one
    await wakes.settled()
    assert [] == wakes.woken
    assert [notice(GROUP, 1)] == await texts(kernel, MAIN)


async def test_no_ambient_watch_for_non_groups_or_shared_scope(open_kernel: KernelFactory) -> None:
    kernel: Kernel = await open_kernel()
    await human(kernel, CHILD)
    await human(kernel, CHILD)
    await human(kernel, MAIN)
    shared: Kernel = await open_kernel(settings=KernelSettings(group_scope="shared"))
    await human(shared, "agent:main:slack:channel:c9")
    await human(shared, "agent:main:slack:channel:c9")
    assert [] == await texts(kernel, MAIN)


def the_gateway_opens_one(conn: Any, target: str, watcher: str | None = None) -> None:
    """A human turn on ``target`` and the fresh notice it opens (for ``watcher``, else for
    every watcher of it; what was pending delivered first), as OpenClaw's own recording
    writes them: no sidecar's mark."""
    sequence = conn.execute(
        "INSERT INTO session_state_events (session_key, agent_id, kind, actor_type,"
        " occurred_at, summary) VALUES (?, 'main', 'human_direct_message', 'human', 1,"
        " 'human message') RETURNING sequence",
        (target,),
    ).fetchone()[0]
    only = "" if watcher is None else " AND watcher_session_key = ?"
    conn.execute(
        "UPDATE session_watch_cursors SET last_seen_sequence = material_sequence,"
        " notified_sequence = ?, material_sequence = ? WHERE target_session_key = ?" + only,
        (sequence, sequence, target, *([] if watcher is None else [watcher])),
    )


async def test_a_change_on_a_pair_the_gateway_froze_reaches_the_gateway_once(
    open_kernel: KernelFactory, clock: ManualClock
) -> None:
    """A notice the gateway opened (in the database, unmarked) is left to the gateway, until
    this sidecar records a change on that pair: then the notice is this sidecar's to wake,
    once, so no pair stays behind a frozen notice nobody wakes."""
    wakes = WakeLog()
    kernel: Kernel = await open_kernel(wake=wakes)
    await kernel.spawn(parent=MAIN, child=CHILD, run_id="r1")
    await human(kernel, CHILD)
    await kernel.notices(watcher=MAIN, drain=True)
    await wakes.settled()
    wakes.woken.clear()
    await wakes.timers.advance(21_000)  # past the wake window

    await kernel.store.write(lambda conn: the_gateway_opens_one(conn, CHILD))
    await kernel.sweep()
    await wakes.settled()
    assert [] == wakes.woken  # the gateway's own: left to it
    assert [] == await ours(kernel, MAIN)
    taken = await human(kernel, CHILD)
    assert [notice(CHILD, 2)] == [n.text for n in taken.notices]
    await human(kernel, CHILD)  # the same pending notice: not again
    await wakes.settled()
    assert [MAIN] == wakes.woken
    assert [CHILD] == await ours(kernel, MAIN)


async def test_one_change_marks_every_watcher_at_once_and_opens_only_fresh_marks(
    kernel: Kernel,
) -> None:
    """Ten watchers of one target: a turn opens ten notices (their marks written in one
    statement); a second turn while they are pending opens none; a notice the gateway
    opened meanwhile on one pair (unmarked) becomes this sidecar's at the next turn, that
    one alone."""
    watchers = [f"agent:main:dashboard:w{i}" for i in range(10)]
    for w in watchers:
        assert await kernel.watch(watcher=w, target=CHILD)
    first = await human(kernel, CHILD)
    assert sorted(watchers) == sorted(n.watcher for n in first.notices)
    assert () == (await human(kernel, CHILD)).notices

    await kernel.store.write(lambda conn: the_gateway_opens_one(conn, CHILD, watchers[3]))
    assert [watchers[3]] == [n.watcher for n in (await human(kernel, CHILD)).notices]
    marks = await kernel.read(
        lambda c: c.execute("SELECT count(*) FROM sessionwatch_opened_notices").fetchone()[0]
    )
    assert 10 == marks
