"""Several writers at once on one store (three kernels: three sidecars, on PostgreSQL as on
several hosts): sequences stay global and increasing, a reader following ``changesSince``
sees every event exactly once and in order, heads equal the last sequence, and a watcher
gets one notice per target, as with one writer."""

from __future__ import annotations

import asyncio

from monitor.kernel import Kernel, NewEvent
from monitor.kernel.events import ActorType, EventKind
from monitor.web import wire
from tests.helpers import KernelFactory, notice

MAIN = "agent:main:main"
TARGETS = ["agent:main:subagent:t1", "agent:main:subagent:t2"]
PER_WRITER = 30


async def _write(kernel: Kernel, writer: int) -> None:
    for i in range(PER_WRITER):
        event = NewEvent(
            session_key=TARGETS[i % 2],
            kind=EventKind.GOAL_CHANGED,
            actor_type=ActorType.AGENT,
            dedupe_key=f"w{writer}:{i}",
        )
        await kernel.record(event)


async def _follow(kernel: Kernel, target: str, seen: list[int], done: asyncio.Event) -> None:
    since = 0
    while True:
        finished = done.is_set()
        status = wire.status(await kernel.status(target, changes_since=since))
        events = status["stateChanges"]["events"]
        seen += [e["sequence"] for e in events]
        if events:
            since = events[-1]["sequence"]
        if finished and not status["stateChanges"]["truncated"]:
            return
        await asyncio.sleep(0)


async def test_concurrent_writers_keep_every_guarantee(open_kernel: KernelFactory) -> None:
    writers: list[Kernel] = [await open_kernel() for _ in range(3)]
    reader: Kernel = await open_kernel()
    for target in TARGETS:
        assert await reader.watch(watcher=MAIN, target=target)
    done = asyncio.Event()
    seen: dict[str, list[int]] = {t: [] for t in TARGETS}
    followers = [asyncio.ensure_future(_follow(reader, t, seen[t], done)) for t in TARGETS]
    await asyncio.gather(*(_write(k, n) for n, k in enumerate(writers)))
    done.set()
    await asyncio.gather(*followers)

    every: list[int] = []
    for target in TARGETS:
        status = wire.status(await reader.status(target, changes_since=0))
        logged = [e["sequence"] for e in status["stateChanges"]["events"]]
        assert logged == sorted(set(logged))  # increasing, no duplicates
        assert seen[target] == logged  # the follower saw each once, in order, no gap
        assert status["stateVersion"] == logged[-1]  # the head is the last sequence
        every += logged
    assert len(every) == 3 * PER_WRITER == len(set(every))
    pending = {n.target: n.text for n in await reader.notices(watcher=MAIN)}
    assert {t: notice(t, 0) for t in TARGETS} == pending  # one notice per target
