"""Wakes across processes: ``serve`` run as real processes on one store, turns recorded by
the command line (another process's commits), and a hooks endpoint on loopback that keeps
every call (tests/wake_sink.py). What tests/delivery/test_ledger_model.py checks on a
model, here on the real thing: a wake cut by a SIGKILL is taken over and sent once more,
never twice more; a peer never wakes what the other woke; an outage wakes each notice once
it is over; a drained notice is never woken; and at most one wake per watcher goes in a
window.

The times are the product's own: the 20 s window and, on PostgreSQL, the 30 s lease a
killed holder leaves. Every wait is on a condition (a call that arrived, a log line)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monitor.delivery.ledger import WAKE_COALESCE_MS
from monitor.delivery.shares import Shares
from tests.helpers import PgServer, pg_database
from tests.releases import build, has_history
from tests.wake_sink import HOOKS_TOKEN, Call, WakeSink

WATCHER = "agent:main:main"
CHILD = "agent:main:subagent:c1"
WINDOW_S = WAKE_COALESCE_MS / 1000
SLACK_S = 0.5  # a call leaves a moment after its claim started the window


class Sidecars:
    """Named ``serve`` processes on one store, each with its own hooks base on the sink."""

    def __init__(self, root: Path, db: str, sink: WakeSink) -> None:
        self.root, self.db, self.sink = root, db, sink
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.extra = ""  # more of each sidecar's configuration
        token = root / "hooks-token"
        token.write_text(HOOKS_TOKEN + "\n")
        token.chmod(0o600)

    def config(self, who: str) -> Path:
        home = self.root / who
        home.mkdir(exist_ok=True)
        path = home / "sessionwatch.toml"
        path.write_text(
            f'[api]\ntoken_file = "{home / "token"}"\nlisten = "127.0.0.1:0"\n'
            f'[host]\nid = "{who}"\n'
            f'[gateway]\nhooks_url = "{self.sink.url_for(who)}"\n'
            f'hooks_token_file = "{self.root / "hooks-token"}"\nretry_interval_s = 1\n'
            f"{self.extra}"
        )
        return path

    def command(self, who: str, *args: str) -> list[str]:
        base = ["-m", "monitor", "--db", self.db, "--config", str(self.config(who))]
        return [sys.executable, *base, *args]

    def cli(self, *args: str) -> Any:
        proc = subprocess.run(self.command("cli", *args), capture_output=True, timeout=60)
        assert proc.returncode == 0, proc.stderr.decode()
        return json.loads(proc.stdout)

    def start(self, who: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        """``cwd``: where ``-m monitor`` is found first (an earlier release's source)."""
        proc = subprocess.Popen(
            self.command(who, "serve"), stderr=subprocess.PIPE, env=env, cwd=cwd
        )
        assert proc.stderr is not None
        for line in proc.stderr:
            if b"sessionwatch serving" in line:
                self.procs[who] = proc
                return
        raise AssertionError(f"serve {who} exited before it served")

    def kill(self, who: str) -> None:
        proc = self.procs.pop(who)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            proc.wait(30)

    def turn(self) -> str:
        """A human turn on the child: the text of the notice it opens for the watcher."""
        self.cli("record", "--session", CHILD, "--kind", "human_direct_message", "--actor", "human")
        (pending,) = self.cli("notices", "--watcher", WATCHER)["notices"]
        return str(pending["text"])


@pytest.fixture
def sink() -> Iterator[WakeSink]:
    s = WakeSink()
    yield s
    s.close()


def _sidecars(tmp_path: Path, db: str, sink: WakeSink) -> Iterator[Sidecars]:
    sidecars = Sidecars(tmp_path, db, sink)
    sidecars.cli("watch", "--watcher", WATCHER, "--target", CHILD)
    try:
        yield sidecars
    finally:
        sidecars.stop()


@pytest.fixture
def on_postgresql(tmp_path: Path, pg_server: PgServer, sink: WakeSink) -> Iterator[Sidecars]:
    yield from _sidecars(tmp_path, pg_database(pg_server), sink)


@pytest.fixture
def on_sqlite(tmp_path: Path, sink: WakeSink) -> Iterator[Sidecars]:
    yield from _sidecars(tmp_path, str(tmp_path / "state.db"), sink)


def accepted(text: str) -> Any:
    return lambda calls: any(c.text == text and c.answer == 200 for c in calls)


def held(text: str) -> Any:
    return lambda calls: any(c.text == text and c.answer is None for c in calls)


def assert_one_wake_a_window(calls: list[Call]) -> None:
    """Calls that may have reached the gateway (every one but a 503) never come closer than
    the window, except the one repeat of a call cut mid-way, which carries the same text."""
    reached = [c for c in calls if c.answer != 503]
    for before, after in itertools.pairwise(reached):
        if after.text != before.text:
            assert after.at - before.at >= WINDOW_S - SLACK_S, (before, after)


def test_a_peer_takes_a_wake_cut_mid_call_over_and_sends_it_once_the_outage_ends(
    on_postgresql: Sidecars, sink: WakeSink
) -> None:
    sidecars = on_postgresql
    sidecars.start("a")
    sidecars.start("b")
    sink.mode = "hold"
    text = sidecars.turn()
    (cut,) = sink.wait("the notice called", held(text))

    # Its caller is killed mid-call, and the endpoint goes down. The other sidecar takes the
    # lease over once it expired, and its call is refused; tried again with the endpoint
    # back, it is accepted. Two calls may have reached the gateway: the cut one and the
    # accepted one.
    sidecars.kill(cut.who)
    sink.mode = "down"
    sink.release()
    sink.wait("the call of the sidecar that took over", lambda calls: len(calls) == 2)
    sink.mode = "accept"
    calls = sink.wait("the notice accepted", accepted(text))
    survivor = "b" if cut.who == "a" else "a"
    assert [(c.who, c.text, c.answer) for c in calls] == [
        (cut.who, text, None),
        (survivor, text, 503),
        (survivor, text, 200),
    ]
    assert_one_wake_a_window(calls)
    assert sidecars.cli("notices", "--watcher", WATCHER)["notices"] == []


def test_a_killed_host_s_share_of_the_watchers_is_woken_by_another_within_two_intervals(
    on_postgresql: Sidecars, sink: WakeSink
) -> None:
    """Each watcher is woken by its owner alone (delivery/shares.py); when the owner dies,
    the other takes its share once the dead host's lease ran out (half an interval) and it
    renewed its own (a third of that): a turn recorded just after the kill is woken by the
    survivor within two intervals of it, and once."""
    interval_s = 6.0
    sidecars = on_postgresql
    sidecars.extra = f"[monitor]\ninterval_s = {interval_s}\n"
    sidecars.start("a")
    sidecars.start("b")
    shares = Shares("a")
    shares.update(frozenset({"a", "b"}))
    owner, survivor = ("a", "b") if shares.owns(WATCHER) else ("b", "a")
    sidecars.kill(owner)
    killed = time.monotonic()
    text = sidecars.turn()
    (call,) = sink.wait("the notice accepted", accepted(text))
    assert (call.who, call.answer) == (survivor, 200)
    assert call.at - killed < 2 * interval_s
    assert sidecars.cli("notices", "--watcher", WATCHER)["notices"] == []


PREVIOUS = "074f456"  # the release before each watcher had one owner (delivery/shares.py)


@pytest.mark.skipif(not has_history(PREVIOUS), reason=f"no git history for {PREVIOUS}")
def test_a_fleet_mid_upgrade_wakes_every_watcher_once(
    tmp_path: Path, pg_server: PgServer, sink: WakeSink
) -> None:
    """A rolling upgrade, two releases on one store: the one before shares claims every
    watcher after every commit it hears, this one only its share, and its ledger's steps
    tell no one. Every notice is still woken, once. The earlier release runs first, on its
    schema; this one's ``serve`` upgrades the store under it (a ``serve`` of the earlier
    release started after that would refuse the newer schema)."""
    sidecars = Sidecars(tmp_path, pg_database(pg_server), sink)  # nothing of this release's
    try:
        _mid_upgrade(sidecars, sink)
    finally:
        sidecars.stop()


def _mid_upgrade(sidecars: Sidecars, sink: WakeSink) -> None:
    children = [f"agent:main:subagent:t{i}" for i in range(8)]
    watchers = [f"agent:w{i}:main" for i in range(8)]
    old = build(PREVIOUS)
    sidecars.start("old", env={**os.environ, "PYTHONPATH": str(old)}, cwd=old)
    sidecars.start("new")
    for watcher, child in zip(watchers, children, strict=True):
        sidecars.cli("watch", "--watcher", watcher, "--target", child)
    for child in children:
        sidecars.cli(
            "record", "--session", child, "--kind", "human_direct_message", "--actor", "human"
        )
    calls = sink.wait(
        "every watcher woken",
        lambda calls: {c.watcher for c in calls if c.answer == 200} >= set(watchers),
    )
    time.sleep(1.0)  # a second wake of any would be on its way by now
    woken = Counter(c.watcher for c in sink.calls)
    assert all(woken[w] == 1 for w in watchers), woken
    assert {c.who for c in calls} <= {"old", "new"}
    for watcher in watchers:
        assert sidecars.cli("notices", "--watcher", watcher)["notices"] == []


def test_a_restart_after_a_kill_mid_call_sends_the_wake_once_more_and_no_drained_one(
    on_sqlite: Sidecars, sink: WakeSink
) -> None:
    sidecars = on_sqlite
    sidecars.start("a")
    sink.mode = "hold"
    text = sidecars.turn()
    sink.wait("the notice called", held(text))
    sidecars.kill("a")

    sink.mode = "accept"
    sink.release()
    sidecars.start("a")
    sink.wait("the notice accepted", accepted(text))

    # A notice drained within the window is never sent: the next pass, after the window,
    # carries the one opened after the drain, alone.
    drained = sidecars.turn()
    assert sidecars.cli("notices", "--watcher", WATCHER, "--drain")["notices"]
    last = sidecars.turn()
    calls = sink.wait("the last notice accepted", accepted(last))
    assert [(c.text, c.answer) for c in calls] == [(text, None), (text, 200), (last, 200)]
    assert drained != last
    assert_one_wake_a_window(calls)
    assert sidecars.cli("notices", "--watcher", WATCHER)["notices"] == []


FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"


@pytest.mark.skipif(not Path(FAKETIME).exists(), reason="libfaketime is not installed (faketime)")
def test_a_host_whose_wall_clock_is_off_breaks_no_window_and_repeats_no_call(
    on_postgresql: Sidecars, sink: WakeSink, tmp_path: Path
) -> None:
    """Two sidecars on PostgreSQL, one with its wall clock 45 s ahead, then 45 s behind (its
    monotonic clock untouched, libfaketime): each lease and window is the store's clock, so
    turns that come faster than the window are woken one window apart, whichever host
    sends them, each notice accepted once (the release before broke the window every 10 s,
    and sent a live call twice at +45 s)."""
    import os
    import time

    sidecars = on_postgresql
    offset = tmp_path / "faketime"
    offset.write_text("+45 x1\n")
    skewed = {
        **os.environ,
        "LD_PRELOAD": FAKETIME,
        "FAKETIME_TIMESTAMP_FILE": str(offset),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    sidecars.start("a")
    sidecars.start("b", env=skewed)
    turn = ["record", "--session", CHILD, "--kind", "human_direct_message", "--actor", "human"]
    for n in range(6):  # a turn every 4 s: notices faster than the window
        sidecars.cli(*turn)
        time.sleep(4)
        if n == 2:
            offset.write_text("-45 x1\n")  # the other way (FAKETIME_NO_CACHE: read at once)
    deadline = time.monotonic() + 90
    while sidecars.cli("notices", "--watcher", WATCHER)["notices"]:  # each woken, accepted
        assert time.monotonic() < deadline, sink.calls
        time.sleep(0.5)
    calls = list(sink.calls)
    assert 2 <= len(calls)
    assert_one_wake_a_window(calls)
    taken = [c.text for c in calls if c.answer == 200]
    assert len(taken) == len(set(taken)), calls  # no notice accepted twice
