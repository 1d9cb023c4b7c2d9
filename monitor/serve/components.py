"""What the service's components share: the one contract every running part implements
(:class:`Component`), a task that lives as long as the exit stack, and the changes after
which the watched links (and so the files and nodes to watch) may differ."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from contextlib import AsyncExitStack
from typing import Any, Protocol

from monitor.kernel.bus import (
    Bus,
    Change,
    ConfigReloaded,
    LinksChanged,
    OwnershipChanged,
    StoreMoved,
    WatchedMayDiffer,
    WatchesChanged,
)
from monitor.kernel.topics import LINKS

# a watch, a spawn or a reset here; an adoption or a missing source; another process's
# commit (one that may have touched links: links_may_differ); new roots or nodes
LINK_CHANGES: tuple[type[Change], ...] = (
    *(WatchesChanged, LinksChanged, WatchedMayDiffer, StoreMoved, ConfigReloaded),
    OwnershipChanged,
)


def links_may_differ(change: Change) -> bool:
    """Whether one of :data:`LINK_CHANGES` may have moved the links or watches: another
    process's commit only if it touched them (a peer's lease or ledger does not)."""
    return not isinstance(change, StoreMoved) or change.about(LINKS)


class Component(Protocol):
    """A running part of the service. ``start`` begins its work and registers its stop on
    ``stack`` (subscriptions entered, tasks cancelled, resources released), so that closing
    the stack stops the parts in the reverse of their start; what it hears and says goes
    through ``bus``."""

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None: ...


class Parts:
    """The service's parts, in the one order they start (``order``), on one stack: each
    starts as it is added, so that a part made from an earlier one (the kernel over the
    store, the parts over the kernel) is made once that one runs. Closing the stack stops
    them in the reverse order."""

    def __init__(self, stack: AsyncExitStack, bus: Bus) -> None:
        self.stack = stack
        self.bus = bus
        self.order: list[Component] = []

    async def start(self, *components: Component) -> None:
        for component in components:
            await component.start(self.stack, self.bus)
            self.order.append(component)


def start_task(stack: AsyncExitStack, coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` until ``stack`` closes: cancelled then, and awaited, so that the parts
    stopped after it find it ended (a failure it ended with was its own to say)."""
    task = asyncio.ensure_future(coro)
    stack.push_async_callback(_stopped, task)


async def _stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def set_on_link_changes(stack: AsyncExitStack, bus: Bus, event: asyncio.Event) -> None:
    """Set ``event`` at each of :data:`LINK_CHANGES` until ``stack`` closes."""
    stack.enter_context(
        bus.subscribe(LINK_CHANGES, lambda c: event.set() if links_may_differ(c) else None)
    )
