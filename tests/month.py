"""A month in minutes: the sidecar's kernel, upstream monitor, wake ledger, host leases
and status-page admissions driven through 35 simulated days on one controllable clock, on a
real SQLite file with real transcripts appended to.

Each day: 40 new sub-agent sessions spawned under the main session, events on them (1,000 a
day for the first 30 days, then 5,000 a day, so that the 30-day retention acts first and the
50,000-row cap after), a prompt typed into each adopted Claude Code transcript and a tick,
the main session woken (at once, then one trailing wake 20 s later) and drained, a sidecar
restarted without releasing its host lease, and status-page tickets issued and spent.
Day 10 deletes one transcript for good (three misses, then ``upstream_missing``); days 15-16
move another away and day 17 brings it back (its streak resets).

``python -m tests.month`` prints the weekly report that docs/reliability.md quotes;
tests/test_month.py asserts on the same report.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monitor.clock import DAY_MS
from monitor.config import Config, RootsConfig
from monitor.kernel import Kernel
from monitor.kernel.bus import OwnershipChanged
from monitor.kernel.drafts import make_draft
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.retention import CURSOR_IDLE_MS, MAX_ROWS, RETENTION_MS
from monitor.upstream import UpstreamMonitor
from monitor.upstream.host_leases import HostLeases
from monitor.web.status_page import SESSION_TTL_S, TICKET_TTL_S, Admissions
from tests.helpers import T0, ManualClock, WakeLog, kernel_waking, user_line

MAIN = "agent:main:main"
CHILDREN_PER_DAY = 40
LINKS = ("steady", "deleted", "moved")


@dataclass
class Report:
    weeks: list[dict[str, int]] = field(default_factory=list)  # per simulated week
    wakes_per_day: list[int] = field(default_factory=list)
    wake_times: list[int] = field(default_factory=list)  # every wake, ms
    pending_last_day: list[str] = field(default_factory=list)  # the main's targets, in order
    expected_last_day: set[str] = field(default_factory=set)
    turns: dict[str, int] = field(default_factory=dict)  # per link, from the ticks
    missing_recorded: int = 0
    stale: dict[str, int] = field(default_factory=dict)  # what should have expired, left
    memory: dict[str, int] = field(default_factory=dict)  # in-memory tables at the end
    links_left: list[str] = field(default_factory=list)
    shared_held: bool = False


class MonthSender(WakeLog):
    """The gateway's side of delivery: it records the time of each wake pass (the calls of
    one pass share the manual clock's instant) and leaves the notices to the drains."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock
        self.times: list[int] = []

    async def wake(self, watcher: str, text: str, *, still: Any = None) -> None:
        if still is not None and not await still():
            return
        if not self.times or self.times[-1] != self.clock.now:
            self.times.append(self.clock.now)


def _size(db: Path) -> int:
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*") if p.is_file())


def _count(db: Path, sql: str, *params: Any) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute(sql, params).fetchone()[0])
    finally:
        conn.close()


async def _events(kernel: Kernel, keys: list[str], n: int, now: int) -> None:
    """``n`` human events spread over ``keys``, 500 to a transaction."""
    for start in range(0, n, 500):

        def run(record: Any, start: int = start) -> None:
            for i in range(start, min(n, start + 500)):
                draft = make_draft(
                    session_key=keys[i % len(keys)],
                    kind=EventKind.HUMAN_DIRECT_MESSAGE,
                    actor_type=ActorType.HUMAN,
                    now=now,
                    payload={"channel": "telegram"},
                )
                record(draft)

        await kernel.commit(run)


async def simulate(work: Path, days: int = 35) -> Report:
    report = Report()
    clock = ManualClock(T0)
    db = work / "state.db"
    root = work / "claude"
    root.mkdir(parents=True, exist_ok=True)
    sender = MonthSender(clock)
    woken = sender.times
    kernel = await kernel_waking(db, clock, sender)
    timers, delivery = sender.timers, sender.delivery
    assert timers is not None
    config = Config(roots=RootsConfig(claude=str(root)))
    monitor = UpstreamMonitor.from_config(kernel, config)
    admissions = Admissions(clock=lambda: clock.now / 1000)
    files = {name: root / f"{name}.jsonl" for name in LINKS}
    try:
        for name, path in files.items():
            path.write_bytes(user_line("the first prompt", f"{name}-0"))
            key = f"agent:main:adopted:{name}"
            await monitor.adoption.adopt(
                kind="claude", path=str(path), session_key=key, session_id=name
            )
            await kernel.watch(watcher=MAIN, target=key)
            report.turns[key] = 0
        held: list[bool] = []  # ticks:shared, as the leases said it on the bus
        kernel.bus.subscribe(OwnershipChanged, lambda change: held.append(change.shared))
        for day in range(days):
            await timers.advance(T0 + day * DAY_MS + 9 * 3600_000 - clock.now)  # 09:00 of the day
            start = len(woken)
            children = [f"agent:main:subagent:d{day}-c{i}" for i in range(CHILDREN_PER_DAY)]
            for i, child in enumerate(children):
                await kernel.spawn(parent=MAIN, child=child, run_id=f"d{day}-r{i}")
            await timers.advance(60_000)
            await _events(kernel, children, 1000 if day < 30 else 5000, clock.now)
            if day == 10:
                files["deleted"].unlink()
            if day == 15:
                files["moved"].rename(files["moved"].with_suffix(".away"))
            if day == 17:
                files["moved"].with_suffix(".away").rename(files["moved"])
            for name, path in files.items():
                if path.exists():
                    with path.open("ab") as f:
                        f.write(user_line(f"day {day}", f"{name}-{day + 1}"))
            await timers.advance(60_000)
            for result in await monitor.ticker.tick():
                if result.outcome == "activity":
                    report.turns[result.session_key] += result.turns
                if result.reason == "upstream_missing recorded":
                    report.missing_recorded += 1
            await timers.advance(21_000)  # past the wake window: the trailing wake fires
            report.wakes_per_day.append(len(woken) - start)
            # a sidecar that crashed without releasing its lease; the next one takes it over
            await timers.advance(60_000)
            leases = HostLeases(kernel, "laptop", ttl_ms=30_000)
            leases.bus = kernel.bus  # what start hands it (this lease is taken alone)
            await leases.take()
            for _ in range(3):
                admissions.admit(admissions.issue())
            admissions.issue()  # one never spent
            if day == days - 1:
                pending = await kernel.notices(watcher=MAIN)
                report.pending_last_day = [n.target for n in pending]
                adopted = {f"agent:main:adopted:{n}" for n, p in files.items() if p.exists()}
                report.expected_last_day = set(children) | adopted
            else:  # a drain acknowledges what each notice said; work after its freeze
                # reopens one fresh notice, which the next drain takes
                while await kernel.notices(watcher=MAIN, drain=True):
                    pass
            await timers.advance(3600_000)  # an hour on: the tick loop's retention runs
            await kernel.retention.when_due()
            if day % 7 == 6 or day == days - 1:
                report.weeks.append(
                    {
                        "day": day + 1,
                        "bytes": _size(db),
                        "events": _count(db, "SELECT count(*) FROM session_state_events"),
                        "cursors": _count(db, "SELECT count(*) FROM session_watch_cursors"),
                        "heads": _count(db, "SELECT count(*) FROM session_state_heads"),
                    }
                )
        now = clock.now
        report.stale = {
            "events older than 30 days": _count(
                db,
                "SELECT count(*) FROM session_state_events WHERE occurred_at < ?",
                now - RETENTION_MS - DAY_MS,  # the hourly prune may be up to an hour behind
            ),
            "events over the row cap": max(
                0, _count(db, "SELECT count(*) FROM session_state_events") - MAX_ROWS
            ),
            "cursors idle 30 days": _count(
                db,
                "SELECT count(*) FROM session_watch_cursors WHERE updated_at < ?",
                now - CURSOR_IDLE_MS - DAY_MS,
            ),
            "opened marks without a cursor": _count(
                db,
                "SELECT count(*) FROM sessionwatch_opened_notices o WHERE NOT EXISTS (SELECT 1"
                " FROM session_watch_cursors c WHERE c.watcher_session_key ="
                " o.watcher_session_key AND c.target_session_key = o.target_session_key)",
            ),
            "leases": _count(db, "SELECT count(*) FROM sessionwatch_leases"),
            "created-session queues past their cap": _count(
                db,
                "SELECT count(*) FROM (SELECT main_session_key FROM sessionwatch_created_notices"
                " GROUP BY main_session_key HAVING count(*) > 100)",
            ),
        }
        clock.advance(int(max(TICKET_TTL_S, SESSION_TTL_S) * 1000) + 1)
        admissions.issue()  # expires what is due
        await delivery.settled()
        report.memory = {
            "watchers woken": len(delivery.windows.started),
            "timed passes": len(delivery._later),
            "passes in flight": len(delivery._running),
            "status-page tickets and cookies": len(admissions.tickets) + len(admissions.sessions),
        }
        report.links_left = sorted(v.link.session_key for v in await monitor.links())
        report.shared_held = held[-1:] == [True]
        report.wake_times = woken
    finally:
        await delivery.close()
        await kernel.close()
    return report


def main() -> None:
    days = int(sys.argv[1]) if len(sys.argv) > 1 else 35
    with tempfile.TemporaryDirectory() as tmp:
        report = asyncio.run(simulate(Path(tmp), days))
    print("| day | database (KiB) | events | cursors | sessions with a head |")
    print("|---|---|---|---|---|")
    for week in report.weeks:
        print(
            f"| {week['day']} | {week['bytes'] // 1024:,} | {week['events']:,} |"
            f" {week['cursors']:,} | {week['heads']:,} |"
        )
    print(f"wakes per day: {sorted(set(report.wakes_per_day))}", file=sys.stderr)
    print(f"left that should have expired: {report.stale}", file=sys.stderr)
    print(f"in memory at the end: {report.memory}", file=sys.stderr)


if __name__ == "__main__":
    main()
