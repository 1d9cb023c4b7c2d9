"""Wakes through the gateway's hooks API (a stand-in that answers as OpenClaw's does; the real
gateway runs in tests/interop/test_gateway.py): what a wake carries, what an accepted one
acknowledges, and what each refusal leaves behind."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path

import pytest

from monitor.config import Config, GatewayConfig, parse_config
from monitor.errors import ConfigError, NotPrivate
from monitor.kernel import Kernel, NewEvent
from monitor.kernel.events import ActorType, EventKind
from monitor.service import Sidecar, running
from tests.conftest import make_config, notice, until
from tests.hooks_gateway import TOKEN, HooksGateway

MAIN = "agent:main:main"
PEER = "agent:main:dashboard:peer"
OTHER = "agent:main:dashboard:other"
COORDINATOR = "agent:main:dashboard:coordinator"


def config_for(tmp_path: Path, gateway: HooksGateway, **extra: float) -> Config:
    return make_config(tmp_path, gateway=gateway.config(tmp_path, retry_interval_s=0.3, **extra))


async def human_turn(db: Path, key: str) -> None:
    """A human turn recorded by another sidecar process (as the CLI records one)."""
    other = await Kernel.open(db)
    try:
        turn = NewEvent(
            session_key=key, kind=EventKind.HUMAN_DIRECT_MESSAGE, actor_type=ActorType.HUMAN
        )
        await other.record(turn)
    finally:
        await other.close()


async def pending(sidecar: Sidecar, watcher: str = MAIN) -> list[str]:
    return [n.text for n in await sidecar.kernel.notices(watcher=watcher)]


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


async def test_a_wake_carries_each_notice_and_acknowledges_it(
    tmp_path: Path, hooks_gateway: HooksGateway
) -> None:
    db = tmp_path / "state.db"
    async with running(config_for(tmp_path, hooks_gateway), db) as sidecar:
        assert sidecar is not None
        await sidecar.kernel.watch(watcher=MAIN, target=PEER)
        await sidecar.kernel.watch(watcher=MAIN, target=OTHER)
        await human_turn(db, PEER)
        await human_turn(db, OTHER)
        await until("two wakes", lambda: len(hooks_gateway.wakes) == 2)
        assert sorted([notice(PEER, 0), notice(OTHER, 0)]) == sorted(hooks_gateway.texts)
        assert {("now", "main", MAIN)} == {
            (w["mode"], w["agentId"], w["sessionKey"]) for w in hooks_gateway.wakes
        }
        await until("the acknowledgement", lambda: _empty(sidecar))
        assert 2 == sample(sidecar, "sessionwatch_notices_delivered_by_wake_total")


def sample(sidecar: Sidecar, name: str, **labels: str) -> float:
    """A metric's value as /metrics shows it (0 before its first count)."""
    return sidecar.metrics.registry.get_sample_value(name, labels or None) or 0.0


async def _empty(sidecar: Sidecar) -> bool:
    return not await pending(sidecar)


async def test_a_notice_the_gateway_opened_is_never_woken_by_the_sidecar(
    tmp_path: Path, hooks_gateway: HooksGateway
) -> None:
    """The gateway delivers its own notices from its own queue."""
    db = tmp_path / "state.db"
    async with running(config_for(tmp_path, hooks_gateway), db) as sidecar:
        assert sidecar is not None
        await sidecar.kernel.watch(watcher=MAIN, target=OTHER)
        await sidecar.kernel.watch(watcher=MAIN, target=PEER)
        gateway_records(db, MAIN, OTHER)
        await until("the gateway's notice", lambda: _pending_count(sidecar, 1))
        await asyncio.sleep(1.0)  # the sidecar looks at the store's changes every 0.2 s (POLL_S)
        await human_turn(db, PEER)  # ours: woken
        await until("our wake", lambda: bool(hooks_gateway.wakes))
        await asyncio.sleep(0.5)
        assert [notice(PEER, 0)] == hooks_gateway.texts
        assert [notice(OTHER, 0)] == await pending(sidecar)  # the gateway's, left to it


async def _pending_count(sidecar: Sidecar, n: int) -> bool:
    return len(await pending(sidecar)) == n


async def test_a_refused_token_is_said_once_and_the_notice_waits(
    tmp_path: Path, hooks_gateway: HooksGateway, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "state.db"
    config = config_for(tmp_path, hooks_gateway)
    token_file = Path(config.gateway.hooks_token_file)
    token_file.write_text("wrong\n")
    caplog.set_level(logging.WARNING)
    async with running(config, db) as sidecar:
        assert sidecar is not None
        await sidecar.kernel.watch(watcher=MAIN, target=PEER)
        await human_turn(db, PEER)
        await until("three refused calls", lambda: hooks_gateway.calls >= 3)
        said = [r.getMessage() for r in caplog.records if "401" in r.getMessage()]
        assert 1 == len(said)
        assert str(token_file) in said[0]
        assert [notice(PEER, 0)] == await pending(sidecar)
        # One call per interval, never a storm against the gateway's lockout.
        calls = hooks_gateway.calls
        await asyncio.sleep(1.0)
        assert hooks_gateway.calls - calls <= 4
        token_file.write_text(TOKEN + "\n")  # the operator fixes the file
        await until("the wake", lambda: bool(hooks_gateway.wakes))
        assert [notice(PEER, 0)] == hooks_gateway.texts
        assert 1 <= sample(sidecar, "sessionwatch_wake_calls_total", result="unauthorized")


async def test_a_throttled_wake_waits_for_retry_after(
    tmp_path: Path, hooks_gateway: HooksGateway
) -> None:
    db = tmp_path / "state.db"
    hooks_gateway.status = 429
    hooks_gateway.retry_after = "2"
    async with running(config_for(tmp_path, hooks_gateway), db) as sidecar:
        assert sidecar is not None
        await sidecar.kernel.watch(watcher=MAIN, target=PEER)
        await human_turn(db, PEER)
        await until("the 429", lambda: hooks_gateway.calls == 1)
        hooks_gateway.status = None
        await asyncio.sleep(1.5)
        assert 1 == hooks_gateway.calls  # still waiting, as the gateway asked
        await until("the wake after Retry-After", lambda: bool(hooks_gateway.wakes))
        assert 1 == sample(sidecar, "sessionwatch_wake_calls_total", result="throttled")


async def test_a_gateway_that_is_down_gets_the_notice_once_it_is_back(
    tmp_path: Path, hooks_gateway: HooksGateway, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "state.db"
    hooks_gateway.status = 503
    caplog.set_level(logging.WARNING)
    async with running(config_for(tmp_path, hooks_gateway), db) as sidecar:
        assert sidecar is not None
        await sidecar.kernel.watch(watcher=MAIN, target=PEER)
        await human_turn(db, PEER)
        await until("several tries", lambda: hooks_gateway.calls >= 6)
        assert 1 == sum("did not take a wake" in r.getMessage() for r in caplog.records)
        assert [notice(PEER, 0)] == await pending(sidecar)
        hooks_gateway.status = None
        await until("the wake", lambda: bool(hooks_gateway.wakes))
        await until("the acknowledgement", lambda: _empty(sidecar))
        assert [notice(PEER, 0)] == hooks_gateway.texts
        assert 1 <= sample(sidecar, "sessionwatch_wake_calls_total", result="failed")


async def test_caller_chosen_keys_refused_main_through_its_agent_others_stay_pending(
    tmp_path: Path, hooks_gateway: HooksGateway, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "state.db"
    hooks_gateway.allow_keys = False
    caplog.set_level(logging.WARNING)
    async with running(config_for(tmp_path, hooks_gateway), db) as sidecar:
        assert sidecar is not None
        await sidecar.kernel.watch(watcher=MAIN, target=PEER)
        await sidecar.kernel.watch(watcher=COORDINATOR, target=PEER)
        await human_turn(db, PEER)
        await until("the main session's wake", lambda: bool(hooks_gateway.wakes))
        assert [{"text": notice(PEER, 0), "mode": "now", "agentId": "main"}] == hooks_gateway.wakes
        await until("the acknowledgement", lambda: _empty(sidecar))
        assert [notice(PEER, 0)] == await pending(sidecar, COORDINATOR)
        said = [
            r.getMessage() for r in caplog.records if "allowRequestSessionKey" in r.getMessage()
        ]
        assert 1 == len(said)


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
    with pytest.raises(NotPrivate, match="chmod 600"):
        async with running(make_config(tmp_path, gateway=gateway), tmp_path / "state.db"):
            pass


async def test_an_acknowledgement_the_store_refused_is_retried_never_the_wake(
    tmp_path: Path, hooks_gateway: HooksGateway
) -> None:
    """The gateway has the notice once it accepted the wake: when the store then refuses the
    acknowledgement, the acknowledgement is retried, and the wake is not sent again."""
    from monitor.kernel.cursors import WatchCursor
    from monitor.web.wake import HooksWaker

    cursor = WatchCursor(
        watcher=MAIN, store_path="/s", target=PEER, last_seen=0, notified=3, material=3,
        provenance="explicit",
    )  # fmt: skip

    class Ledger:
        def __init__(self) -> None:
            self.pending = [cursor]
            self.refusals = 1

        async def undelivered(self, watcher: str) -> list[WatchCursor]:
            return list(self.pending)

        async def delivered(self, accepted: list[WatchCursor]) -> None:
            if self.refusals:
                self.refusals -= 1
                raise RuntimeError("database is locked")
            self.pending = []

    gateway = hooks_gateway.config(tmp_path)
    waker = HooksWaker(gateway.hooks_url, Path(gateway.hooks_token_file), retry_s=0.1)
    ledger = Ledger()
    waker.attach(ledger)
    try:
        waker(MAIN)
        await until("the acknowledgement", lambda: not ledger.pending)
        await asyncio.sleep(0.3)
        assert [notice(PEER, 0)] == hooks_gateway.texts  # sent once
    finally:
        await waker.close()
