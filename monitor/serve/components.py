"""What the service's components share: a task that lives as long as the exit stack, and
the changes after which the watched links (and so the files and nodes to watch) may differ."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from contextlib import AsyncExitStack
from typing import Any

from monitor.kernel import Kernel
from monitor.kernel.bus import Change, ConfigReloaded, LinksChanged, StoreMoved, WatchesChanged

# a watch, a spawn or a reset here; an adoption or a missing source; another process's
# commit; new roots or nodes
LINK_CHANGES: tuple[type[Change], ...] = (
    *(WatchesChanged, LinksChanged, StoreMoved, ConfigReloaded),
)


def start_task(stack: AsyncExitStack, coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` until ``stack`` closes (cancelled then)."""
    task = asyncio.ensure_future(coro)
    stack.callback(task.cancel)


def set_on_link_changes(stack: AsyncExitStack, kernel: Kernel, event: asyncio.Event) -> None:
    """Set ``event`` at each of :data:`LINK_CHANGES` until ``stack`` closes."""
    stack.enter_context(kernel.bus.subscribe(LINK_CHANGES, lambda _: event.set()))
