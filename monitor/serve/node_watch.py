"""Node watching: a change a paired node reports wakes an early check of its links.

What file watching (:mod:`monitor.serve.file_watch`) is to a local transcript, this is to a
session on a node: one long poll per node with watched links on its change feed
(``GET /v1/changes``, where only a cursor crosses the wire). When the cursor moves (a write
under one of the node's roots, or a node that started again) the links on that node are
checked at once; the first answer after a start or an outage checks them too, so a laptop
that slept is caught up the moment it answers. The tick stays the truth: a node that does
not answer is said once in the log, and its links are read at each tick meanwhile (each
check inconclusive, with its reason, until it answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import aiohttp

from adapters import node_client
from adapters.base import NodeAddress
from monitor.errors import SessionwatchError
from monitor.kernel.bus import Bus, ConfigReloaded, SourcesMoved
from monitor.kernel.changes import KEEPALIVE_S
from monitor.retry import Backoff
from monitor.serve.components import set_on_link_changes, start_task
from monitor.upstream.configured import nodes_of

if TYPE_CHECKING:
    from contextlib import AsyncExitStack

    from monitor.upstream import UpstreamMonitor

log = logging.getLogger(__name__)

WAIT_S = 20.0  # how long one poll waits on the node
PAUSE_S = 10.0  # node watching waits this long after the database failed


class NodeWatch:
    """One long poll per paired node that has watched links; ticks their links early."""

    bus: Bus  # handed at start

    def __init__(
        self,
        monitor: UpstreamMonitor,
        *,
        nodes: Mapping[str, NodeAddress],
    ) -> None:
        """``nodes``: the configured nodes (a reload may change them: it says so)."""
        self.monitor = monitor
        self.nodes = nodes
        self._links_changed = asyncio.Event()
        self.keys: dict[str, set[str]] = {}  # node -> its watched links' keys, kept current
        self._polls: dict[str, asyncio.Task[None]] = {}
        self.without_feed: set[str] = set()  # older nodes: their links wait for the ticks

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        self.bus = bus
        stack.enter_context(bus.subscribe(ConfigReloaded, self._reloaded))
        set_on_link_changes(stack, bus, self._links_changed)
        start_task(stack, self.run())

    def _reloaded(self, change: ConfigReloaded) -> None:
        """New addresses, tokens or pins: the poll of each node that changed starts again at
        once, its backoff with it (a pin fixed by a reload is not waited on for 30 s more
        than the ticks)."""
        old, self.nodes = self.nodes, nodes_of(change.new)
        changed = {n for n in self.nodes if old.get(n) != self.nodes[n]}
        for name in changed:
            self.without_feed.discard(name)
            poll = self._polls.pop(name, None)
            if poll is not None:
                poll.cancel()
        if changed:
            self._links_changed.set()  # the run loop starts their polls again now

    async def run(self) -> None:
        """Keep one poll per node with watched links, as links change (the change stream);
        a poll that ended is started again within 15 s."""
        try:
            while True:  # until the stack cancels it
                try:
                    wanted = await self.monitor.watched_nodes()
                except SessionwatchError as exc:
                    log.warning("node watching paused: %s", exc)
                    await asyncio.sleep(PAUSE_S)
                    continue
                for name in set(self._polls) - set(wanted):
                    self._polls.pop(name).cancel()
                    self.keys.pop(name, None)
                for name, keys in wanted.items():
                    self.keys[name] = keys
                    if name in self.without_feed:
                        continue
                    if name not in self._polls or self._polls[name].done():
                        self._polls[name] = asyncio.ensure_future(self.poll(name))
                # read the links again when they may have changed, and never on a timer (a
                # read of every link: some 30 ms at 1,000); 15 s only to start again a
                # poll that ended
                ended = any(task.done() for task in self._polls.values())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._links_changed.wait(), KEEPALIVE_S if ended else None
                    )
                self._links_changed.clear()
        finally:
            for task in self._polls.values():
                task.cancel()

    async def poll(self, name: str) -> None:
        """Long-poll node ``name``'s change feed until cancelled; check its links when the
        cursor moves, and when it answers after not answering."""
        cursor: str | None = None
        failing: str | None = None
        backoff = Backoff(1.0, 30.0)
        timeout = aiohttp.ClientTimeout(total=WAIT_S + node_client.TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:  # until cancelled
                params = {"after": cursor or "", "wait": str(WAIT_S)}
                asked = time.monotonic()
                try:
                    answer = await node_client.call(
                        http, self.nodes, name, "/v1/changes", params=params
                    )
                except node_client.NodeError as exc:
                    if node_client.OLDER_NODE in str(exc):
                        log.warning(
                            "node %s has no change feed (an older sessionwatch node): its"
                            " links are checked at each tick only, until serve restarts",
                            name,
                        )
                        self.without_feed.add(name)
                        return
                    if failing is None:
                        log.warning(
                            "node %s does not answer (%s): its links are checked at each tick"
                            " until it does",
                            name,
                            exc,
                        )
                    failing = str(exc)
                    cursor = None  # its first answer checks the links: nothing waits a tick
                    await backoff.wait()
                    continue
                if failing is not None:
                    log.info("node %s answers again: checking its links now", name)
                    failing = None
                backoff.reset()
                moved = answer.get("cursor")
                if not isinstance(moved, str) or moved == cursor:
                    # a node waits before it answers the same cursor: one that does not
                    # (or answers no cursor) is not polled in a tight loop
                    if time.monotonic() - asked < WAIT_S / 2:
                        await backoff.wait()
                    continue
                cursor = moved
                keys = self.keys.get(name)
                if keys:  # a node's missing sources re-arm nothing: catch_up
                    self.bus.publish(SourcesMoved(frozenset(keys), catch_up=True))
