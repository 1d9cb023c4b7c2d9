"""What each adopted session is doing, as the tick reads it from the real harnesses' records
(tests/fixtures/states) and the store keeps it: ``links``, ``sessions --state`` and
``GET /v1/sessions?state=`` show one answer; each change is said once, on the bus, by the
check's transaction; ``quiet`` is derived when read, from the store's clock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from adapters.jsonl_scan import time_ms
from adapters.states import Doing
from monitor.config import Config, RootsConfig
from monitor.kernel import Kernel
from monitor.kernel.bus import DoingChanged
from monitor.serve.root import running
from monitor.testing import ManualClock
from monitor.upstream import UpstreamMonitor
from monitor.upstream.links import (
    DAY_MS,
    HOUR_MS,
    QUIET,
    all_links,
    doing_hours,
    note_doing,
)
from monitor.upstream.links import _hours as doing_hours_of
from monitor.web import wire
from tests.helpers import REPO, make_config
from tests.opencode_db import OpenCodeDB

STATES = REPO / "tests" / "fixtures" / "states"
KEY = "agent:main:adopted:x"
MAIN = "agent:main:main"
CAPTURES = {"claude": "claude-2.1.332", "codex": "codex-0.171.0", "pi": "pi-1.6.0"}
FOLDERS = {"claude": "proj", "codex": "2026/12/06", "pi": "--w--"}


def capture(kind: str) -> tuple[list[bytes], dict[str, int]]:
    name = CAPTURES[kind]
    ends = json.loads((STATES / f"{name}.json").read_text())["ends"]
    return (STATES / f"{name}.jsonl").read_bytes().splitlines(keepends=True), ends


async def adopted(kind: str, roots: RootsConfig, kernel: Kernel, first: bytes) -> Path:
    folder = Path(getattr(roots, kind)) / FOLDERS[kind]
    folder.mkdir(parents=True)
    stem = CAPTURES[kind] if kind != "codex" else "rollout-2026-12-06T10-00-00-" + "0" * 8
    path = folder / f"{stem}.jsonl"
    path.write_bytes(first)
    monitor = UpstreamMonitor.from_config(kernel, Config(roots=roots))
    await monitor.adoption.adopt(kind=kind, path=str(path), session_key=KEY, session_id="s1")
    assert await kernel.watch(watcher=MAIN, target=KEY)
    return path


async def doing(kernel: Kernel, roots: RootsConfig) -> dict[str, Any]:
    """One tick, as a process of its own would run it; what ``links`` then shows."""
    monitor = UpstreamMonitor.from_config(kernel, Config(roots=roots))
    await monitor.ticker.tick()
    [link] = wire.links(await monitor.links())
    return dict(link["doing"])


@pytest.mark.parametrize("kind", sorted(CAPTURES))
async def test_each_scene_is_told_once_by_the_tick_that_read_it(
    kind: str, kernel: Kernel, roots: RootsConfig
) -> None:
    lines, ends = capture(kind)
    path = await adopted(kind, roots, kernel, lines[0])
    said: list[DoingChanged] = []
    kernel.bus.subscribe(DoingChanged, said.append)
    assert {"state": "unknown", "since": None} == await doing(kernel, roots)
    written = 1
    for scene, end in ends.items():
        with path.open("ab") as f:
            f.write(b"".join(lines[written:end]))
        written = end
        shown = await doing(kernel, roots)
        assert "waiting" == shown["state"], scene
        assert shown == await doing(kernel, roots)  # nothing new read: nothing moves
    # one change a scene: each tick read a whole turn, prompt to end, and left it waiting
    # from a new time (the first from unknown)
    assert [(c.state, c.was) for c in said] == [("waiting", "unknown")] + [
        ("waiting", "waiting")
    ] * (len(ends) - 1)
    sinces = [c.since for c in said]
    assert all(isinstance(t, int) for t in sinces) and sinces == sorted(set(sinces))  # type: ignore[type-var]
    assert all(c.session_key == KEY for c in said)


async def test_a_turn_in_progress_reads_working_then_quiet_on_the_stores_clock(
    kernel: Kernel, roots: RootsConfig, clock: ManualClock
) -> None:
    lines, ends = capture("claude")
    path = await adopted("claude", roots, kernel, lines[0])
    call = next(
        i for i in range(ends["ends"], ends["tool"]) if b'"stop_reason":"tool_use"' in lines[i]
    )
    with path.open("ab") as f:
        f.write(b"".join(lines[1 : call + 1]))
    working = await doing(kernel, roots)
    assert "working" == working["state"]
    monitor = UpstreamMonitor.from_config(kernel, Config(roots=roots))
    assert [KEY] == [d.session_key for d in await monitor.doing(frozenset({"working"}))]
    clock.advance(600_000 - 1)
    assert working == dict(wire.links(await monitor.links())[0]["doing"])
    clock.advance(1)  # ten minutes with no record read: quiet, since the last one was read
    quiet = dict(wire.links(await monitor.links())[0]["doing"])
    assert QUIET == quiet["state"] and quiet["since"] is not None
    assert [KEY] == [d.session_key for d in await monitor.doing(frozenset({QUIET}))]
    assert [] == await monitor.doing(frozenset({"working", "waiting"}))
    with path.open("ab") as f:
        f.write(b"".join(lines[call + 1 : ends["tool"]]))
    assert "waiting" == (await doing(kernel, roots))["state"]  # the turn ended after all


async def test_a_source_adopted_anew_starts_unknown(kernel: Kernel, roots: RootsConfig) -> None:
    lines, ends = capture("pi")
    path = await adopted("pi", roots, kernel, lines[0])
    with path.open("ab") as f:
        f.write(b"".join(lines[1 : ends["ends"]]))
    assert "waiting" == (await doing(kernel, roots))["state"]
    other = path.with_name("other.jsonl")
    other.write_bytes(lines[0])
    monitor = UpstreamMonitor.from_config(kernel, Config(roots=roots))
    await monitor.adoption.adopt(kind="pi", path=str(other), session_key=KEY, session_id="s1")
    assert {"state": "unknown", "since": None} == await doing(kernel, roots)


async def test_metrics_count_sessions_by_state_and_time_each_wait_for_a_person(
    tmp_path: Path,
) -> None:
    """``/metrics``: the adopted sessions by what they are doing, and how long the person
    was waited for: from the record that ended the first turn to the prompt of the next,
    as the harness wrote them."""
    lines, ends = capture("claude")
    config = make_config(tmp_path)
    async with running(config, tmp_path / "state.db") as sidecar:
        assert sidecar is not None
        path = tmp_path / "claude" / "proj" / "s.jsonl"
        path.parent.mkdir()
        path.write_bytes(lines[0])
        await sidecar.monitor.adoption.adopt(
            kind="claude", path=str(path), session_key=KEY, session_id="s1"
        )
        assert await sidecar.kernel.watch(watcher=MAIN, target=KEY)
        prompt = next(i for i in range(ends["ends"], ends["tool"]) if b'"type":"user"' in lines[i])
        written = 1
        for upto in (ends["ends"], prompt + 1):
            with path.open("ab") as f:
                f.write(b"".join(lines[written:upto]))
            written = upto
            await sidecar.monitor.ticker.tick()
        token = (tmp_path / "token").read_text().strip()
        async with aiohttp.ClientSession() as http:
            url = f"{sidecar.addresses[0]}/metrics"
            async with http.get(url, headers={"Authorization": f"Bearer {token}"}) as answer:
                text = await answer.text()
    assert 'sessionwatch_adopted_sessions_doing{state="working"} 1.0' in text
    assert 'sessionwatch_adopted_sessions_doing{state="waiting"} 0.0' in text
    assert "sessionwatch_waited_for_person_seconds_count 1.0" in text
    end = max(i for i in range(ends["ends"]) if b'"stop_reason":"end_turn"' in lines[i])
    ended = time_ms(orjson.loads(lines[end]))
    typed = time_ms(orjson.loads(lines[prompt]))
    assert ended is not None and typed is not None
    waited = (typed - ended) / 1000
    assert f"sessionwatch_waited_for_person_seconds_sum {waited}" in text


class OpenCodeSession:
    """An OpenCode database of OpenCode's own tables with one session, adopted and watched;
    a capture's rows (tests/fixtures/states) written into it a few at a time."""

    def __init__(self, oc: OpenCodeDB, monitor: UpstreamMonitor) -> None:
        self.oc, self.monitor = oc, monitor

    @classmethod
    async def adopted(cls, kernel: Kernel, tmp_path: Path) -> OpenCodeSession:
        oc = OpenCodeDB(tmp_path / "opencode.db")
        oc.session("ses_s")
        folder = str(tmp_path / "none")
        config = Config(roots=RootsConfig(opencode_db=str(oc.path), claude=folder))
        monitor = UpstreamMonitor.from_config(kernel, config)
        await monitor.adoption.adopt(
            kind="opencode", path=str(oc.path), thread="ses_s", session_key=KEY, session_id="s1"
        )
        assert await kernel.watch(watcher=MAIN, target=KEY)
        return cls(oc, monitor)

    async def doing(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """``rows`` written, a tick; what the link then says the session is doing."""
        for row in rows:
            self.oc.row("ses_s", row["table"], row["id"], row["data"])
        await self.monitor.ticker.tick()
        return dict(wire.links(await self.monitor.links())[0]["doing"])


def opencode_capture(name: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """A capture of OpenCode's rows and where its scenes end."""
    rows = [orjson.loads(line) for line in (STATES / f"{name}.jsonl").read_bytes().splitlines()]
    return rows, json.loads((STATES / f"{name}.json").read_text())["ends"]


async def test_opencode_sessions_are_read_from_their_database_rows(
    kernel: Kernel, tmp_path: Path
) -> None:
    """OpenCode 1.18.33's rows, as its capture holds them, written scene by scene into a
    database of OpenCode's own tables: each scene ends waiting, the tool's turn is working
    once its assistant message called the tool, a compaction's prompt changes nothing."""
    rows, ends = opencode_capture("opencode-1.18.33")
    session = await OpenCodeSession.adopted(kernel, tmp_path)
    called = next(
        i
        for i in range(ends["ends"], ends["tool"])
        if rows[i]["data"].get("finish") == "tool-calls"
    )
    written = 0
    for end in (ends["ends"], called + 1, ends["tool"], ends["interrupted"]):
        doing = await session.doing(rows[written:end])
        written = end
        assert ("working" if end == called + 1 else "waiting") == doing["state"], end
        if end == called + 1:
            prompt = max(i for i in range(called) if rows[i]["data"].get("role") == "user")
            assert rows[prompt]["data"]["time"]["created"] == doing["since"]  # since the prompt
    last = max(r["data"]["time"]["created"] for r in rows if r["table"] == "message")
    compaction = [
        {"table": "message", "id": "msg_zzcompact",
         "data": {"role": "user", "time": {"created": last + 1}}},
        {"table": "part", "id": "prt_zzcompact", "data": {"type": "compaction", "auto": True}},
    ]  # fmt: skip
    assert doing == await session.doing(compaction)


def test_the_chart_says_what_each_hour_was_mostly_spent_doing() -> None:
    now, h = 100 * DAY_MS, HOUR_MS
    changes = [(now - 30 * h, "waiting"), (now - 2 * h - 45 * 60_000, "working")]
    changes.append((now - h - 12 * 60_000, "waiting"))
    hours = doing_hours_of(changes, now)
    assert hours[:21] == ("waiting",) * 21  # from before the day began
    assert hours[21:] == ("working", "working", "waiting")  # 45 of 60 min; 48 of 60; 48
    assert (None,) * 24 == doing_hours_of([(now + h, "working")], now)  # not yet


async def test_the_history_keeps_the_last_change_before_the_day_and_all_since(
    kernel: Kernel, roots: RootsConfig, clock: ManualClock
) -> None:
    lines, _ = capture("pi")
    await adopted("pi", roots, kernel, lines[0])
    link = (await kernel.read(lambda c: all_links(c)))[0]
    now = clock()
    for hours_ago in (50, 30, 10):
        since = now - hours_ago * HOUR_MS
        await kernel.commit(lambda r, s=since: note_doing(r.conn, link, Doing("waiting", s), now))
    kept = await kernel.read(lambda c: doing_hours(c, [KEY], now))
    assert ("waiting",) * 24 == kept[KEY]
    rows = await kernel.read(
        lambda c: c.execute("SELECT since FROM sessionwatch_doing_history").fetchall()
    )
    assert sorted(r[0] for r in rows) == [now - 30 * HOUR_MS, now - 10 * HOUR_MS]


async def test_an_opencode_command_waiting_for_approval_reads_working_never_asking(
    kernel: Kernel, tmp_path: Path
) -> None:
    """OpenCode's rows while its serve asks a person to approve a command (``bash`` set to
    ask, left unanswered): its assistant message not completed, the tool part running. No
    row says a person is asked: working, since the prompt."""
    rows, ends = opencode_capture("asks/opencode-1.18.33")
    session = await OpenCodeSession.adopted(kernel, tmp_path)
    doing = await session.doing(rows[: ends["approval"]])
    prompt = max(r["data"]["time"]["created"] for r in rows if r["data"].get("role") == "user")
    assert {"state": "working", "since": prompt} == doing
