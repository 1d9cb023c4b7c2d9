"""Which watchers this sidecar wakes, on a store several sidecars share: a share each.

Every sidecar could claim every watcher (the ledger's claims take turns in the store, so
the promises would hold), but then every host would read the outbox and try its claims
after each commit of every other host: work per turn growing with the square of the hosts.
So each watcher has one owner among the live hosts, by rendezvous hashing (the highest
hash of the host's id with the watcher's key wins): a host that joins takes a share from
each of the others, a host that leaves hands its share to the others, and no other watcher
moves. Only the owner acts on a notice opened for a watcher (:mod:`monitor.kernel.topics`
names the watcher).

The live hosts are the host leases (:mod:`monitor.upstream.host_leases`), read with each
renewal, a third of the lease's life: a host that dies is out of everyone's set once its
lease ran out and each other host renewed, well within two tick intervals. Until every
host has seen the same set, a watcher may have two owners (their claims take turns in the
store, as any two hosts' did) or none for a moment (the host whose set changed looks
through the whole outbox then, and finds what is now its own).

A sidecar alone on its store (SQLite), or before it knows the hosts, owns every watcher.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import TYPE_CHECKING

from monitor.errors import SessionwatchError
from monitor.kernel import outbox, topics
from monitor.kernel.bus import HostsChanged, NoticesOpened, StoreMoved
from monitor.kernel.policy import WatchPolicy
from monitor.lazylog import LazyLogger

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AsyncExitStack

    from monitor.kernel.bus import Bus
    from monitor.kernel.notices import Notice
    from monitor.kernel.store.protocol import StateStore

log = LazyLogger(__name__)


class Shares:
    """This host's share of the watchers: ``me``, its host id (None: it owns them all)."""

    def __init__(self, me: str | None = None) -> None:
        self.me = me
        self.hosts: frozenset[str] = frozenset()  # the live hosts, as last read
        self._owner: dict[str, str] = {}

    @property
    def known(self) -> bool:
        """Whether the shares are settled: alone, or the hosts read."""
        return self.me is None or bool(self.hosts)

    def owns(self, watcher: str) -> bool:
        if self.me is None or not self.hosts:
            return True
        owner = self._owner.get(watcher)
        if owner is None:
            owner = self._owner[watcher] = max(self.hosts, key=lambda h: _weight(h, watcher))
        return owner == self.me

    def update(self, hosts: frozenset[str]) -> bool:
        """The live hosts are ``hosts`` (with this one: a host whose own lease lapsed for a
        moment still delivers its share rather than leave it to no one); whether the
        shares moved."""
        if self.me is not None:
            hosts |= {self.me}
        if hosts == self.hosts:
            return False
        self.hosts = hosts
        self._owner.clear()
        return True


def _weight(host: str, watcher: str) -> int:
    """The same on every host and in every process (``hash()`` is salted per process)."""
    digest = hashlib.blake2b(f"{host}\0{watcher}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Lookout:
    """Which watchers this host passes over, and when (``request``, the ledger's): those
    this process opened notices for, as the bus says; those another process's commit
    opened notices for, as its topics say (``others``; a look through the outbox when it
    cannot say); the whole outbox at start, and again when the shares move. Only this
    host's share (:class:`Shares`) is passed over."""

    def __init__(
        self,
        store: StateStore,
        request: Callable[[str], None],
        *,
        host: str | None = None,
        others: bool = True,
    ) -> None:
        self.store = store
        self.request = request
        self.others = others
        self.shares = Shares(host)
        self.looking: asyncio.Task[None] | None = None  # a read of the outbox
        self._look_again = False

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        stack.enter_context(bus.subscribe(NoticesOpened, lambda c: self.deliver(list(c.notices))))
        stack.enter_context(bus.subscribe(HostsChanged, self._hosts))
        if self.shares.known:  # on a shared store, once the hosts are read
            self.look()  # what a restart, a crashed peer or a one-shot command left to wake
        if self.others:
            stack.enter_context(bus.subscribe(StoreMoved, self._moved))

    def deliver(self, notices: list[Notice]) -> None:
        """The watchers of ``notices`` the policy wakes."""
        for watcher in dict.fromkeys(n.watcher for n in notices if WatchPolicy.wakes(n)):
            self.request(watcher)

    def _moved(self, change: StoreMoved) -> None:
        if change.topics is None:
            self.look()
            return
        for watcher in topics.to_wake(change.topics):
            self.request(watcher)

    def _hosts(self, change: HostsChanged) -> None:
        if self.shares.update(change.hosts):
            self.look()

    def look(self) -> None:
        """Every watcher the outbox has notices to wake for. One read at a time; asks
        meanwhile make one more."""
        if self.looking is not None:
            self._look_again = True
            return
        self.looking = asyncio.get_running_loop().create_task(self._look())
        self.looking.add_done_callback(lambda _: self._looked())

    def _looked(self) -> None:
        self.looking = None
        if self._look_again:
            self._look_again = False
            self.look()

    async def _look(self) -> None:
        try:
            watchers = await self.store.peek(outbox.watchers_due)
        except SessionwatchError as exc:  # the store is away: the next move looks again
            log.debug("the outbox was not read: %s", exc)
            return
        for watcher in watchers:
            self.request(watcher)

    def close(self) -> None:
        """Stop: the read in flight is cancelled, and starts no other."""
        self._look_again = False
        if self.looking is not None:
            self.looking.cancel()
