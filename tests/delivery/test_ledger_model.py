"""A model test of the wake ledger: one to three sidecars on one store, a gateway that is
slow, fails, is down or answers too late, crashes of any sidecar at any step, drains and new
turns, interleaved as hypothesis chooses, on SQLite and on PostgreSQL.

Every gateway call is held until the test answers it, so a call is in flight while the
other steps run (a slow gateway is one whose answer comes several steps later, or never:
the client's read timeout, on the test's clock, ends it unanswered, as the real one does).
Checked:

- a call carries a notice that is pending at the moment it goes (never one acknowledged or
  drained);
- a queue-only watcher (a sub-agent) is never woken;
- the wakes of one watcher begin at least a window apart (a pass's later calls, the
  notices that folded into its window, go one after another: each carries, as the
  window's start, the end of the call before it);
- one notice reaches the gateway at most once more than the calls of it that went
  unanswered or were cut by a crash, and never more than twice;
- once the gateway takes wakes again and time passes, every notice the policy wakes has
  been woken: nothing is pending for the woken watcher.

Several sidecars on one SQLite file never happens in service (one ``serve`` per database),
so there the stores are told they are shared, as PostgreSQL's are; the ledger's logic is
the same SQL on both."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor.delivery.hooks import HooksClient
from monitor.delivery.ledger import Delivery
from monitor.delivery.transport import READ_S, CallFailed, Ready, Reply
from monitor.errors import StoreError
from monitor.kernel import Kernel, NewEvent
from monitor.kernel.commits import Commits
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.notices import notice_text
from monitor.kernel.store import open_store
from monitor.kernel.store.protocol import StateStore
from tests.helpers import ManualClock, ManualTimers, pg_database
from tests.hooks_gateway import TOKEN

MAIN = "agent:main:main"
SUB = "agent:main:subagent:helper"  # a sub-agent watcher: queue-only
TARGETS = ("agent:main:dashboard:a", "agent:main:dashboard:b")
WINDOW_MS = 20_000


class Mortal:
    """A sidecar's store: a crash makes it refuse every write from then on (a dead process
    writes nothing, and runs no ``finally``)."""

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self.dead = False
        self.shared = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def write(self, fn: Any, **kw: Any) -> Any:
        if self.dead:
            raise StoreError("this sidecar crashed")
        return await self._store.write(fn, **kw)


@dataclass
class Call:
    sidecar: int
    watcher: str
    text: str
    woken_at: int  # the window's start, as the store had it when the call went
    answer: asyncio.Future[str]
    outcome: str = ""  # accepted | failed | down | late | cut
    ended: int | None = None  # when its caller had the outcome (the test's clock, ms)


@dataclass
class Gateway:
    """Holds each call until the test answers it; checks what each carries as it goes."""

    observer: Kernel
    timers: ManualTimers
    calls: list[Call] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    # each drained notice's text, with the count of drains that had returned once it was
    drained: dict[str, int] = field(default_factory=dict)
    drains: int = 0

    def transport(self, sidecar: int) -> Any:
        gateway = self

        class Transport:
            async def post(
                self, url: str, body: bytes, headers: Mapping[str, str], ready: Ready | None = None
            ) -> Reply | None:
                # the drains that had returned before the ledger's last look at the notice
                # (its hold, in ready()): a drain that returns later may have committed
                # after that look, while the call was already on its way
                drains = gateway.drains
                if ready is not None and not await ready():
                    return None  # connected, then withdrawn: nothing written
                return await gateway.post(sidecar, orjson.loads(body), drains)

            async def close(self) -> None:
                pass

        return Transport()

    async def post(self, sidecar: int, body: dict[str, Any], drains: int) -> Reply:
        watcher, text = body["sessionKey"], body["text"]
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        # the client's timeout, on the test's clock, from when the call went (not from when
        # this stand-in has read the store): unanswered by then, it gave up
        self.timers.call_later(READ_S, lambda: answer.done() or answer.set_result("late"))
        pending, woken_at = await self.observer.store.peek(
            lambda conn: (
                [
                    notice_text(t, int(seen))
                    for t, seen in conn.execute(
                        "SELECT target_session_key, last_seen_sequence FROM session_watch_cursors"
                        " WHERE watcher_session_key = ? AND material_sequence > last_seen_sequence",
                        (watcher,),
                    )
                ],
                conn.execute(
                    "SELECT woken_at FROM sessionwatch_wakes WHERE watcher_session_key = ?",
                    (watcher,),
                ).fetchone()[0],
            )
        )
        # not pending when this stand-in read the store: a violation unless a drain that
        # returned only after the ledger's hold began took it (a drain that overlaps the
        # hold or the call in flight is not a drain before it; the store is read a moment
        # after the call)
        if text not in pending and self.drained.get(text, 0) <= drains:
            self.violations.append(f"woken when not pending: {text}")
        if watcher == SUB:
            self.violations.append("a queue-only watcher was woken")
        call = Call(sidecar, watcher, text, int(woken_at), answer)
        answer.add_done_callback(lambda _: setattr(call, "ended", self.timers.clock()))
        self.calls.append(call)
        try:
            outcome = await call.answer
        except asyncio.CancelledError:
            call.outcome = call.outcome or "cut"
            raise
        call.outcome = outcome
        if outcome == "accepted":
            return Reply(200, b'{"ok":true,"eventOutcome":"queued"}')
        if outcome == "failed":
            return Reply(503, b'{"ok":false,"error":"unavailable"}')
        if outcome == "down":
            raise CallFailed("connection refused")
        raise CallFailed("no answer in time", maybe_taken=True)  # late: it was taken

    def in_flight(self) -> list[Call]:
        return [c for c in self.calls if not c.answer.done()]


@dataclass
class Sidecar:
    store: Mortal
    kernel: Kernel
    delivery: Delivery
    client: HooksClient


async def quiet() -> None:
    """Let every task and every store write that is ready run (the writer thread too)."""
    for _ in range(4):
        for _ in range(20):
            await asyncio.sleep(0)
        await asyncio.sleep(0.002)


STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("turn"), st.integers(0, 2), st.integers(0, 1)),
        st.tuples(st.just("drain"), st.sampled_from([MAIN, SUB])),
        st.tuples(st.just("answer"), st.sampled_from(["accepted", "failed", "down", "late"])),
        st.tuples(st.just("look"), st.integers(0, 2)),
        st.tuples(st.just("advance"), st.sampled_from([500, 1_500, 20_000, 31_000])),
        st.tuples(st.just("crash"), st.integers(0, 2)),
    ),
    min_size=1,
    max_size=30,
)


class Model:
    def __init__(self, target: Path | str, sidecars: int, tmp: Path) -> None:
        self.target = target
        self.count = sidecars
        self.clock = ManualClock()
        self.timers = ManualTimers(self.clock)
        self.token = tmp / "hooks-token"
        self.token.write_text(TOKEN + "\n")
        self.token.chmod(0o600)
        self.sidecars: list[Sidecar] = []
        self.cut: Counter[str] = Counter()

    async def open(self) -> None:
        self.observer = await Kernel.open(self.target, clock=self.clock)
        self.gateway = Gateway(self.observer, self.timers)
        for watcher in (MAIN, SUB):
            for t in TARGETS:
                await self.observer.watch(watcher=watcher, target=t)
        for i in range(self.count):
            self.sidecars.append(await self.start(i))

    async def start(self, i: int) -> Sidecar:
        store = Mortal(await open_store(self.target, clock=self.clock))
        self.timers.stores.append(store._store)
        kernel = await Kernel.on_store(store._store)
        client = HooksClient(
            "http://gateway.invalid/hooks",
            self.token,
            timers=self.timers,
            transport=self.gateway.transport(i),
            retry_s=30.0,
        )
        holder = f"sidecar-{i}-{id(store)}"
        commits = Commits(store, kernel.policy, kernel.bus)  # type: ignore[arg-type]
        delivery = Delivery(
            kernel, client, timers=self.timers, holder=holder, others=False, commits=commits
        )
        await delivery.start(contextlib.AsyncExitStack(), kernel.bus)
        return Sidecar(store, kernel, delivery, client)

    async def crash(self, i: int) -> None:
        old = self.sidecars[i]
        old.store.dead = True
        # cut: its calls in flight, and those answered whose outcome it had not recorded
        holder = old.delivery.holder
        sending = await self.observer.store.peek(
            lambda conn: [
                notice_text(t, int(seen))
                for t, seen in conn.execute(
                    "SELECT o.target_session_key, o.last_seen_sequence FROM"
                    " sessionwatch_notice_outbox o JOIN sessionwatch_wakes w ON"
                    " w.watcher_session_key = o.watcher_session_key WHERE o.state = 'sending'"
                    " AND w.holder = ?",
                    (holder,),
                )
            ]
        )
        for call in self.gateway.in_flight():
            if call.sidecar == i and call.text not in sending:
                self.cut[call.text] += 1
        self.cut.update(sending)
        await old.delivery.close()
        await old.kernel.close()
        self.sidecars[i] = await self.start(i)

    async def step(self, step: tuple[Any, ...]) -> None:
        kind = step[0]
        if kind == "turn":
            who = self.sidecars[step[2] % self.count]
            target = TARGETS[step[1] % len(TARGETS)]
            await who.kernel.record(
                NewEvent(
                    session_key=target,
                    kind=EventKind.HUMAN_DIRECT_MESSAGE,
                    actor_type=ActorType.HUMAN,
                )
            )
        elif kind == "drain":
            got = await self.observer.inbox(watcher=step[1], drain=True)
            self.gateway.drains += 1
            for n in got.notices:
                self.gateway.drained[n.text] = self.gateway.drains
        elif kind == "answer":
            flying = self.gateway.in_flight()
            if flying:
                flying[0].answer.set_result(step[1])
        elif kind == "look":
            self.sidecars[step[1] % self.count].delivery.look()
        elif kind == "advance":
            await self.timers.advance(step[1])
        elif kind == "crash":
            await self.crash(step[1] % self.count)
        await quiet()

    async def heal(self) -> None:
        """The gateway takes every wake from now on, and time passes: until nothing the
        policy wakes is pending and no call is in flight (a dozen rounds of 31 s are enough
        in logic; a loaded machine's slower store writes get more rounds, not a failure)."""
        for n in range(60):
            for s in self.sidecars:
                s.delivery.look()
            await self.answer_all()
            await self.timers.advance(31_000)
            await quiet()
            if n >= 12 and not self.gateway.in_flight() and not await self.pending():
                return

    async def pending(self) -> list[Any]:
        return list(await self.observer.notices(watcher=MAIN))

    async def answer_all(self) -> None:
        """Accept every call, and the calls that follow them, before time moves on (no
        call outlives the client's timeout)."""
        await quiet()
        while flying := self.gateway.in_flight():
            for call in flying:
                call.answer.set_result("accepted")
            await quiet()

    def check(self) -> None:
        assert [] == self.gateway.violations
        self.check_windows()
        taken: Counter[str] = Counter()
        uncertain: Counter[str] = Counter(self.cut)
        for c in self.gateway.calls:
            if c.outcome in ("accepted", "late", "cut"):
                taken[c.text] += 1
            if c.outcome == "late":
                uncertain[c.text] += 1
        for text, n in taken.items():
            assert n <= 2, (text, n)
            assert n <= 1 + uncertain[text], (text, n, uncertain[text])

    def check_windows(self) -> None:
        """Per watcher, each window's start is a window after the one before, or the end of
        a call before it (a later call of one pass, or the same call's end restarting it).
        That a pass's first call also goes a window after the end of every call before it
        is checked on a deterministic rig (test_delivery.py): here the test's clock jumps
        past a lease while a call is in flight, which a real process cannot see happen."""
        by_watcher: dict[str, list[Call]] = {}
        for c in self.gateway.calls:
            by_watcher.setdefault(c.watcher, []).append(c)
        for watcher, calls in by_watcher.items():
            ends = {c.ended for c in calls if c.ended is not None}
            starts = sorted({c.woken_at for c in calls})
            for a, b in itertools.pairwise(starts):
                assert b - a >= WINDOW_MS or b in ends, (watcher, starts, sorted(ends))

    async def check_live(self) -> None:
        assert [] == await self.pending(), "a notice the policy wakes was never woken"

    async def close(self) -> None:
        for s in self.sidecars:
            await s.delivery.close()
            await s.kernel.close()
        await self.observer.close()


async def run_model(target: Path | str, sidecars: int, steps: list[Any], tmp: Path) -> None:
    model = Model(target, sidecars, tmp)
    await model.open()
    try:
        for step in steps:
            await model.step(step)
            model.check()
        await model.heal()
        model.check()
        await model.check_live()
    finally:
        await model.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_wake_ledger_holds_its_promises_under_any_interleaving(
    backend: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> None:
    pg = request.getfixturevalue("pg_server") if backend == "postgresql" else None

    @settings(
        max_examples=25 if backend == "sqlite" else 12,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        database=None,
    )
    @given(sidecars=st.integers(1, 3), steps=STEPS)
    def run(sidecars: int, steps: list[Any]) -> None:
        tmp = tmp_path_factory.mktemp("ledger")
        target: Path | str = tmp / "state.db" if pg is None else pg_database(pg)
        asyncio.run(run_model(target, sidecars, steps, tmp))

    run()
