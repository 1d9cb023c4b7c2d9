"""Checkers that overlap: each turn is recorded once, and none is lost.

Several checkers of one link (``serve``'s tick and its early checks, a ``sessionwatch tick``,
another host on a shared store, the gateway's own monitor) each read from the marker they
loaded and settle what they found. The harness here interleaves them at the store boundary:
a checker's read happens when its check runs, and its settle (the one transaction) is held
at a gate until the order under test releases it. Prompts are appended between the steps.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.base import Adapter, Outcome, Probe
from monitor.config import Config, RootsConfig
from monitor.kernel import Kernel
from monitor.kernel.drafts import make_draft
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.recorder import Recorder
from monitor.upstream import UpstreamMonitor, links
from monitor.upstream.links import UpstreamLink
from monitor.upstream.settle import MARKER_MOVED
from tests.helpers import ManualClock, user_line

KEY = "agent:main:adopted:x"
MAIN = "agent:main:main"


class Gate:
    """An adapter that runs the real one's check at once (the read) and hands its outcome
    back only when released (so the settle waits)."""

    def __init__(self, inner: Adapter) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.read = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def check(self, probes: list[Probe]) -> list[Outcome]:
        outcomes = await self.inner.check(probes)
        self.read.set()
        await self.release.wait()
        return outcomes


class GatewayCheck:
    """The gateway's own monitor, settling as OpenClaw 2026.9.6 does: it scans from the link
    it loaded, and records only if the link's ``updated_at`` is still the one it loaded (it
    never compares markers); then, in a transaction of its own, it moves the marker and sets
    ``updated_at`` to its clock, if ``updated_at`` is still that one. Its dedupe id is the
    offset its scan ended at, which is the Claude reader's too (the interop check proves it
    against OpenClaw's checker); a second scan that ends elsewhere records a second event."""

    def __init__(self, kernel: Kernel, inner: Adapter, *, held: bool = False) -> None:
        self.kernel = kernel
        self.inner = inner
        self.read = asyncio.Event()
        self.release = asyncio.Event()
        # held: its marker write waits for ``mark`` once its record committed (``recorded``)
        self.recorded = asyncio.Event()
        self.mark = asyncio.Event()
        if not held:
            self.mark.set()

    async def tick(self) -> None:
        link = await self.kernel.read(lambda c: links.read_link(c, KEY, "main"))
        assert link is not None
        probe = Probe(session_key=KEY, ref=link.ref, marker=link.marker)
        (outcome,) = await self.inner.check([probe])
        self.read.set()
        await self.release.wait()
        assert outcome.marker is not None

        def record(r: Recorder) -> bool:
            current = links.read_link(r.conn, KEY, "main")
            if current is None or current.updated_at != link.updated_at:
                return False
            if outcome.turns:
                r(_gateway_turns(link, len(outcome.turns), str(outcome.dedupe_id), r.now))
            return True

        if not await self.kernel.commit(record):
            return
        self.recorded.set()
        await self.mark.wait()

        def advance(r: Recorder) -> None:
            r.conn.execute(
                "UPDATE session_upstream_links SET last_marker_json = ?, updated_at = ?"
                " WHERE session_key = ? AND agent_id = ? AND updated_at = ?",
                (json.dumps(outcome.marker), r.now, KEY, "main", link.updated_at),
            )

        await self.kernel.commit(advance)


def _gateway_turns(link: UpstreamLink, turns: int, dedupe_id: str, now: int) -> Any:
    return make_draft(
        session_key=KEY,
        agent_id="main",
        kind=EventKind.HUMAN_DIRECT_MESSAGE,
        actor_type=ActorType.HUMAN,
        now=now,
        summary="human message via claude",
        payload={"turns": turns} if turns > 1 else None,
        dedupe_key=f"upstream:{KEY}:{link.source_key}:{dedupe_id}",
    )


@dataclass
class Rig:
    kernel: Kernel
    config: Config
    path: Path
    typed: int = 0

    def checker(self) -> tuple[UpstreamMonitor, Gate]:
        """A checker of its own, as another process would be."""
        plain = UpstreamMonitor.from_config(self.kernel, self.config)
        gate = Gate(plain.adapters["claude"])
        adapters = {**plain.adapters, "claude": gate}
        return UpstreamMonitor(self.kernel, adapters, plain.ticker.settings), gate

    def gateway(self, *, held: bool = False) -> GatewayCheck:
        plain = UpstreamMonitor.from_config(self.kernel, self.config)
        return GatewayCheck(self.kernel, plain.adapters["claude"], held=held)

    def type_prompt(self) -> None:
        self.typed += 1
        with self.path.open("ab") as f:
            f.write(user_line(f"prompt {self.typed}", f"u{self.typed}"))

    def answer(self) -> None:
        """The agent's reply to the last prompt: bytes that are no one's turn."""
        reply = {"type": "assistant", "message": {"role": "assistant", "content": "on it"}}
        with self.path.open("ab") as f:
            f.write(json.dumps(reply).encode() + b"\n")

    async def turns(self) -> int:
        status = await self.kernel.status(KEY, changes_since=0)
        assert status.state_changes is not None
        return sum(
            int((e.payload or {}).get("turns", 1))
            for e in status.state_changes.events
            if e.kind == "human_direct_message"
        )


async def rig(kernel: Kernel, roots: RootsConfig) -> Rig:
    path = Path(roots.claude) / "s.jsonl"
    path.write_bytes(b"")
    config = Config(roots=roots)
    monitor = UpstreamMonitor.from_config(kernel, config)
    await monitor.adoption.adopt(kind="claude", path=str(path), session_key=KEY, session_id="s1")
    assert await kernel.watch(watcher=MAIN, target=KEY)
    return Rig(kernel, config, path)


async def test_two_checks_from_one_marker_record_two_prompts_as_two(
    kernel: Kernel, roots: RootsConfig
) -> None:
    """Prompt A, a check starts (and reads A); prompt B, a second check reads A and B and
    settles first. The first check's findings are refused (the marker moved), so A is not
    counted twice, and it checks again from the new marker: nothing is left."""
    r = await rig(kernel, roots)
    first, first_gate = r.checker()
    second, second_gate = r.checker()
    r.type_prompt()
    slow = asyncio.ensure_future(first.ticker.tick())
    await first_gate.read.wait()
    r.type_prompt()
    second_gate.release.set()
    assert [("activity", 2)] == [(x.outcome, x.turns) for x in await second.ticker.tick()]
    first_gate.release.set()
    assert [("quiet", 0)] == [(x.outcome, x.turns) for x in await slow]
    assert 2 == await r.turns()
    assert 1 == len(await kernel.notices(watcher=MAIN))


async def test_a_check_that_keeps_losing_the_race_says_why(
    kernel: Kernel, roots: RootsConfig
) -> None:
    """A checker whose every round is overtaken stops after its re-checks, writes nothing,
    and says why; the next tick reads on."""
    r = await rig(kernel, roots)
    loser, gate = r.checker()
    gate.release.set()
    original = gate.check

    async def overtaken(probes: list[Probe]) -> list[Outcome]:
        r.type_prompt()
        outcomes = await original(probes)  # reads the prompt, and so does the winner:
        winner, winner_gate = r.checker()
        winner_gate.release.set()
        await winner.ticker.tick()
        return outcomes

    gate.check = overtaken  # type: ignore[method-assign]
    results = await loser.ticker.tick()
    assert [("skipped", MARKER_MOVED)] == [(x.outcome, x.reason) for x in results]
    assert r.typed == await r.turns()


async def test_the_gateways_check_from_the_old_marker_records_nothing_once_we_have(
    kernel: Kernel, roots: RootsConfig
) -> None:
    """What a real gateway did in CI: its one-minute check read a prompt; the agent's reply
    was appended; the sidecar read both and recorded the prompt at the new end; the
    gateway's check then settled. Its dedupe id (the end it read) is not ours, and it
    compares ``updated_at`` only: the sidecar's marker moves ``updated_at``, so the gateway's
    check records nothing."""
    r = await rig(kernel, roots)
    gateway = r.gateway()
    r.type_prompt()
    slow = asyncio.ensure_future(gateway.tick())
    await gateway.read.wait()
    r.answer()
    ours, gate = r.checker()
    gate.release.set()
    assert [("activity", 1)] == [(x.outcome, x.turns) for x in await ours.ticker.tick()]
    gateway.release.set()
    await slow
    assert 1 == await r.turns()


async def test_our_check_from_before_the_gateways_marker_reads_on_from_it(
    kernel: Kernel, roots: RootsConfig
) -> None:
    """The other way round: the gateway records the prompt and moves the marker while a
    check of ours that read the same prompt waits to settle. Ours records nothing, and
    reads again from the gateway's marker: the prompt typed since is recorded, once."""
    r = await rig(kernel, roots)
    gateway = r.gateway()
    gateway.release.set()
    ours, gate = r.checker()
    r.type_prompt()
    slow = asyncio.ensure_future(ours.ticker.tick())
    await gate.read.wait()
    await gateway.tick()
    r.answer()
    r.type_prompt()
    gate.release.set()
    assert [("activity", 1)] == [(x.outcome, x.turns) for x in await slow]
    assert 2 == await r.turns()


async def test_a_check_between_the_gateways_record_and_its_marker_records_nothing_again(
    kernel: Kernel, roots: RootsConfig
) -> None:
    """The gateway's own window: its monitor recorded the prompt (dedupe id: the end of its
    read) and has not moved the marker yet; the agent's reply is appended; a check of ours
    reads from the unmoved marker, past the gateway's end. Its event beyond our marker
    says a settle is in flight: the prompt is the gateway's, so ours records nothing and
    moves the marker on; the gateway's marker write then changes nothing. A prompt typed
    after the gateway's end is still ours to record."""
    r = await rig(kernel, roots)
    gateway = r.gateway(held=True)
    gateway.release.set()
    r.type_prompt()
    held = asyncio.ensure_future(gateway.tick())
    await gateway.recorded.wait()
    r.answer()
    r.type_prompt()
    ours, gate = r.checker()
    gate.release.set()
    assert [("activity", 1)] == [(x.outcome, x.turns) for x in await ours.ticker.tick()]
    gateway.mark.set()
    await held
    assert 2 == await r.turns()
    last, gate = r.checker()
    gate.release.set()
    assert [("quiet", 0)] == [(x.outcome, x.turns) for x in await last.ticker.tick()]
    assert 2 == await r.turns()


def orders(n: int, gateway: bool = False) -> st.SearchStrategy[list[tuple[str, int]]]:
    """Interleavings of ``n`` checkers' starts and releases, with prompts between: each
    checker starts before it is released. With ``gateway``, checker 0 is the gateway's
    monitor, whose marker write (``mark``) is a step of its own after its record."""

    @st.composite
    def build(draw: st.DrawFn) -> list[tuple[str, int]]:
        started: list[int] = []
        released: set[int] = set()
        marked = not gateway
        steps: list[tuple[str, int]] = []
        while len(released) < n or not marked:
            choices: list[tuple[str, int]] = [("type", 0), ("answer", 0)]
            if len(started) < n:
                choices.append(("start", len(started)))
            choices += [("release", i) for i in started if i not in released]
            if 0 in released and not marked:
                choices.append(("mark", 0))
            step = draw(st.sampled_from(choices))
            if step[0] == "start":
                started.append(step[1])
            elif step[0] == "release":
                released.add(step[1])
            elif step[0] == "mark":
                marked = True
            steps.append(step)
            if len(steps) > 30:  # finish: start and release the rest
                steps += [("start", i) for i in range(len(started), n)]
                steps += [("release", i) for i in range(n) if i not in released]
                steps += [] if marked else [("mark", 0)]
                break
        return steps

    return build()


async def interleaved(
    tmp: Path, steps: Iterable[tuple[str, int]], n: int, gateway: bool = False
) -> tuple[int, int]:
    roots = RootsConfig(claude=str(tmp / "claude"))
    Path(roots.claude).mkdir(parents=True)
    kernel = await Kernel.open(tmp / "state.db", clock=ManualClock())
    try:
        r = await rig(kernel, roots)
        checkers: list[tuple[Any, Gate | GatewayCheck]] = [
            (m.ticker, g) for m, g in (r.checker() for _ in range(n))
        ]
        if gateway:  # the first checker is the gateway's monitor
            check = r.gateway(held=True)
            checkers[0] = (check, check)
        running: dict[int, asyncio.Future[Any]] = {}
        for what, i in steps:
            if what == "type":
                r.type_prompt()
            elif what == "answer":
                r.answer()
            elif what == "start":
                ticker, gate = checkers[i]
                running[i] = asyncio.ensure_future(ticker.tick())
                await gate.read.wait()
            elif what == "release":
                checkers[i][1].release.set()
                if gateway and i == 0:  # until its record committed, or it recorded nothing
                    recorded = asyncio.ensure_future(check.recorded.wait())
                    await asyncio.wait([recorded, running[i]], return_when="FIRST_COMPLETED")
                    recorded.cancel()
                else:
                    await running[i]
            else:  # the gateway's marker write
                check.mark.set()
                await running[i]
        last, gate = r.checker()  # a last check reads what is left
        gate.release.set()
        await last.ticker.tick()
        return r.typed, await r.turns()
    finally:
        await kernel.close()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), n=st.integers(min_value=2, max_value=4), gateway=st.booleans())
def test_any_interleaving_of_checkers_records_each_prompt_once(
    tmp_path_factory: Any, data: st.DataObject, n: int, gateway: bool
) -> None:
    """Whatever the order of reads, prompts, replies and settles, the turns recorded are
    the prompts typed: none twice, none lost; with the gateway's monitor among the
    checkers or not."""
    steps = data.draw(orders(n, gateway))
    tmp = tmp_path_factory.mktemp("interleaved")
    typed, recorded = asyncio.run(interleaved(tmp, steps, n, gateway))
    assert typed == recorded
