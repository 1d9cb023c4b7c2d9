"""The upstream monitor end to end: real files appended to, real SQLite, one tick at a time."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from adapters.base import own_text_hash
from monitor.config import Config, HostConfig, MonitorConfig, RootsConfig
from monitor.errors import BadInput
from monitor.kernel import Kernel
from monitor.upstream import UpstreamMonitor
from monitor.web import wire
from tests.helpers import REPO, allow_event_inserts, notice, refuse_event_inserts, user_line

KEY = "agent:main:adopted:x"
MAIN = "agent:main:main"


@pytest.fixture
def monitor(kernel: Kernel, roots: RootsConfig) -> UpstreamMonitor:
    return UpstreamMonitor.from_config(kernel, Config(roots=roots))


async def adopt_watched(monitor: UpstreamMonitor, path: Path, kind: str = "claude") -> Any:
    result = wire.adopted(
        await monitor.adoption.adopt(kind=kind, path=str(path), session_key=KEY, session_id="s1")
    )
    assert await monitor.kernel.watch(watcher=MAIN, target=KEY)
    return result


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


async def outcomes(monitor: UpstreamMonitor) -> list[tuple[str, int]]:
    return [(r.outcome, r.turns) for r in await monitor.ticker.tick()]


async def test_a_human_prompt_gives_one_event_and_one_notice(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(user_line("before adoption"))
    adopted = await adopt_watched(monitor, path)
    assert {"offset": path.stat().st_size} == adopted["link"]["marker"]
    append(path, user_line("fix the test", "u1"))
    assert await outcomes(monitor) == [("activity", 1)]
    assert await outcomes(monitor) == [("quiet", 0)]
    status = wire.status(await monitor.kernel.status(KEY, changes_since=0))
    kinds = [(e["kind"], e["summary"]) for e in status["stateChanges"]["events"]]
    assert kinds == [
        ("adopted", "adopted from claude"),
        ("human_direct_message", "human message via claude"),
    ]
    assert [notice(KEY, 1)] == [n.text for n in await monitor.kernel.notices(watcher=MAIN)]


async def test_a_burst_is_one_event_with_turns(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    await adopt_watched(monitor, path)
    append(path, user_line("one", "u1") + user_line("two", "u2") + user_line("three", "u3"))
    assert await outcomes(monitor) == [("activity", 3)]
    events = (wire.status(await monitor.kernel.status(KEY, changes_since=1)))["stateChanges"][
        "events"
    ]
    # the gateway monitor's row: the channel in the summary, the payload only the burst
    assert [(e["summary"], e["payload"]) for e in events] == [
        ("human message via claude", {"turns": 3})
    ]
    append(path, user_line("four", "u4"))
    assert await outcomes(monitor) == [("activity", 1)]
    rows = await monitor.kernel.store.peek(
        lambda conn: conn.execute(
            "SELECT summary, payload_json FROM session_state_events"
            " WHERE kind = 'human_direct_message' ORDER BY sequence"
        ).fetchall()
    )
    assert [("human message via claude", '{"turns":3}'), ("human message via claude", None)] == [
        tuple(row) for row in rows
    ]


async def test_self_echo_advances_without_an_event(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    await adopt_watched(monitor, path)
    await monitor.kernel.gateway_sessions.remember_own_message(
        KEY, own_text_hash("sent  by the\ngateway")
    )
    append(path, user_line(" sent by the gateway "))
    assert await outcomes(monitor) == [("quiet", 0)]
    assert (wire.status(await monitor.kernel.status(KEY)))["stateVersion"] == 1


async def test_unwatched_links_are_never_probed(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    wire.adopted(
        await monitor.adoption.adopt(
            kind="claude", path=str(path), session_key=KEY, session_id="s1"
        )
    )
    append(path, user_line("hello"))
    assert await outcomes(monitor) == []


async def test_three_misses_record_upstream_missing_and_drop_the_link(
    kernel: Kernel, roots: RootsConfig
) -> None:
    """Each tick here is a fresh monitor, as separate ``tick`` processes would be."""
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    await adopt_watched(UpstreamMonitor.from_config(kernel, Config(roots=roots)), path)
    path.unlink()
    seen = [
        await outcomes(UpstreamMonitor.from_config(kernel, Config(roots=roots))) for _ in range(3)
    ]
    assert seen == [[("missing", 0)]] * 3
    assert await UpstreamMonitor.from_config(kernel, Config(roots=roots)).links() == []
    pending = await kernel.notices(watcher=MAIN)
    assert [notice(KEY, 1)] == [n.text for n in pending]
    events = (wire.status(await kernel.status(KEY, changes_since=1)))["stateChanges"]["events"]
    assert [e["summary"] for e in events] == ["upstream missing via claude"]


async def test_a_quiet_check_resets_the_missing_streak(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    await adopt_watched(monitor, path)
    path.rename(path.with_suffix(".bak"))
    await monitor.ticker.tick()
    await monitor.ticker.tick()
    path.with_suffix(".bak").rename(path)
    await monitor.ticker.tick()
    path.unlink()
    await monitor.ticker.tick()
    assert (wire.links(await monitor.links()))[0]["missingStreak"] == 1


async def test_a_busy_session_is_deferred_and_its_marker_stays(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    await adopt_watched(monitor, path)
    append(path, user_line("while busy"))
    await monitor.kernel.gateway_sessions.upsert(KEY, run_active=True)
    assert await outcomes(monitor) == [("skipped", 0)]
    assert (wire.links(await monitor.links()))[0]["marker"] == {"offset": 0}
    await monitor.kernel.gateway_sessions.upsert(KEY, run_active=False)
    assert await outcomes(monitor) == [("activity", 1)]


async def _three_watched_links(monitor: UpstreamMonitor, roots: RootsConfig) -> list[str]:
    """Three empty transcripts, adopted and watched: their session keys."""
    keys = [f"agent:main:adopted:x{i}" for i in range(3)]
    for i, key in enumerate(keys):
        path = Path(roots.claude) / f"s{i}.jsonl"
        path.write_bytes(b"")
        wire.adopted(
            await monitor.adoption.adopt(
                kind="claude", path=str(path), session_key=key, session_id=f"s{i}"
            )
        )
        assert await monitor.kernel.watch(watcher=MAIN, target=key)
    return keys


async def test_a_failing_insert_leaves_the_marker(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    await adopt_watched(monitor, path)

    await monitor.kernel.store.write(refuse_event_inserts)
    append(path, user_line("do not lose me"))
    assert await outcomes(monitor) == [("inconclusive", 0)]
    assert (wire.links(await monitor.links()))[0]["marker"] == {"offset": 0}
    await monitor.kernel.store.write(allow_event_inserts)
    assert await outcomes(monitor) == [("activity", 1)]


async def test_a_store_that_refuses_the_tick_is_said_once_and_loses_nothing(
    monitor: UpstreamMonitor, roots: RootsConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """While the store refuses every write (a full disk; a lock held elsewhere fails the same
    way, at once), a second link in a row that cannot settle ends the tick's writes: the
    others are not made to wait for it too. The refusal and its end are each said once, not
    at every tick, and every prompt is recorded once when the store takes writes again."""
    keys = await _three_watched_links(monitor, roots)
    await monitor.kernel.store.write(refuse_event_inserts)
    for i in range(3):
        append(Path(roots.claude) / f"s{i}.jsonl", user_line(f"prompt {i}", f"u{i}"))
    caplog.set_level(logging.WARNING, logger="monitor.upstream.tick")
    for _ in range(3):
        results = await monitor.ticker.tick()
        assert [("inconclusive", True)] * 3 == [(r.outcome, r.unsettled) for r in results]
    assert [{"offset": 0}] * 3 == [link["marker"] for link in wire.links(await monitor.links())]
    said = [r.getMessage() for r in caplog.records]
    assert 1 == sum("the tick's writes wait" in m for m in said), said
    await monitor.kernel.store.write(allow_event_inserts)
    assert [("activity", 1)] * 3 == await outcomes(monitor)
    assert [("quiet", 0)] * 3 == await outcomes(monitor)
    said = [r.getMessage() for r in caplog.records]
    assert 1 == sum("takes the tick's writes again" in m for m in said), said
    for key in keys:
        events = (wire.status(await monitor.kernel.status(key, changes_since=0)))["stateChanges"][
            "events"
        ]
        assert ["adopted", "human_direct_message"] == [e["kind"] for e in events]


async def test_one_links_failed_write_stays_that_links(
    monitor: UpstreamMonitor, roots: RootsConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """A write that fails for one link alone (a constraint, a trigger) leaves that link's
    marker and reason; the other links of the tick record and advance (as OpenClaw goes on
    with the provider batch when one marker settlement fails)."""
    keys = await _three_watched_links(monitor, roots)
    await monitor.kernel.store.write(lambda conn: refuse_event_inserts(conn, only=keys[1]))
    for i in range(3):
        append(Path(roots.claude) / f"s{i}.jsonl", user_line(f"prompt {i}", f"u{i}"))
    caplog.set_level(logging.WARNING, logger="monitor.upstream.tick")
    for healthy in (("activity", 1), ("quiet", 0)):
        results = {r.session_key: r for r in await monitor.ticker.tick()}
        assert "inconclusive" == results[keys[1]].outcome
        assert "could not record" in (results[keys[1]].reason or "")
        assert [healthy, healthy] == [(results[k].outcome, results[k].turns) for k in keys[::2]]
    markers = {link["sessionKey"]: link["marker"] for link in wire.links(await monitor.links())}
    assert {"offset": 0} == markers[keys[1]]
    assert markers[keys[0]]["offset"] > 0 and markers[keys[2]]["offset"] > 0
    said = [r.getMessage() for r in caplog.records]
    assert 1 == sum("refused this link's findings" in m for m in said), said
    assert 0 == sum("the tick's writes wait" in m for m in said), said
    await monitor.kernel.store.write(allow_event_inserts)
    results = {r.session_key: r for r in await monitor.ticker.tick()}
    assert ("activity", 1) == (results[keys[1]].outcome, results[keys[1]].turns)
    for key in keys:
        events = (wire.status(await monitor.kernel.status(key, changes_since=0)))["stateChanges"][
            "events"
        ]
        assert ["adopted", "human_direct_message"] == [e["kind"] for e in events]


async def test_a_long_line_is_read_across_ticks_and_counts_once(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    """A prompt longer than the per-tick budget (a pasted screenshot) is one turn."""
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    await adopt_watched(monitor, path)
    monitor.adapters["claude"].scan_cap = 64  # type: ignore[attr-defined]
    append(path, user_line("x" * 200) + user_line("after"))
    ticks = [(await outcomes(monitor))[0] for _ in range(8)]
    assert [("quiet", 0)] * 3 == ticks[:3]  # the first 192 bytes, held aside
    assert 2 == sum(turns for _, turns in ticks)
    assert ("quiet", 0) == ticks[-1]
    assert (wire.status(await monitor.kernel.status(KEY)))["stateVersion"] == 3


async def test_a_line_over_max_line_bytes_blocks_visibly_and_logs_once(
    kernel: Kernel, roots: RootsConfig, caplog: pytest.LogCaptureFixture
) -> None:
    config = Config(roots=roots, monitor=MonitorConfig(scan_cap_bytes=64, max_line_bytes=128))
    monitor = UpstreamMonitor.from_config(kernel, config)
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    await adopt_watched(monitor, path)
    append(path, user_line("x" * 200))
    with caplog.at_level(logging.WARNING):
        results = [(await outcomes(monitor))[0] for _ in range(4)]
    assert [("quiet", 0), ("quiet", 0), ("blocked", 0), ("blocked", 0)] == results
    assert caplog.text.count("blocked:") == 1
    link = (wire.links(await monitor.links()))[0]
    assert link["blocked"]["offset"] == 0
    assert "longer than max_line_bytes (128)" in link["blocked"]["reason"]


def stamped_line(text: str, uuid: str, at: str) -> bytes:
    record = {
        "type": "user",
        "uuid": uuid,
        "timestamp": at,
        "message": {"role": "user", "content": text},
    }
    return orjson.dumps(record) + b"\n"


async def _two_then_a_third(monitor: UpstreamMonitor, roots: RootsConfig) -> tuple[Path, bytes]:
    """A transcript of two stamped prompts, adopted, then a third read by a tick: the path
    and the first two lines."""
    path = Path(roots.claude) / "s.jsonl"
    first_two = stamped_line("one", "u1", "2026-01-01T00:00:01Z") + stamped_line(
        "two", "u2", "2026-01-01T00:00:02Z"
    )
    path.write_bytes(first_two)
    await adopt_watched(monitor, path)
    append(path, stamped_line("three", "u3", "2026-01-01T00:00:03Z"))
    assert await outcomes(monitor) == [("activity", 1)]
    return path, first_two


@pytest.mark.parametrize("how", ["rotated", "truncated"])
async def test_a_rotated_or_truncated_file_loses_nothing_and_repeats_nothing(
    monitor: UpstreamMonitor, roots: RootsConfig, how: str
) -> None:
    """Only what was written since counts. A new file that holds the same history (a save
    by rename, a harness writing a file back) continues from the offset, and is no change;
    a truncated one is read again from its start."""
    path, old = await _two_then_a_third(monitor, roots)
    new = stamped_line("four", "u4", "2026-01-01T00:00:04Z") + stamped_line(
        "five", "u5", "2026-01-01T00:00:05Z"
    )
    if how == "rotated":  # the history copied over, then two new prompts, in a new file
        fresh = path.with_suffix(".new")
        fresh.write_bytes(old + stamped_line("three", "u3", "2026-01-01T00:00:03Z") + new)
        fresh.replace(path)
    else:  # cut back to nothing, then written again
        path.write_bytes(b"")
        path.write_bytes(new)
    assert await outcomes(monitor) == [("activity", 2)]
    assert await outcomes(monitor) == [("quiet", 0)]
    link = (wire.links(await monitor.links()))[0]
    assert ({} if how == "rotated" else {how: 1}) == link["marker"].get("changes", {})
    assert (wire.status(await monitor.kernel.status(KEY)))["stateVersion"] == 3


async def test_a_rewrite_whose_old_offset_falls_on_a_line_end_is_seen(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    """Same inode, same first line, and the old offset still ends a line of the new bytes:
    only the fingerprint of the bytes before the offset tells the file was rewritten."""
    path, first_two = await _two_then_a_third(monitor, roots)
    offset = path.stat().st_size
    inode = path.stat().st_ino
    rewritten = first_two + stamped_line("fours", "u4", "2026-01-01T00:00:04Z")
    assert len(rewritten) == offset  # the old offset ends a line of the new bytes
    path.write_bytes(rewritten + stamped_line("fives", "u5", "2026-01-01T00:00:05Z"))
    assert path.stat().st_ino == inode
    assert await outcomes(monitor) == [("activity", 2)]
    assert await outcomes(monitor) == [("quiet", 0)]
    assert {"truncated": 1} == (wire.links(await monitor.links()))[0]["marker"]["changes"]


async def test_a_line_over_max_line_bytes_blocks_even_when_read_whole(
    kernel: Kernel, roots: RootsConfig
) -> None:
    """The limit bounds memory: a line longer than it blocks the link though its newline
    came within the same read; the prompt before it still counts."""
    limit = 1000
    config = Config(roots=roots, monitor=MonitorConfig(max_line_bytes=limit))
    monitor = UpstreamMonitor.from_config(kernel, config)
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    await adopt_watched(monitor, path)
    before = user_line("before the long one", "u1")
    long_line = user_line("x" * (limit + 10), "u2")
    assert len(long_line) < config.monitor.scan_cap_bytes  # read whole within one tick
    append(path, before + long_line)
    assert await outcomes(monitor) == [("activity", 1)]
    assert await outcomes(monitor) == [("blocked", 0)]
    (link,) = wire.links(await monitor.links())
    reason = f"a line longer than max_line_bytes ({limit}) starts at {len(before)}"
    assert {"offset": len(before), "reason": reason} == link["blocked"]


async def test_readopting_keeps_the_marker_and_a_new_source_rebases(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    await adopt_watched(monitor, path)
    append(path, user_line("unseen"))
    again = wire.adopted(
        await monitor.adoption.adopt(
            kind="claude", path=str(path), session_key=KEY, session_id="s1"
        )
    )
    assert again["link"]["marker"] == {"offset": 0}
    other = Path(roots.claude) / "t.jsonl"
    other.write_bytes(user_line("old"))
    moved = wire.adopted(
        await monitor.adoption.adopt(
            kind="claude", path=str(other), session_key=KEY, session_id="s1"
        )
    )
    assert {"offset": other.stat().st_size} == moved["link"]["marker"]
    assert moved["link"]["lastScannedAt"] is None


async def test_refs_must_stay_inside_the_roots(
    monitor: UpstreamMonitor, roots: RootsConfig, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b"")
    with pytest.raises(BadInput, match="not inside"):
        wire.adopted(
            await monitor.adoption.adopt(kind="claude", path=str(outside), session_key=KEY)
        )
    link = Path(roots.claude) / "escape.jsonl"
    os.symlink(outside, link)
    with pytest.raises(BadInput, match="not inside"):
        wire.adopted(await monitor.adoption.adopt(kind="claude", path=str(link), session_key=KEY))


async def test_untrusted_baselines_decline_with_the_reason(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    samples = REPO / "sample_transcripts"
    pi_old = Path(roots.pi) / "old.jsonl"
    pi_old.write_bytes((samples / "pi_legacy.jsonl").read_bytes())
    sub = Path(roots.codex) / "rollout-sub.jsonl"
    sub.write_bytes((samples / "codex_subagent.jsonl").read_bytes())
    pi = wire.adopted(
        await monitor.adoption.adopt(kind="pi", path=str(pi_old), session_key=KEY, session_id="s1")
    )
    assert pi["link"] is None
    assert "resume it once in Pi to migrate it to v3" in pi["declined"]
    codex = wire.adopted(
        await monitor.adoption.adopt(
            kind="codex", path=str(sub), session_key="agent:main:adopted:y"
        )
    )
    assert (
        codex["link"],
        codex["declined"],
    ) == (None, "a Codex sub-agent rollout is not adoptable")
    with pytest.raises(BadInput, match="no such file"):  # a mistyped path writes nothing
        await monitor.adoption.adopt(
            kind="claude",
            path=str(Path(roots.claude) / "nope.jsonl"),
            session_key="agent:main:adopted:z",
        )
    assert (wire.status(await monitor.kernel.status("agent:main:adopted:z")))["stateVersion"] == 0
    assert (wire.status(await monitor.kernel.status(KEY)))[
        "stateVersion"
    ] == 1  # adoption still recorded


async def test_codex_and_pi_links_report_their_turns(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    samples = REPO / "sample_transcripts"
    rollout = Path(roots.codex) / "rollout-2026-03-01T10-00-00-019c.jsonl"
    rollout.write_bytes((samples / "codex_rollout.jsonl").read_bytes().splitlines(True)[0])
    await adopt_watched(monitor, rollout, "codex")
    append(
        rollout,
        orjson.dumps(
            {"type": "event_msg", "payload": {"type": "user_message", "message": "typed in codex"}}
        )
        + b"\n",
    )
    pi = Path(roots.pi) / "s.jsonl"
    pi.write_bytes((samples / "pi_session.jsonl").read_bytes().splitlines(True)[0])
    wire.adopted(
        await monitor.adoption.adopt(
            kind="pi", path=str(pi), session_key="agent:main:adopted:pi", session_id="p1"
        )
    )
    await monitor.kernel.watch(watcher=MAIN, target="agent:main:adopted:pi")
    append(
        pi,
        orjson.dumps(
            {
                "type": "message",
                "id": "z1",
                "timestamp": "2026-03-01T11:00:00Z",
                "message": {"role": "user", "content": "typed in pi"},
            }
        )
        + b"\n",
    )
    assert sorted(await outcomes(monitor)) == [("activity", 1), ("activity", 1)]


class ReadoptingAdapter:
    """Wraps the real Claude adapter and re-adopts the link (another source) mid-scan."""

    kind = "claude"

    def __init__(self, inner: Any, monitor: UpstreamMonitor, other: Path) -> None:
        self.inner, self.monitor, self.other = inner, monitor, other

    def __getattr__(self, name: str) -> Any:  # the rest of the seam: the real adapter's
        return getattr(self.inner, name)

    async def baseline(self, ref: dict[str, Any]) -> dict[str, Any]:
        marker: dict[str, Any] = await self.inner.baseline(ref)
        return marker

    async def check(self, probes: list[Any]) -> list[Any]:
        outcomes: list[Any] = await self.inner.check(probes)
        wire.adopted(
            await self.monitor.adoption.adopt(
                kind="claude", path=str(self.other), session_key=KEY, session_id="s1"
            )
        )
        return outcomes


async def test_a_link_refreshed_mid_scan_records_nothing(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    other = Path(roots.claude) / "t.jsonl"
    other.write_bytes(b"")
    await adopt_watched(monitor, path)
    append(path, user_line("typed during the refresh"))
    readopting = ReadoptingAdapter(monitor.adapters["claude"], monitor, other)
    monitor.adapters.replace({**monitor.adapters, "claude": readopting})
    result = await monitor.ticker.tick()
    assert [("skipped", "link changed during the scan")] == [(r.outcome, r.reason) for r in result]
    assert 1 == (wire.status(await monitor.kernel.status(KEY)))["stateVersion"]
    assert {"offset": 0} == (wire.links(await monitor.links()))[0]["marker"]


class BrokenAdapter:
    kind = "pi"

    async def baseline(self, ref: dict[str, Any]) -> dict[str, Any]:
        return {"offset": 0}

    async def check(self, probes: list[Any]) -> list[Any]:
        raise RuntimeError("adapter exploded")


async def test_adapter_failures_are_isolated(monitor: UpstreamMonitor, roots: RootsConfig) -> None:
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    await adopt_watched(monitor, path)
    pi = Path(roots.pi) / "p.jsonl"
    pi.write_bytes(b'{"type":"session","version":3,"id":"x","timestamp":"2026-03-01T10:00:00Z"}\n')
    wire.adopted(
        await monitor.adoption.adopt(
            kind="pi", path=str(pi), session_key="agent:main:adopted:pi", session_id="p1"
        )
    )
    await monitor.kernel.watch(watcher=MAIN, target="agent:main:adopted:pi")
    monitor.adapters.replace({**monitor.adapters, "pi": BrokenAdapter()})
    append(path, user_line("still seen"))
    result = {r.session_key: (r.outcome, r.turns) for r in await monitor.ticker.tick()}
    assert {KEY: ("activity", 1), "agent:main:adopted:pi": ("inconclusive", 0)} == result


async def test_a_key_linked_under_two_agents_is_skipped(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    for agent in ("a", "b"):
        wire.adopted(
            await monitor.adoption.adopt(
                kind="claude", path=str(path), session_key="shared", agent_id=agent, session_id="s1"
            )
        )
    await monitor.kernel.watch(watcher=MAIN, target="shared")
    assert [] == await outcomes(monitor)  # bare keys get no cursor, so nothing is watched

    def watch_bare(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO session_watch_cursors (watcher_session_key, watcher_store_path,"
            " target_session_key, updated_at) VALUES (?, 'default', 'shared', 0)",
            (MAIN,),
        )

    await monitor.kernel.store.write(watch_bare)
    assert [("skipped", 0), ("skipped", 0)] == await outcomes(monitor)


async def test_a_file_adopted_empty_keeps_being_read(
    monitor: UpstreamMonitor, roots: RootsConfig
) -> None:
    """The file's identity is taken once its first line is complete, not from the empty
    file, so the second append is not mistaken for a replaced file."""
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    await adopt_watched(monitor, path)
    append(path, user_line("first", "u1"))
    assert [("activity", 1)] == await outcomes(monitor)
    append(path, user_line("second", "u2"))
    assert [("activity", 1)] == await outcomes(monitor)
    append(path, b'{"type":"user","uuid":"u3","message":{"role":"user","con')
    assert [("quiet", 0)] == await outcomes(monitor)
    append(path, b'tent":"third"}}\n')
    assert [("activity", 1)] == await outcomes(monitor)


async def test_a_single_host_store_ticks_its_links_whatever_host_id_wrote_them(
    kernel: Kernel, roots: RootsConfig, db_path: Path
) -> None:
    """On a SQLite file only this sidecar uses, naming a host id later does not orphan the
    links written as ``gateway:local`` (on a shared store, they would be another host's)."""
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    await adopt_watched(UpstreamMonitor.from_config(kernel, Config(roots=roots)), path)
    renamed = UpstreamMonitor.from_config(kernel, Config(roots=roots, host=HostConfig(id="laptop")))
    append(path, user_line("typed after the rename"))
    assert [("activity", 1)] == await outcomes(renamed)
