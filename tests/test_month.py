"""35 simulated days (tests/month.py): every notice that should exist exists once, nothing
that should have expired remains, the database stays bounded, and no in-memory table grows
with time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.month import CHILDREN_PER_DAY, simulate


@pytest.mark.timeout(600)
async def test_a_month_of_running_keeps_every_notice_once_and_stays_bounded(
    tmp_path: Path,
) -> None:
    report = await simulate(tmp_path, days=35)
    # the main session was woken every day, at once and then at most once per 20 s: the
    # day's events (committed together: one wake), then the tick's turns (a wake and a
    # trailing one); a notice left pending is never woken again (days 15 and 16 only one
    # transcript was typed into: its turn is one wake)
    assert report.wakes_per_day == [2 if day in (15, 16) else 3 for day in range(35)]
    gaps = [b - a for a, b in zip(report.wake_times, report.wake_times[1:], strict=False)]
    assert min(gaps) >= 20_000
    # the last day's notices: each pair that changed since the last drain, once
    assert len(report.pending_last_day) == len(set(report.pending_last_day))
    assert set(report.pending_last_day) == report.expected_last_day
    # every prompt typed into a live transcript was recorded once; the deleted one was
    # missing three times and recorded as upstream_missing once; the moved one came back
    assert report.turns["agent:main:adopted:steady"] == 35
    assert report.turns["agent:main:adopted:deleted"] == 10
    assert report.turns["agent:main:adopted:moved"] == 15 + 18
    assert report.missing_recorded == 1
    assert report.links_left == ["agent:main:adopted:moved", "agent:main:adopted:steady"]
    assert report.shared_held
    stale = dict(report.stale)
    assert stale.pop("leases") <= 2  # one per name: the host's and the shared one
    assert stale == dict.fromkeys(stale, 0), stale
    # bounded: the cap holds the log at 50,000 rows; the file stops growing with it
    weeks = report.weeks
    assert weeks[-1]["events"] <= 50_000
    assert weeks[-1]["cursors"] <= 31 * CHILDREN_PER_DAY + 3
    assert weeks[-1]["bytes"] < 3 * weeks[2]["bytes"], weeks
    memory = report.memory
    assert memory["watchers woken"] <= 1  # one watcher woken: the time of its last wake
    assert memory["timed passes"] == 0
    assert memory["passes in flight"] == 0
    assert memory["status-page tickets and cookies"] <= 1  # the one issued just now
