"""The change hub: one watcher of the store per process, however many wait on it, and no
change lost between a waiter's read and its wait. On both stores, with the change made by
another process's kernel, as a CLI command or another sidecar makes it."""

from __future__ import annotations

import asyncio

from monitor.kernel import Kernel
from monitor.kernel.changes import StoreMoved
from tests.helpers import KernelFactory, human, until

KEY = "agent:main:subagent:c1"


async def test_every_waiter_hears_a_change_another_process_made_from_one_watcher(
    open_kernel: KernelFactory,
) -> None:
    kernel: Kernel = await open_kernel()
    other: Kernel = await open_kernel()
    hub = kernel.changes
    seen = hub.mark()
    waiters = [asyncio.ensure_future(hub.after(seen, 30)) for _ in range(50)]
    await asyncio.sleep(0)
    await human(other, KEY)
    heard = await asyncio.wait_for(asyncio.gather(*waiters), 30)
    assert all(count > seen for count in heard)
    assert [hub._task] == [t for t in asyncio.all_tasks() if t is hub._task]  # one watcher


async def test_a_change_between_the_mark_and_the_wait_is_not_lost(
    open_kernel: KernelFactory,
) -> None:
    kernel: Kernel = await open_kernel()
    other: Kernel = await open_kernel()
    seen = kernel.changes.mark()  # before reading what the change would alter
    await human(other, KEY)  # the change lands before anyone waits
    await until("the change heard", lambda: kernel.changes.mark() != seen)
    assert await kernel.changes.after(seen, 30) > seen  # returns at once


async def test_a_stop_ends_a_wait_at_once(open_kernel: KernelFactory) -> None:
    kernel: Kernel = await open_kernel()
    stopping = asyncio.Event()
    seen = kernel.changes.mark()
    wait = asyncio.ensure_future(kernel.changes.after(seen, 3600, unless=stopping))
    await asyncio.sleep(0)
    stopping.set()
    assert seen == await asyncio.wait_for(wait, 30)


async def test_the_watcher_ends_with_the_kernel(open_kernel: KernelFactory) -> None:
    kernel: Kernel = await open_kernel()
    kernel.changes.mark()
    task = kernel.changes._task
    assert task is not None
    await kernel.close()
    assert task.done()


async def test_an_event_this_process_recorded_re_reads_nothing(open_kernel: KernelFactory) -> None:
    """``StoreMoved`` is another process's commit, and only that: after one event recorded
    here, the hub looks (the database was written) and publishes nothing, so no part
    re-reads (delivery its pending notices, file watching its links); the waiters were
    told. Commits of another process before and after it are one move each. The other
    kernel opens first: PostgreSQL's notices of its opening went out before this kernel
    listened, so none arrives late and is counted as ours."""
    other: Kernel = await open_kernel()
    kernel: Kernel = await open_kernel()
    moved: list[StoreMoved] = []
    kernel.stream.subscribe(StoreMoved, moved.append)
    kernel.changes.mark()
    await human(other, "agent:main:subagent:before")
    await until("the other process's first commit heard", lambda: moved)
    moved.clear()
    seen, looks = kernel.changes.mark(), kernel.changes.looks
    await human(kernel, KEY)
    assert kernel.changes.mark() > seen  # the waiters are told at once
    if kernel.store.watches_changes:  # SQLite: the hub wakes on the write, and looks
        await until("the hub looked", lambda: kernel.changes.looks > looks)
    await human(other, KEY)
    await until("the other process's second commit heard", lambda: moved)
    # On PostgreSQL a notice of the other's first commit may still be on its way when the
    # list is cleared (seen under a loaded suite: one more move), so the count is SQLite's
    # to check; that PostgreSQL skips this store's own notices, test_store_contract checks.
    if kernel.store.watches_changes:
        assert 1 == len(moved)


async def test_this_processes_writes_without_an_event_tell_the_readers(
    open_kernel: KernelFactory,
) -> None:
    """A watch, a drain, a reset: no event is recorded, and the readers (the notice
    stream, the status page) are told at once all the same, never at a keep-alive."""
    kernel: Kernel = await open_kernel()
    from monitor.kernel.gateway_sessions import GatewaySessions

    steps = [
        lambda: kernel.watch(watcher="agent:main:main", target=KEY),
        lambda: kernel.inbox(watcher="agent:main:main", drain=True),
        lambda: GatewaySessions(kernel).reset("agent:main:main"),
    ]
    for step in steps:
        seen = kernel.changes.mark()
        await step()
        assert kernel.changes.mark() > seen
