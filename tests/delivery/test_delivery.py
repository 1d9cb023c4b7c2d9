"""Wake delivery: what a wake carries, what an accepted one acknowledges, what each refusal
leaves behind, and when wakes go. The gateway is a stand-in that answers as OpenClaw's does
(tests/interop runs the real one), reached in process through the hooks client's transport,
on a manual clock: nothing here waits for real. One test runs it all over loopback HTTP in
a running sidecar."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from monitor.config import Config, GatewayConfig, parse_config
from monitor.delivery.hooks import HooksClient
from monitor.delivery.ledger import Delivery
from monitor.delivery.timers import LoopTimers
from monitor.errors import ConfigError, NotPrivate, StoreError
from monitor.kernel import Kernel, NewEvent
from monitor.kernel.bus import Bus, WakeOutcome
from monitor.kernel.commits import Commits
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.store import open_store
from monitor.kernel.store.protocol import StateStore
from monitor.metrics import Metrics
from monitor.serve.root import Sidecar, running
from tests.helpers import ManualClock, ManualTimers, make_config, notice, until
from tests.hooks_gateway import TOKEN, HooksGateway, MockTransport, running_hooks_gateway

MAIN = "agent:main:main"
PEER = "agent:main:dashboard:peer"
OTHER = "agent:main:dashboard:other"
COORDINATOR = "agent:main:dashboard:coordinator"
RETRY_S = 30.0


class RefusingStore:
    """The store, but its next ``refusals`` writes fail as a locked database would, and its
    next writes take ``stalls`` ms each of the manual clock (a store that slow)."""

    def __init__(self, store: StateStore, timers: ManualTimers) -> None:
        self._store = store
        self.timers = timers
        self.refusals = 0
        self.stalls: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def write(self, fn: Any, **kw: Any) -> Any:
        if self.refusals:
            self.refusals -= 1
            raise StoreError("database is locked")
        result = await self._store.write(fn, **kw)
        if self.stalls:
            took = self.stalls.pop(0)
            self.timers.mono_ms += took
            self.timers.clock.now += took
        return result


@dataclass
class Rig:
    kernel: Kernel
    delivery: Delivery
    client: HooksClient
    gateway: HooksGateway
    transport: MockTransport
    timers: ManualTimers
    store: RefusingStore
    metrics: Metrics
    token_file: Path

    async def settled(self) -> None:
        await self.timers.quiesce()
        await self.delivery.settled()

    async def human(self, key: str) -> None:
        turn = NewEvent(
            session_key=key, kind=EventKind.HUMAN_DIRECT_MESSAGE, actor_type=ActorType.HUMAN
        )
        await self.kernel.record(turn)
        await self.settled()

    async def pending(self, watcher: str = MAIN) -> list[str]:
        return [n.text for n in await self.kernel.notices(watcher=watcher)]

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels or None) or 0.0


@pytest.fixture
async def rig(tmp_path: Path, clock: ManualClock) -> AsyncIterator[Rig]:
    timers = ManualTimers(clock)
    gateway = HooksGateway()
    transport = gateway.transport()
    token_file = tmp_path / "hooks-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    metrics = Metrics()
    client = HooksClient(
        "http://gateway.invalid/hooks",
        token_file,
        timers=timers,
        transport=transport,
        retry_s=RETRY_S,
        metrics=metrics,
    )
    store = RefusingStore(await open_store(tmp_path / "state.db", clock=clock), timers)
    timers.stores.append(store._store)
    kernel = await Kernel.on_store(store._store, metrics=metrics)
    commits = Commits(store, kernel.policy, kernel.bus)
    delivery = Delivery(
        kernel, client, timers=timers, metrics=metrics, others=False, commits=commits
    )
    await delivery.start(contextlib.AsyncExitStack(), kernel.bus)
    yield Rig(kernel, delivery, client, gateway, transport, timers, store, metrics, token_file)
    await delivery.close()
    await kernel.close()


async def test_a_wake_carries_each_notice_and_acknowledges_it(rig: Rig) -> None:
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    await rig.kernel.watch(watcher=MAIN, target=OTHER)
    await rig.human(PEER)
    assert [notice(PEER, 0)] == rig.gateway.texts  # at once
    await rig.human(OTHER)
    assert [notice(PEER, 0)] == rig.gateway.texts  # inside the window: one trailing wake
    assert [20_000] == rig.timers.delays_ms
    await rig.timers.advance(20_000)
    await rig.settled()
    assert [notice(PEER, 0), notice(OTHER, 0)] == rig.gateway.texts
    assert {("now", "main", MAIN)} == {
        (w["mode"], w["agentId"], w["sessionKey"]) for w in rig.gateway.wakes
    }
    assert [] == await rig.pending()
    assert 2 == rig.sample("sessionwatch_notices_delivered_by_wake_total")


async def test_a_notice_asked_for_twice_is_sent_once(rig: Rig) -> None:
    """The database is the memory of what was delivered: the sweep, another process's
    change and this process's commit may all ask for one notice; it goes once."""
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    await rig.human(PEER)
    rig.delivery.deliver(await rig.kernel.pending())  # as the change hub would
    await rig.kernel.sweep()
    await rig.timers.advance(60_000)
    await rig.settled()
    assert [notice(PEER, 0)] == rig.gateway.texts


async def test_a_notice_the_gateway_opened_is_never_woken_by_the_sidecar(
    rig: Rig, tmp_path: Path
) -> None:
    """The gateway delivers its own notices from its own queue."""
    await rig.kernel.watch(watcher=MAIN, target=OTHER)
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    gateway_records(tmp_path / "state.db", MAIN, OTHER)
    rig.delivery.deliver(await rig.kernel.pending())  # another process's change, heard
    await rig.settled()
    assert [] == rig.gateway.texts
    await rig.human(PEER)  # ours: woken
    await rig.timers.advance(60_000)
    await rig.settled()
    assert [notice(PEER, 0)] == rig.gateway.texts
    assert [notice(OTHER, 0)] == await rig.pending()  # the gateway's, left to it


def gateway_records(db: Path, watcher: str, target: str) -> None:
    """What OpenClaw's own recording does to the shared file: an event, its head, and the
    watcher's cursor frozen at it, with no mark of a sidecar."""
    conn = sqlite3.connect(db)
    with conn:
        seq = conn.execute(
            "INSERT INTO session_state_events (session_key, agent_id, kind, actor_type,"
            " occurred_at, summary) VALUES (?, 'main', 'human_direct_message', 'human', 1,"
            " 'human message via unknown') RETURNING sequence",
            (target,),
        ).fetchone()[0]
        conn.execute(
            "UPDATE session_watch_cursors SET notified_sequence = ?, material_sequence = ?"
            " WHERE watcher_session_key = ? AND target_session_key = ?",
            (seq, seq, watcher, target),
        )
    conn.close()


async def test_a_refused_token_is_said_once_and_calls_wait_out_the_interval(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.token_file.write_text("wrong\n")
    caplog.set_level(logging.WARNING)
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    await rig.human(PEER)
    assert 1 == rig.gateway.calls
    for _ in range(10):  # ten minutes: one call per interval, never a storm
        await rig.timers.advance(60_000)
        await rig.settled()
    assert rig.gateway.calls <= 21
    said = [r.getMessage() for r in caplog.records if "401" in r.getMessage()]
    assert 1 == len(said)
    assert str(rig.token_file) in said[0]
    assert [notice(PEER, 0)] == await rig.pending()
    rig.token_file.write_text(TOKEN + "\n")  # the operator fixes the file
    await rig.timers.advance(int(RETRY_S * 1000))
    await rig.settled()
    assert [notice(PEER, 0)] == rig.gateway.texts
    assert [] == await rig.pending()
    assert 1 <= rig.sample("sessionwatch_wake_calls_total", result="unauthorized")


async def test_a_throttled_wake_waits_for_retry_after(rig: Rig) -> None:
    rig.gateway.status = 429
    rig.gateway.retry_after = "90"  # longer than the retry interval: the gateway's wins
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    await rig.human(PEER)
    assert 1 == rig.gateway.calls
    rig.gateway.status = None
    await rig.timers.advance(89_000)
    await rig.settled()
    assert 1 == rig.gateway.calls  # still waiting, as the gateway asked
    await rig.timers.advance(1_000)
    await rig.settled()
    assert [notice(PEER, 0)] == rig.gateway.texts
    assert 1 == rig.sample("sessionwatch_wake_calls_total", result="throttled")


async def test_a_gateway_that_is_down_gets_the_notice_once_it_is_back(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.transport.down = True
    caplog.set_level(logging.WARNING)
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    await rig.kernel.record(
        NewEvent(session_key=PEER, kind=EventKind.HUMAN_DIRECT_MESSAGE, actor_type=ActorType.HUMAN)
    )
    await until("the first try", lambda: rig.gateway.calls > 0)
    await rig.timers.quiesce()
    assert 1 == rig.gateway.calls
    await rig.timers.advance(500)  # three tries, half a second and then a second apart
    assert 2 == rig.gateway.calls
    await rig.timers.advance(1_000)
    await rig.settled()
    assert 3 == rig.gateway.calls
    assert [int(RETRY_S * 1000)] == rig.timers.delays_ms  # then the interval
    await rig.timers.advance(int(RETRY_S * 1000) + 1_500)
    await rig.settled()
    assert 6 == rig.gateway.calls
    assert 1 == sum("did not take a wake" in r.getMessage() for r in caplog.records)
    assert "connection refused" in caplog.text
    assert [notice(PEER, 0)] == await rig.pending()
    rig.transport.down = False
    await rig.timers.advance(int(RETRY_S * 1000))
    await rig.settled()
    assert [notice(PEER, 0)] == rig.gateway.texts
    assert [] == await rig.pending()
    assert 2 == rig.sample("sessionwatch_wake_calls_total", result="failed")


def gateway_restarts(db: Path, at_ms: int) -> None:
    """What OpenClaw's start-up sweep (``sweepSessionStateWatchNotices``) does to the shared
    file before it queues and wakes every pending notice itself: each pending cursor frozen
    at its material work, stamped with the gateway's clock."""
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(
            "UPDATE session_watch_cursors SET notified_sequence = material_sequence,"
            " updated_at = ? WHERE material_sequence > last_seen_sequence",
            (at_ms,),
        )
    conn.close()


async def test_a_notice_the_gateway_woke_itself_at_its_restart_is_not_sent_again(
    rig: Rig, tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Opened while the gateway was down; the gateway starts, and its own sweep queues and
    wakes every pending notice. The sidecar's retry then finds the notice frozen again
    after it opened: not sent (the model would read it twice), said once in the log, and
    left pending for the gateway's drain to acknowledge. A notice that opens afterwards is
    the sidecar's to wake, as ever."""
    caplog.set_level(logging.INFO)
    rig.transport.down = True
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    await rig.kernel.watch(watcher=MAIN, target=OTHER)
    await rig.kernel.record(
        NewEvent(session_key=PEER, kind=EventKind.HUMAN_DIRECT_MESSAGE, actor_type=ActorType.HUMAN)
    )
    await until("the first try", lambda: rig.gateway.calls > 0)
    await rig.timers.advance(1_500)  # its three tries
    await rig.settled()
    assert [] == rig.gateway.texts
    gateway_restarts(tmp_path / "state.db", clock.now + 5_000)
    rig.transport.down = False
    await rig.timers.advance(int(RETRY_S * 1000) + 20_000)
    await rig.settled()
    assert [] == rig.gateway.texts
    assert [notice(PEER, 0)] == await rig.pending()  # the gateway's drain takes it
    assert 1 == sum("woke it itself" in r.getMessage() for r in caplog.records)
    await rig.human(OTHER)
    await rig.timers.advance(60_000)
    await rig.settled()
    assert [notice(OTHER, 0)] == rig.gateway.texts


async def test_a_child_spawned_again_while_its_notice_pends_is_still_woken(rig: Rig) -> None:
    """A spawn edge on a pair whose notice pends (the parent runs the child again) keeps
    the cursor's updated_at: the notice is not taken for one the gateway woke itself."""
    child = "agent:main:subagent:again"
    rig.transport.down = True
    await rig.kernel.spawn(parent=MAIN, child=child, run_id="r1")
    await rig.kernel.record(
        NewEvent(session_key=child, kind=EventKind.HUMAN_DIRECT_MESSAGE, actor_type=ActorType.HUMAN)
    )
    await until("the first try", lambda: rig.gateway.calls > 0)
    await rig.timers.advance(1_500)
    await rig.settled()
    rig.timers.clock.advance(5_000)
    await rig.kernel.spawn(parent=MAIN, child=child, run_id="r2")
    rig.transport.down = False
    await rig.timers.advance(int(RETRY_S * 1000) + 20_000)
    await rig.settled()
    assert 1 == len([t for t in rig.gateway.texts if child in t]), rig.gateway.texts
    assert [] == await rig.pending()


async def test_caller_chosen_keys_refused_main_through_its_agent_others_stay_pending(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.gateway.allow_keys = False
    caplog.set_level(logging.WARNING)
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    await rig.kernel.watch(watcher=COORDINATOR, target=PEER)
    await rig.human(PEER)
    assert [{"text": notice(PEER, 0), "mode": "now", "agentId": "main"}] == rig.gateway.wakes
    assert [] == await rig.pending()
    assert [notice(PEER, 0)] == await rig.pending(COORDINATOR)
    said = [r.getMessage() for r in caplog.records if "allowRequestSessionKey" in r.getMessage()]
    assert 1 == len(said)


async def test_an_acknowledgement_the_store_refused_is_retried_never_the_wake(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway has the notice once it accepted the wake: when the store then refuses the
    acknowledgement, the acknowledgement is retried, and the wake is not sent again."""
    caplog.set_level(logging.WARNING)
    await rig.kernel.watch(watcher=MAIN, target=PEER)

    async def refuse_the_next_write() -> None:  # the outcome's, once the gateway answered
        rig.transport.before = None
        rig.store.refusals = 1

    rig.transport.before = refuse_the_next_write
    await rig.human(PEER)
    assert [notice(PEER, 0)] == rig.gateway.texts
    assert [notice(PEER, 0)] == await rig.pending()
    assert "could not record a wake's outcome" in caplog.text
    await rig.timers.advance(1_000)  # the store's backoff, not the gateway's retry interval
    await rig.settled()
    assert [] == await rig.pending()
    assert [notice(PEER, 0)] == rig.gateway.texts  # sent once


async def test_an_acknowledgement_the_store_refused_delays_no_wake_past_the_window(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """The store refused a record, not the gateway a wake: the watcher's next notice is
    woken when the 20 s window ends, not after the gateway's retry interval, and the log
    says the store's trouble once and its end once, never that the gateway came back."""
    caplog.set_level(logging.INFO)
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    await rig.kernel.watch(watcher=MAIN, target=OTHER)

    async def refuse_the_next_writes() -> None:
        rig.transport.before = None
        rig.store.refusals = 2  # the outcome's record, and its first retry

    rig.transport.before = refuse_the_next_writes
    await rig.human(PEER)
    await rig.human(OTHER)  # inside the window: due when it ends
    assert [notice(PEER, 0)] == rig.gateway.texts
    await rig.timers.advance(20_000)
    await rig.settled()
    assert [notice(PEER, 0), notice(OTHER, 0)] == rig.gateway.texts
    assert [] == await rig.pending()
    assert 1 == caplog.text.count("could not record a wake's outcome")
    assert 1 == caplog.text.count("takes the wake ledger's writes again")
    assert "accepts wakes again" not in caplog.text


async def test_work_during_a_wake_reopens_one_notice_that_is_woken_too(rig: Rig) -> None:
    """A change after the notice froze and before the gateway's answer: the acknowledgement
    reopens one fresh notice, woken once the window ends."""
    await rig.kernel.watch(watcher=MAIN, target=PEER)

    async def another_turn() -> None:
        rig.transport.before = None
        turn = NewEvent(
            session_key=PEER, kind=EventKind.HUMAN_DIRECT_MESSAGE, actor_type=ActorType.HUMAN
        )
        await rig.kernel.record(turn)  # not settled: this runs inside the wake's pass

    rig.transport.before = another_turn
    await rig.human(PEER)
    assert [notice(PEER, 0)] == rig.gateway.texts
    assert [notice(PEER, 1)] == await rig.pending()  # frozen where the wake's notice was
    await rig.timers.advance(20_000)
    await rig.settled()
    assert [notice(PEER, 0), notice(PEER, 1)] == rig.gateway.texts
    assert [] == await rig.pending()


async def test_a_running_sidecar_wakes_over_http(
    tmp_path: Path, hooks_gateway: HooksGateway
) -> None:
    """The whole loop in ``serve``: another process records a turn, the change is heard,
    the stand-in gets the notice over loopback HTTP, and the notice is acknowledged."""
    db = tmp_path / "state.db"
    config = make_config(tmp_path, gateway=hooks_gateway.config(tmp_path))
    async with running(config, db) as sidecar:
        assert sidecar is not None
        await sidecar.kernel.watch(watcher=MAIN, target=PEER)
        other = await Kernel.open(db)
        try:
            await other.record(
                NewEvent(
                    session_key=PEER,
                    kind=EventKind.HUMAN_DIRECT_MESSAGE,
                    actor_type=ActorType.HUMAN,
                )
            )
        finally:
            await other.close()
        await until("the wake", lambda: bool(hooks_gateway.wakes))
        assert [notice(PEER, 0)] == hooks_gateway.texts
        await until("the acknowledgement", lambda: _empty(sidecar))


async def test_a_running_sidecar_times_its_wakes_on_the_timers_it_is_given(
    tmp_path: Path, hooks_gateway: HooksGateway
) -> None:
    """``running`` hands its timers to delivery (a simulation moves them with its wall
    clock): a change within the window waits for the timers to pass it, and a wall clock
    moved on alone does not send it."""
    clock = ManualClock()
    timers = ManualTimers(clock)
    config = make_config(tmp_path, gateway=hooks_gateway.config(tmp_path))
    async with running(config, tmp_path / "state.db", clock=clock, timers=timers) as sidecar:
        assert sidecar is not None and sidecar.delivery is not None
        for target in (PEER, OTHER):
            await sidecar.kernel.watch(watcher=MAIN, target=target)

        async def turn(key: str) -> None:
            await sidecar.kernel.record(
                NewEvent(
                    session_key=key, kind=EventKind.HUMAN_DIRECT_MESSAGE, actor_type=ActorType.HUMAN
                )
            )
            await sidecar.delivery.settled()

        await turn(PEER)
        assert [notice(PEER, 0)] == hooks_gateway.texts  # the first, at once
        clock.now += 86_400_000  # a day on the wall clock alone
        await turn(OTHER)
        assert [notice(PEER, 0)] == hooks_gateway.texts  # still within the window
        await timers.advance(20_000)
        await sidecar.delivery.settled()
        assert [notice(PEER, 0), notice(OTHER, 0)] == hooks_gateway.texts


async def _empty(sidecar: Sidecar) -> bool:
    return not await sidecar.kernel.notices(watcher=MAIN)


def test_wake_url_is_refused_naming_the_new_keys() -> None:
    with pytest.raises(ConfigError, match=r"hooks_url.*hooks_token_file"):
        parse_config({"gateway": {"wake_url": "http://127.0.0.1:1/wake"}})


def test_hooks_url_needs_its_token_file() -> None:
    with pytest.raises(ConfigError, match="go together"):
        parse_config({"gateway": {"hooks_url": "http://127.0.0.1:1/hooks"}})
    with pytest.raises(ConfigError, match="http:// or https://"):
        parse_config({"gateway": {"hooks_url": "127.0.0.1:1", "hooks_token_file": "/x"}})


async def test_a_hooks_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "hooks-token"
    token.write_text("secret\n")
    token.chmod(0o644)
    gateway = GatewayConfig(hooks_url="http://127.0.0.1:1/hooks", hooks_token_file=str(token))
    config: Config = make_config(tmp_path, gateway=gateway)
    with pytest.raises(NotPrivate, match="chmod 600"):
        async with running(config, tmp_path / "state.db"):
            pass


async def test_a_token_fault_is_said_once_retried_and_heals_on_its_own(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """The token file turns 0644 while a notice is pending: no call, no traceback, the
    reason once; after ``chmod 600`` the notice goes at the next retry, with no other
    event for that watcher."""
    caplog.set_level(logging.WARNING)
    rig.token_file.chmod(0o644)
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    await rig.human(PEER)
    for _ in range(3):
        await rig.timers.advance(int(RETRY_S * 1000))
        await rig.settled()
    assert 0 == rig.gateway.calls
    assert [notice(PEER, 0)] == await rig.pending()
    said = [r for r in caplog.records if "no wake sent" in r.getMessage()]
    assert 1 == len(said)
    assert "chmod 600" in said[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)
    assert 4 == rig.sample("sessionwatch_wake_calls_total", result="no_token")
    rig.token_file.chmod(0o600)
    await rig.timers.advance(int(RETRY_S * 1000))
    await rig.settled()
    assert [notice(PEER, 0)] == rig.gateway.texts
    assert [] == await rig.pending()


async def test_a_missing_token_file_is_a_failure_with_its_reason(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    rig.token_file.unlink()
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    await rig.human(PEER)
    assert 0 == rig.gateway.calls
    assert 1 == sum("no wake sent" in r.getMessage() for r in caplog.records)
    assert [int(RETRY_S * 1000)] == rig.timers.delays_ms
    rig.token_file.write_text(TOKEN + "\n")
    rig.token_file.chmod(0o600)
    await rig.timers.advance(int(RETRY_S * 1000))
    await rig.settled()
    assert [notice(PEER, 0)] == rig.gateway.texts


@pytest.mark.parametrize("step_ms", [-3_600_000, 3_600_000])
async def test_a_wall_clock_step_delays_no_wake_past_the_window(rig: Rig, step_ms: int) -> None:
    """Windows are timed on the monotonic clock: after a step of the wall clock (back, as
    an NTP correction or a restored VM; or forward), a notice inside the window goes at
    its end, and one after it at once."""
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    await rig.kernel.watch(watcher=MAIN, target=OTHER)
    await rig.human(PEER)
    assert [notice(PEER, 0)] == rig.gateway.texts
    rig.timers.clock.now += step_ms
    await rig.timers.advance(1_000)
    await rig.human(OTHER)
    assert [19_000] == rig.timers.delays_ms  # the rest of the window, not an hour
    await rig.timers.advance(19_000)
    await rig.settled()
    assert [notice(PEER, 0), notice(OTHER, 0)] == rig.gateway.texts
    await rig.timers.advance(20_000)
    await rig.human(PEER)
    assert 3 == len(rig.gateway.texts)  # the window is over: at once


async def test_a_redirect_is_never_followed(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The hooks endpoint answers 307 to another server, over real loopback HTTP: nothing
    goes there, the notice stays pending, the reason is said once, and a redirect is not
    taken for the gateway's acceptance."""
    from aiohttp import web

    from monitor.delivery.transport import OneShotTransport

    caplog.set_level(logging.INFO)
    async with running_hooks_gateway() as elsewhere:
        app = web.Application()

        async def redirect(request: web.Request) -> web.Response:
            raise web.HTTPTemporaryRedirect(elsewhere.url + "/wake")

        app.router.add_post("/hooks/wake", redirect)
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            host, port = runner.addresses[0][:2]
            timers = ManualTimers(clock)
            token_file = tmp_path / "hooks-token"
            token_file.write_text(TOKEN + "\n")
            token_file.chmod(0o600)
            metrics = Metrics()
            bus = Bus()
            outcomes: list[WakeOutcome] = []
            bus.subscribe(WakeOutcome, outcomes.append)
            client = HooksClient(
                f"http://{host}:{port}/hooks",
                token_file,
                timers=timers,
                transport=OneShotTransport(),
                retry_s=RETRY_S,
                metrics=metrics,
                bus=bus,
            )
            store = await open_store(tmp_path / "state.db", clock=clock)
            kernel = await Kernel.on_store(store, bus=bus)
            delivery = Delivery(kernel, client, timers=timers, metrics=metrics, others=False)
            await delivery.start(contextlib.AsyncExitStack(), kernel.bus)
            try:
                await kernel.watch(watcher=MAIN, target=PEER)
                for _ in range(2):
                    await kernel.record(
                        NewEvent(
                            session_key=PEER,
                            kind=EventKind.HUMAN_DIRECT_MESSAGE,
                            actor_type=ActorType.HUMAN,
                        )
                    )
                    await until("the wake's answer", lambda: bool(outcomes))
                    await delivery.settled()
                    await timers.advance(int(RETRY_S * 1000))
                    await delivery.settled()
                assert 0 == elsewhere.calls
                assert [notice(PEER, 0)] == [n.text for n in await kernel.notices(watcher=MAIN)]
                said = [r.getMessage() for r in caplog.records if "redirect" in r.getMessage()]
                assert 1 == len(said)
                assert elsewhere.url in said[0]
                assert "accepts wakes again" not in caplog.text
                assert {(MAIN, "redirected")} == {(o.watcher, o.result) for o in outcomes}
                samples = metrics.registry.get_sample_value(
                    "sessionwatch_wake_calls_total", {"result": "redirected"}
                )
                assert samples is not None and samples >= 2
            finally:
                await delivery.close()
                await client.close()
                await kernel.close()
        finally:
            await runner.cleanup()


async def test_a_call_that_reached_the_gateway_late_leaves_a_whole_window_after_it(
    rig: Rig,
) -> None:
    """The request reached the gateway 8 s after the call went (a connection retried over a
    link that was down, a slow proxy, a host paused just after its hold): the window runs
    from the call's end, in this process and in the store (a peer or a restart waits as
    long), so the gateway sees the next call a whole window after this one."""
    from monitor.delivery import claims

    late = [8_000]

    async def slow_link() -> None:
        if late:
            took = late.pop()
            rig.timers.mono_ms += took
            rig.timers.clock.now += took

    rig.transport.before = slow_link
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    await rig.kernel.watch(watcher=MAIN, target=OTHER)
    await rig.human(PEER)
    assert [notice(PEER, 0)] == rig.gateway.texts
    await rig.timers.advance(1_000)
    await rig.human(OTHER)
    assert [19_000] == rig.timers.delays_ms  # from the answer, not from when the call went

    def peer_claims(conn: Any) -> claims.Claim:
        return claims.claim(conn, MAIN, holder="peer", window_ms=20_000, lease_ms=30_000)

    assert claims.Wait(19_000) == await rig.kernel.store.write(peer_claims)
    await rig.timers.advance(18_999)
    assert [notice(PEER, 0)] == rig.gateway.texts
    await rig.timers.advance(1)
    await rig.settled()
    assert [notice(PEER, 0), notice(OTHER, 0)] == rig.gateway.texts


async def test_a_wake_claimed_at_a_later_wall_time_holds_no_window(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A wake stored before the wall clock stepped back an hour lies in the future: it holds
    no window (else every wake would wait for the clock to catch up); one stored a second
    ago does, and a lease another holder keeps says who has it until when."""
    from monitor.delivery import claims

    kernel = await Kernel.open(tmp_path / "state.db", clock=clock)
    try:
        await kernel.watch(watcher=MAIN, target=PEER)
        await kernel.record(
            NewEvent(
                session_key=PEER, kind=EventKind.HUMAN_DIRECT_MESSAGE, actor_type=ActorType.HUMAN
            )
        )
        now = clock()

        async def claim(holder: str, at: int, *, keep: bool = False) -> claims.Claim:
            clock.now = at  # the store's clock (SQLite: the host's)

            def run(conn: Any) -> claims.Claim:
                got = claims.claim(conn, MAIN, holder=holder, window_ms=20_000, lease_ms=30_000)
                if isinstance(got, claims.Claimed) and got.entries:  # the call goes out
                    first = got.entries[0]
                    held = claims.hold(
                        conn, first, holder=holder, lease_ms=30_000, window_ms=20_000
                    )
                    assert "go" == held
                    conn.execute(
                        "UPDATE sessionwatch_notice_outbox SET state = 'wake' WHERE id = ?",
                        (first.id,),
                    )  # not settled: due again
                if not keep:
                    claims.release(conn, MAIN, holder)
                return got

            return await kernel.store.write(run)

        assert isinstance(await claim("a", now), claims.Claimed)
        assert claims.Wait(19_000) == await claim("a", now + 1_000)
        assert isinstance(await claim("a", now - 3_600_000), claims.Claimed)
        clock.now = now
        await claim("b", now + 40_000, keep=True)
        assert claims.Busy(5_000) == await claim("a", now + 65_000)
    finally:
        await kernel.close()


async def test_a_notice_drained_while_its_pass_runs_is_withdrawn_not_woken(rig: Rig) -> None:
    """Two notices open together; the watcher drains while the first call is in flight:
    the second is read again just before its call, found acknowledged, and never sent."""
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    await rig.kernel.watch(watcher=MAIN, target=OTHER)

    async def drain() -> None:
        rig.transport.before = None
        await rig.kernel.notices(watcher=MAIN, drain=True)

    rig.transport.before = drain

    def both(record: Any) -> None:
        for key in (PEER, OTHER):
            record(
                NewEvent(
                    session_key=key,
                    kind=EventKind.HUMAN_DIRECT_MESSAGE,
                    actor_type=ActorType.HUMAN,
                ).draft(rig.timers.now_ms())
            )

    await rig.kernel.commit(both)
    await rig.settled()
    assert 1 == rig.gateway.calls  # the first went out before the drain; the second never
    assert [] == await rig.pending()
    await rig.timers.advance(60_000)
    await rig.settled()
    assert 1 == rig.gateway.calls


async def test_a_queue_only_watcher_is_never_woken_beside_one_that_is(rig: Rig) -> None:
    """A sub-agent's notice waits for its own read, whatever pass runs beside it."""
    sub = "agent:main:subagent:helper"
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    await rig.kernel.watch(watcher=sub, target=PEER)
    await rig.human(PEER)
    rig.delivery.request(sub)  # asked for anyway: its outbox row is queue-only
    await rig.timers.advance(60_000)
    await rig.settled()
    assert {MAIN} == {w["sessionKey"] for w in rig.gateway.wakes}
    assert [notice(PEER, 0)] == await rig.pending(sub)


async def test_a_slow_gateway_gets_one_wake_over_http(tmp_path: Path, clock: ManualClock) -> None:
    """A gateway that answers after 6 s, over loopback: the client waits for it (its read
    timeout is longer), so the notice goes once, and is acknowledged."""
    from aiohttp import web

    from tests.hooks_gateway import HooksGateway

    gateway = HooksGateway()

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(6)
        return await gateway.wake(request)

    app = web.Application()
    app.router.add_post("/hooks/wake", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    token_file = tmp_path / "hooks-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    kernel = await Kernel.open(tmp_path / "state.db")
    client = HooksClient(f"http://127.0.0.1:{port}/hooks", token_file, timers=LoopTimers())
    delivery = Delivery(kernel, client, others=False)
    try:
        await delivery.start(contextlib.AsyncExitStack(), kernel.bus)
        await kernel.watch(watcher=MAIN, target=PEER)
        await kernel.record(
            NewEvent(
                session_key=PEER, kind=EventKind.HUMAN_DIRECT_MESSAGE, actor_type=ActorType.HUMAN
            )
        )
        await until("the slow wake answered", lambda: bool(gateway.wakes), timeout=30)
        await delivery.settled()
        assert [notice(PEER, 0)] == gateway.texts
        assert [] == await kernel.notices(watcher=MAIN)
    finally:
        await delivery.close()
        await client.close()
        await kernel.close()
        await runner.cleanup()


async def test_a_call_goes_only_while_its_lease_covers_it(rig: Rig) -> None:
    """The read before a call took so long (a stalled store) that the lease could run out
    before the call ends, and a peer take the notice over while it is in flight: the call
    is not made, the notice is due as before (no call counted), and it goes once the pass
    has claimed again."""
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    rig.store.stalls = [0, 16_000]  # the claim; then its read before the call: 16 s
    await rig.human(PEER)
    assert 0 == rig.gateway.calls
    unanswered = await rig.kernel.store.peek(
        lambda conn: conn.execute(
            "SELECT state, unanswered FROM sessionwatch_notice_outbox"
        ).fetchall()
    )
    assert [("wake", 0)] == [tuple(row) for row in unanswered]
    await rig.timers.advance(5_000)  # the window the claim started ends
    await rig.settled()
    assert [notice(PEER, 0)] == rig.gateway.texts
    assert [] == await rig.pending()


async def test_a_refusal_of_caller_chosen_keys_heals_without_a_restart(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway refused ``sessionKey`` once (a transient allowedSessionKeyPrefixes),
    then takes it again: the peer watcher's notice, left pending, is woken with its own key
    at its next try, and the refusal and its end are each said once."""
    rig.gateway.allow_keys = False
    caplog.set_level(logging.INFO)
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    await rig.kernel.watch(watcher=COORDINATOR, target=PEER)
    await rig.human(PEER)
    assert [notice(PEER, 0)] == await rig.pending(COORDINATOR)
    await rig.timers.advance(int(RETRY_S * 1000))  # still refused: tried, pending, not said
    await rig.settled()
    assert [notice(PEER, 0)] == await rig.pending(COORDINATOR)
    rig.gateway.allow_keys = True  # openclaw.json fixed, the gateway restarted
    await rig.timers.advance(int(RETRY_S * 1000))
    await rig.settled()
    assert [] == await rig.pending(COORDINATOR)
    assert COORDINATOR == rig.gateway.wakes[-1].get("sessionKey")
    assert 1 == caplog.text.count("refuses caller-chosen session keys")
    assert 1 == caplog.text.count("takes caller-chosen session keys again")


async def test_a_gateway_that_trickles_its_answer_ends_the_attempt_within_its_bound() -> None:
    """The gateway sends 200 and a header line every 0.2 s, its body never: each read is
    quick, so only a bound on the whole attempt ends it, as unanswered (the gateway may
    have taken it), before the wake's lease could run out and a peer take the call over."""
    from monitor.delivery.transport import CallFailed, OneShotTransport

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        try:
            for n in range(100):
                writer.write(f"X-Trickle-{n}: 1\r\n".encode())
                await writer.drain()
                await asyncio.sleep(0.2)
        except ConnectionError:
            pass
        writer.close()

    server = await asyncio.start_server(trickle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = OneShotTransport(connect_s=0.5, read_s=1.0)
    began = time.monotonic()
    try:
        with pytest.raises(CallFailed) as failed:
            await transport.post(f"http://127.0.0.1:{port}/hooks/wake", b"{}", {})
    finally:
        await transport.close()
        server.close()
    took = time.monotonic() - began
    assert failed.value.maybe_taken  # unanswered: never tried again by this holder
    assert took < 10, took  # about connect + read (1.5 s), never the 20 s of the trickle


async def test_each_repeat_is_counted_with_its_reason(rig: Rig) -> None:
    """The two cases of a call that may go once more, each counted in /metrics: a call
    that went unanswered (repeated here, once its window has passed); and an answered call
    whose sidecar could not record the answer (its store unreachable) until its lease ran
    out, which a peer cannot tell from a crash: the peer's claim takes it over with its
    one repeat."""
    from monitor.delivery import claims
    from monitor.delivery.transport import CallFailed

    unanswered = [CallFailed("no answer in time", maybe_taken=True)]

    async def no_answer() -> None:
        if unanswered:
            raise unanswered.pop()

    rig.transport.before = no_answer
    await rig.kernel.watch(watcher=MAIN, target=PEER)
    await rig.human(PEER)
    assert 1 == rig.sample("sessionwatch_wake_repeats_allowed_total", reason="unanswered")
    await rig.timers.advance(int(RETRY_S * 1000))  # the retry: past the window too
    await rig.settled()
    assert 1 == rig.sample("sessionwatch_wake_calls_total", result="accepted")
    assert 1 == rig.sample("sessionwatch_wake_repeats_allowed_total", reason="unanswered")

    await rig.kernel.watch(watcher=MAIN, target=OTHER)
    await rig.timers.advance(20_000)  # past the window

    async def store_away() -> None:  # the answer comes; its record does not go through
        rig.store.refusals = 1_000

    rig.transport.before = store_away
    await rig.human(OTHER)
    assert 2 == rig.sample("sessionwatch_wake_calls_total", result="accepted")
    assert [notice(OTHER, 0)] == await rig.pending()  # not acknowledged
    rig.timers.clock.now += 30_000  # the lease runs out

    def peer_claims(conn: Any) -> claims.Claim:
        return claims.claim(conn, MAIN, holder="peer", window_ms=20_000, lease_ms=30_000)

    got = await rig.kernel.store.write(peer_claims)
    assert isinstance(got, claims.Claimed)
    assert 1 == got.repeats and [OTHER] == [e.target for e in got.entries]
    rig.store.refusals = 0
