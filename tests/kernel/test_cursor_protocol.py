"""A hypothesis state machine of the cursor protocol against a plain model.

Random interleavings of record, watch, drain, reset, delete, prune (with the clock moved)
and restart (a new kernel on the same file). Checked after every step: the notices are
exactly the model's (so never two pending for a pair and never a lost change), and
``historyGap`` is true exactly when the session's rows were pruned.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from monitor.clock import DAY_MS, HOUR_MS
from monitor.kernel import Kernel, NewEvent
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.retention import CURSOR_IDLE_MS, RETENTION_MS
from monitor.web import wire
from tests.helpers import T0, ManualClock, notice

SESSIONS = ["agent:main:main", "agent:main:subagent:a", "agent:ops:main"]
KINDS = [EventKind.HUMAN_DIRECT_MESSAGE, EventKind.GOAL_CHANGED, EventKind.RUN_COMPLETED]


@dataclass
class ModelCursor:
    last_seen: int
    notified: int
    material: int
    updated_at: int


class Model:
    """The protocol of docs/specification.md section 6, written as plainly as possible."""

    def __init__(self) -> None:
        self.seq = 0
        self.events: dict[str, list[tuple[int, int]]] = {}  # session -> (sequence, at)
        self.head: dict[str, int] = {}
        self.pruned: dict[str, int] = {}
        self.cursors: dict[tuple[str, str], ModelCursor] = {}
        self.last_prune = 0

    def record(self, target: str, actor: str | None, notifies: bool, now: int) -> None:
        self.seq += 1
        self.events.setdefault(target, []).append((self.seq, now))
        self.head[target] = self.seq
        if not notifies:
            return
        for (w, t), c in self.cursors.items():
            if t == target and w != actor and c.material < self.seq:
                if c.notified <= c.last_seen:
                    c.notified = self.seq
                c.material = self.seq
                c.updated_at = now

    def prune(self, now: int) -> None:
        for session, rows in self.events.items():
            doomed = [s for s, at in rows if at < now - RETENTION_MS]
            if doomed:
                self.pruned[session] = max(self.pruned.get(session, 0), max(doomed))
            self.events[session] = [(s, at) for s, at in rows if at >= now - RETENTION_MS]
        self.cursors = {
            k: c for k, c in self.cursors.items() if c.updated_at >= now - CURSOR_IDLE_MS
        }
        self.last_prune = now

    def pending(self, watcher: str) -> list[str]:
        return [
            notice(t, c.last_seen)
            for (w, t), c in sorted(self.cursors.items())
            if w == watcher and c.material > c.last_seen
        ]

    def drain(self, watcher: str, now: int) -> list[str]:
        out = self.pending(watcher)
        for (w, _), c in self.cursors.items():
            if w == watcher and c.material > c.last_seen:
                seen = c.notified if c.notified > c.last_seen else c.material
                c.last_seen, c.notified, c.updated_at = seen, max(c.material, seen), now
        return out


class CursorProtocol(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name) / "state.db"
        self.clock = ManualClock(T0)
        self.model = Model()
        self.kernel = self.run(Kernel.open(self.path, clock=self.clock))

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.kernel.close())
        self.loop.close()
        self.dir.cleanup()

    def _maybe_auto_prune(self) -> None:
        if self.clock.now >= self.model.last_prune + HOUR_MS:
            self.model.prune(self.clock.now)

    @rule(
        session=st.sampled_from(SESSIONS),
        actor=st.sampled_from([None, *SESSIONS]),
        kind=st.sampled_from(KINDS),
    )
    def record(self, session: str, actor: str | None, kind: EventKind) -> None:
        target = session
        self.run(
            self.kernel.record(
                NewEvent(
                    session_key=target,
                    kind=kind,
                    actor_type=ActorType.AGENT if actor else ActorType.HUMAN,
                    actor_id=actor,
                )
            )
        )
        self.model.record(target, actor, kind is not EventKind.RUN_COMPLETED, self.clock.now)
        self._maybe_auto_prune()

    @rule(watcher=st.sampled_from(SESSIONS), watched=st.sampled_from(SESSIONS))
    def watch(self, watcher: str, watched: str) -> None:
        target = watched
        ok = self.run(self.kernel.watch(watcher=watcher, target=target))
        assert ok == (watcher != target)
        if ok:
            head = self.model.head.get(target, 0)
            cursor = self.model.cursors.get((watcher, target))
            if cursor is None:
                self.model.cursors[(watcher, target)] = ModelCursor(
                    head, head, head, self.clock.now
                )
            # Re-registering keeps the cursor as it is, ``updated_at`` included
            # (docs/specification.md, and OpenClaw's own register): it does not hold off
            # the 30-day idle expiry.

    @rule(watcher=st.sampled_from(SESSIONS))
    def drain(self, watcher: str) -> None:
        got = self.run(self.kernel.notices(watcher=watcher, drain=True))
        assert self.model.drain(watcher, self.clock.now) == [n.text for n in got]

    @rule(watcher=st.sampled_from(SESSIONS))
    def reset(self, watcher: str) -> None:
        self.run(self.kernel.gateway_sessions.reset(watcher))
        self.model.cursors = {k: c for k, c in self.model.cursors.items() if k[0] != watcher}

    @rule(session=st.sampled_from(SESSIONS))
    def delete(self, session: str) -> None:
        self.run(self.kernel.gateway_sessions.delete(session))
        self.model.cursors = {k: c for k, c in self.model.cursors.items() if session not in k}
        self.model.events.pop(session, None)
        self.model.head.pop(session, None)
        self.model.pruned.pop(session, None)

    @rule(days=st.sampled_from([1, 12, 31]))
    def prune_later(self, days: int) -> None:
        self.clock.advance(days * DAY_MS)
        self.run(self.kernel.retention.prune())
        self.model.prune(self.clock.now)

    @rule()
    def restart(self) -> None:
        self.run(self.kernel.close())
        self.kernel = self.run(Kernel.open(self.path, clock=self.clock))
        self.run(self.kernel.sweep())

    @invariant()
    def notices_match_the_model(self) -> None:
        for watcher in SESSIONS:
            got = self.run(self.kernel.notices(watcher=watcher))
            assert self.model.pending(watcher) == [n.text for n in got]

    @invariant()
    def history_gap_is_exact(self) -> None:
        for session in SESSIONS:
            pruned = self.model.pruned.get(session, 0)
            for since in {0, max(pruned - 1, 0), pruned, self.model.head.get(session, 0)}:
                status = wire.status(self.run(self.kernel.status(session, changes_since=since)))
                assert self.model.head.get(session, 0) == status["stateVersion"]
                assert (since < pruned) == status["stateChanges"]["historyGap"]


CursorProtocol.TestCase.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
TestCursorProtocol = CursorProtocol.TestCase
