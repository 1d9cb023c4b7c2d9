"""What the status page shows is a part fed by the changes' own data, and each change kind
says beside itself what the page does with it (its ``page``): a new kind reaches an open
page with nothing else edited."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import orjson
import pytest

from monitor.kernel.bus import (
    SHOWN_AT_ONCE,
    Change,
    ConfigReloaded,
    NoticesUndecided,
    TickRan,
    WakeOutcome,
    page_kinds,
)
from monitor.kernel.changes import KEEPALIVE_S
from monitor.serve.root import Sidecar, running
from monitor.web import status_page
from monitor.web.status_page import MIN_GAP_S, TICK_REFRESH_S, Told
from tests.helpers import REPO, make_config


class Announced(Change):
    """A kind only this test knows, shown at once."""

    __slots__ = ()
    page = SHOWN_AT_ONCE


class Unshown(Change):
    """A kind the page does not listen to."""

    __slots__ = ()


def test_the_page_listens_to_the_kinds_that_say_so_and_no_other() -> None:
    kinds = page_kinds()
    assert Announced not in kinds and Unshown not in kinds  # a test's kinds never join
    assert {TickRan, WakeOutcome, ConfigReloaded} <= set(kinds)
    assert all(kind.page for kind in kinds)
    assert SHOWN_AT_ONCE == TickRan(failed="the disk is full").shown() != TickRan(1, 0.2).shown()


def test_a_stream_tells_its_page_at_most_every_gap_and_a_later_change_every_refresh() -> None:
    """When a stream tells, on a clock of the test's: a change at once, then at most every
    MIN_GAP_S; a change shown later (a quiet tick) after TICK_REFRESH_S; a keep-alive
    after KEEPALIVE_S of quiet."""
    now = [100.0]
    told = Told(("shown",), lambda: now[0])
    told.moved(("shown",))
    assert (None, KEEPALIVE_S) == (told.due(), told.wait_s())  # nothing moved
    now[0] += MIN_GAP_S
    told.heard(at_once=True, later=False)
    assert b"event: changed" in (told.due() or b"")
    told.heard(at_once=True, later=False)
    assert (None, MIN_GAP_S) == (told.due(), told.wait_s())  # within the gap: held back
    now[0] += MIN_GAP_S
    assert b"event: changed" in (told.due() or b"")
    told.heard(at_once=False, later=True)
    now[0] += TICK_REFRESH_S - MIN_GAP_S
    assert told.due() is None
    now[0] += MIN_GAP_S
    assert b"event: changed" in (told.due() or b"")
    told.moved(("another",))  # a fingerprint that moved is a change
    now[0] += MIN_GAP_S
    assert b"event: changed" in (told.due() or b"")
    now[0] += KEEPALIVE_S
    assert b": keep-alive\n\n" == told.due()


async def _events(sidecar: Sidecar, token: str, heard: list[bytes]) -> None:
    async with aiohttp.ClientSession() as http:
        url = f"{sidecar.addresses[0]}/ui/stream"
        async with http.get(url, headers={"Authorization": f"Bearer {token}"}) as answer:
            async for line in answer.content:
                heard.append(line.strip())


@contextlib.asynccontextmanager
async def streaming(sidecar: Sidecar, token: str) -> AsyncIterator[list[bytes]]:
    """The lines ``/ui/stream`` says, as they come, once it is open."""
    heard: list[bytes] = []
    reader = asyncio.ensure_future(_events(sidecar, token, heard))
    try:
        deadline = time.monotonic() + 10
        while b"retry: 2000" not in heard:
            assert not reader.done() and time.monotonic() < deadline, reader
            await asyncio.sleep(0.02)
        yield heard
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def _told(
    heard: list[bytes], since: int, timeout: float, said: bytes = b"event: changed"
) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if said in heard[since:]:
            return True
        await asyncio.sleep(0.02)
    return False


async def test_a_kind_the_page_shows_reaches_an_open_stream_and_one_it_does_not_never(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kinds = (*page_kinds(), Announced, Unshown)  # as if they were the service's
    monkeypatch.setattr(status_page, "page_kinds", lambda: tuple(k for k in kinds if k.page))
    config = make_config(tmp_path)
    async with running(config, tmp_path / "state.db") as sidecar:
        assert sidecar is not None
        token = (tmp_path / "token").read_text().strip()
        async with streaming(sidecar, token) as heard:
            bus = sidecar.kernel.bus
            mark = len(heard)
            bus.publish(Unshown())
            assert not await _told(heard, mark, 1.0)
            bus.publish(Announced())
            assert await _told(heard, mark, 5.0)
            mark = len(heard)
            bus.publish(TickRan(int(time.time() * 1000), 0.5))  # later: at most every 10 s
            assert not await _told(heard, mark, 1.0)
            bus.publish(TickRan(int(time.time() * 1000), failed="the store refused"))
            assert await _told(heard, mark, 5.0)


async def test_the_page_shows_what_the_changes_carry(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with running(config, tmp_path / "state.db") as sidecar:
        assert sidecar is not None
        state = sidecar.page
        bus = sidecar.kernel.bus
        bus.publish(WakeOutcome("agent:main:main", "refused", "keys", 1_000, "http://gw/wake"))
        bus.publish(TickRan(2_000, 0.25, over_budget=("pi",)))
        bus.publish(TickRan(3_000, idle=True))
        bus.publish(NoticesUndecided(2))
        new = config._replace(monitor=config.monitor._replace(interval_s=7.0))
        bus.publish(ConfigReloaded(config, new))
        view = await state.view()
        (watcher,) = view.watchers
        assert ("agent:main:main", "refused", "keys", 1_000) == (
            watcher.watcher,
            watcher.last_wake and watcher.last_wake.result,
            watcher.last_wake and watcher.last_wake.error,
            watcher.last_wake and watcher.last_wake.at_ms,
        )
        assert view.wakes.startswith("woken through http://gw/wake; 2 notices")
        tick = view.tick
        assert (3_000, 0.25, ("pi",), None, 7.0) == (
            tick.last_at_ms,
            tick.last_duration_s,
            tick.over_budget,
            tick.failed,
            tick.interval_s,
        )
        bus.publish(TickRan(4_000, failed="the store refused"))
        assert "the store refused" == (await state.view()).tick.failed


STATES = REPO / "tests" / "fixtures" / "states"


async def test_the_needs_you_panel_lists_who_waits_the_longest_first_and_is_told_live(
    tmp_path: Path,
) -> None:
    """Three adopted Claude sessions fed the real harness's records: one whose turn ended
    first, one whose turn ended later, one mid-turn. The panel lists the two waiting, the
    longest first, titled; the page's stream says ``doing`` when one changes, and ``/ui/live``
    shows the panel."""
    captured = (STATES / "claude-2.1.332.jsonl").read_bytes().splitlines(keepends=True)
    lines = recent(captured)  # their times ten minutes ago, in order: the chart's last hour
    ends = orjson.loads((STATES / "claude-2.1.332.json").read_bytes())["ends"]
    config = make_config(tmp_path)
    async with running(config, tmp_path / "state.db") as sidecar:
        assert sidecar is not None
        token = (tmp_path / "token").read_text().strip()
        files = {}
        for name in ("early", "later", "busy"):
            path = tmp_path / "claude" / "proj" / f"{name}.jsonl"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(lines[0])
            key = f"agent:main:adopted:{name}"
            await sidecar.monitor.adoption.adopt(
                kind="claude", path=str(path), session_key=key, session_id=name
            )
            assert await sidecar.kernel.watch(watcher="agent:main:main", target=key)
            files[name] = path
        async with streaming(sidecar, token) as heard:
            mark = len(heard)
            scenes = {"early": ends["ends"], "later": ends["tool"], "busy": ends["ends"] + 3}
            for name, end in scenes.items():
                with files[name].open("ab") as f:
                    f.write(b"".join(lines[1:end]))
            await sidecar.monitor.ticker.tick()
            assert await _told(heard, mark, 5.0, b"event: doing")
        view = await sidecar.page.view()
        assert (2, ["early", "later"]) == (
            view.waiting, [s.session_key.rsplit(":", 1)[1] for s in view.needs_you]
        )  # fmt: skip
        assert all(s.state == "waiting" and s.since for s in view.needs_you)
        assert view.needs_you[0].since < view.needs_you[1].since  # type: ignore[operator]
        async with aiohttp.ClientSession() as http:
            url = f"{sidecar.addresses[0]}/ui/live"
            async with http.get(url, headers={"Authorization": f"Bearer {token}"}) as answer:
                html = await answer.text()
        panel = html[html.index('id="needs-you"') : html.index('id="links"')]
        assert panel.index("adopted:early") < panel.index("adopted:later")
        assert "adopted:busy" not in panel and 'data-state="waiting"' in panel
        hours = {row.session_key.rsplit(":", 1)[1]: row.doing_hours for row in view.links}
        assert ("waiting", "waiting", "working") == tuple(hours[n][-1] for n in scenes)
        assert 'class="span-waiting"' in html and 'class="span-working"' in html


def recent(lines: list[bytes]) -> list[bytes]:
    """The records with their times moved to ten minutes ago, a millisecond apart."""
    base = time.time() - 600
    out = []
    for i, line in enumerate(lines):
        record = orjson.loads(line)
        if "timestamp" in record:
            at = datetime.fromtimestamp(base + i / 1000, UTC)
            record["timestamp"] = at.isoformat(timespec="milliseconds")
        out.append(orjson.dumps(record) + b"\n")
    return out
