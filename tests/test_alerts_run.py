"""Every shipped alert is proven by a run (tests/alerts_rig.py): a real ``serve`` at its
default settings driven into each rule's condition, scraped each minute of its time, and
promtool firing the rule over the series scraped; a healthy run fires none. Here: the
healthy run, a source gone, a link that cannot be read, ticks over budget; the faults of
the store, the gateway and a node are in tests/test_alerts_faults.py."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import orjson

from tests.alerts_rig import (
    LINE,
    UNLESS_RUNNABLE,
    Rig,
    adopt_many,
    alert_names,
    fired,
)
from tests.helpers import REPO

pytestmark = UNLESS_RUNNABLE


# -- each rule, fired by a run; and a healthy run that fires none --------------------------


def test_a_healthy_run_fires_no_alert(tmp_path: Path) -> None:
    """Twenty-six minutes of a watched session that a person types into now and then: quiet."""
    rig = Rig(tmp_path)
    rig.adopt_and_watch()

    def type_now_and_then(minute: int) -> None:
        if minute % 7 == 3:
            rig.type(minute)

    with rig.serving() as scraper:
        scraper.minutes(26, type_now_and_then)
    for alert in alert_names():
        assert fired(scraper.scrapes, alert) == [], alert


def test_link_missing_fires_when_a_watched_source_is_gone(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.adopt_and_watch()
    rig.transcript.unlink()
    with rig.serving() as scraper:
        scraper.minutes(12)
    assert fired(scraper.scrapes, "SessionwatchLinkMissing") == [
        {"alertname": "SessionwatchLinkMissing", "instance": "run", "severity": "warning"}
    ]


def test_link_blind_fires_on_a_link_that_cannot_be_read(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.adopt_and_watch()
    rig.transcript.unlink()
    os.mkfifo(rig.transcript)  # never opened: inconclusive, "not a regular file (a FIFO)"
    with rig.serving() as scraper:
        scraper.minutes(20)
    assert fired(scraper.scrapes, "SessionwatchLinkBlind") == [
        {
            "adapter": "claude",
            "alertname": "SessionwatchLinkBlind",
            "instance": "run",
            "outcome": "inconclusive",
            "severity": "warning",
        }
    ]


def test_ticks_over_budget_fires_on_a_machine_too_slow_for_its_sessions(tmp_path: Path) -> None:
    """Two hundred watched sessions, each typed into every minute, on a machine five times
    slower than the other runs' (the serve's clocks at six hundred times the speed: each
    tick's work takes five times longer in its own time): ticks take minutes."""
    rig = Rig(tmp_path)
    files = [tmp_path / "claude" / "p" / f"m{i}.jsonl" for i in range(200)]
    for path in files:
        path.write_bytes(LINE)
    asyncio.run(adopt_many(tmp_path, files))

    def type_everywhere(minute: int) -> None:
        for path in files:
            with path.open("ab") as f:
                f.write(LINE.replace(b'"u1"', f'"b{minute}"'.encode()))

    with rig.serving(speed=600) as scraper:
        scraper.minutes(34, type_everywhere)
    assert fired(scraper.scrapes, "SessionwatchTicksOverBudget") == [
        {"alertname": "SessionwatchTicksOverBudget", "instance": "run", "severity": "warning"}
    ]


ASKS = REPO / "tests" / "fixtures" / "states" / "asks"  # Claude Code 2.1.332's TUI
ASKING = 'sessionwatch_adopted_sessions_longest_seconds{state="asking"}'


def test_session_asking_fires_on_a_question_left_unanswered(tmp_path: Path) -> None:
    """Claude Code's own records of a question its TUI asked a person (the capture), written
    into a watched transcript at the serve's second minute, their times the serve's: left
    unanswered, the rule fires once the question has waited fifteen minutes, not before."""
    ends = orjson.loads((ASKS / "claude-2.1.332.json").read_bytes())["ends"]
    captured = (ASKS / "claude-2.1.332.jsonl").read_bytes().splitlines(keepends=True)
    lines = captured[: ends["asks"]]
    rig = Rig(tmp_path)
    rig.adopt_and_watch()
    with rig.serving() as scraper:
        began = time.time()  # the serve's clock runs 40 times faster from here

        def ask(minute: int) -> None:
            if minute == 2:
                at = began + (time.time() - began) * 40  # the serve's time now
                with rig.transcript.open("ab") as f:
                    f.write(b"".join(_at(line, at) for line in lines))

        scraper.minutes(20, ask)
    assert fired(scraper.scrapes, "SessionwatchSessionAsking") == [
        {"alertname": "SessionwatchSessionAsking", "instance": "run", "severity": "warning"}
    ]
    waited = [scrape.get(ASKING, 0.0) for scrape in scraper.scrapes]
    assert waited[12] < 900 <= waited[-1], waited  # asked at minute 2 and a tick after


def _at(line: bytes, at: float) -> bytes:
    """A record of the capture, its time ``at`` (s)."""
    record = orjson.loads(line)
    if "timestamp" in record:
        record["timestamp"] = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
    return orjson.dumps(record) + b"\n"


def test_every_shipped_rule_has_a_run_here() -> None:
    proven = {
        "SessionwatchLinkMissing", "SessionwatchLinkBlind", "SessionwatchNodeUnreachable",
        "SessionwatchWakesFailing", "SessionwatchStoreRefusing", "SessionwatchTicksOverBudget",
        "SessionwatchSessionAsking",
    }  # fmt: skip
    assert set(alert_names()) == proven
