"""Whoever adds a watch (a watch call, a spawn, a group's ambient watch) or removes one (a
reset, a deletion), the kernel says so on its change stream once it committed: file watching
re-arms from that one change, not from the API."""

from __future__ import annotations

from monitor.kernel import Kernel, NewEvent
from monitor.kernel.bus import WatchesChanged
from monitor.kernel.events import ActorType, EventKind
from tests.helpers import KernelFactory

MAIN = "agent:main:main"
CHILD = "agent:main:subagent:c1"
GROUP = "agent:main:telegram:group:room-1"


async def test_every_way_of_watching_says_so_once_committed(open_kernel: KernelFactory) -> None:
    said: list[str] = []
    kernel: Kernel = await open_kernel()
    kernel.bus.subscribe(WatchesChanged, lambda _: said.append("changed"))

    assert await kernel.watch(watcher=MAIN, target=CHILD)
    assert 1 == len(said)
    await kernel.spawn(parent=MAIN, child="agent:main:subagent:c2", run_id="r1")
    assert 2 == len(said)
    human = NewEvent(
        session_key=GROUP, kind=EventKind.HUMAN_DIRECT_MESSAGE, actor_type=ActorType.HUMAN
    )
    await kernel.record(human)  # the group's human turn: main watches the group ambiently
    assert 3 == len(said)
    await kernel.gateway_sessions.reset(MAIN)
    await kernel.gateway_sessions.delete(CHILD)
    assert 5 == len(said)


async def test_recording_that_watches_nothing_says_nothing(open_kernel: KernelFactory) -> None:
    said: list[str] = []
    kernel: Kernel = await open_kernel()
    kernel.bus.subscribe(WatchesChanged, lambda _: said.append("changed"))
    done = NewEvent(
        session_key=CHILD, kind=EventKind.RUN_COMPLETED, actor_type=ActorType.AGENT, run_id="r"
    )
    await kernel.record(done)
    assert not await kernel.watch(watcher=MAIN, target=MAIN)  # a session cannot watch itself
    assert [] == said
