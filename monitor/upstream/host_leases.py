"""Several sidecars on one store: each holds its host id, one ticks the links without a host.

A sidecar on a shared store takes the lease ``host:<id>`` at start (refused while another
live sidecar holds it) and keeps it, and takes ``ticks:shared`` whenever it is free: the
holder ticks the links that belong to no host (OpenCode databases, paired nodes); every
sidecar ticks its own host's file links. Leases last ``ttl`` and are renewed every third of
it, both in one transaction that also reads which hosts are live (a change of them is
:class:`~monitor.kernel.bus.HostsChanged`: delivery's shares follow it). A sidecar that
dies (SIGKILL, a lost host) stops renewing: another takes ``ticks:shared``, and the others
its share of the watchers, within ``ttl`` plus one renewal period: under one tick
interval, since ``ttl`` is half of it.

Every expiry is the store's clock (:mod:`monitor.kernel.leases`); here, only how long a
lease has left is timed, on the monotonic clock. Gaining or losing ``ticks:shared`` is a
change on the bus (:class:`~monitor.kernel.bus.OwnershipChanged`): the new holder ticks
the links without a host at once and arms their nodes' feeds; a holder whose lease ran out
unrenewed (paused, cut from the store) says it lost it, and each tick reads the lease in
the store, so one paused past its lease ticks none of them when it resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

from monitor.errors import AlreadyRunning, SessionwatchError
from monitor.kernel import Kernel
from monitor.kernel import leases as lease_rows
from monitor.kernel.bus import Bus, HostsChanged, OwnershipChanged
from monitor.kernel.leases import SHARED, Lease
from monitor.kernel.store.upgrade import release_info
from monitor.private import pid_alive

if TYPE_CHECKING:
    from monitor.kernel.store.protocol import Conn
    from monitor.metrics import Metrics  # prometheus_client: the service's, not a command's

log = logging.getLogger(__name__)


def ttl_for(interval_s: float) -> int:
    """Half a tick interval, at least a second (ms)."""
    return max(1000, int(interval_s * 1000 / 2))


class HostLeases:
    bus: Bus  # handed at start

    def __init__(
        self, kernel: Kernel, host: str, *, ttl_ms: int, metrics: Metrics | None = None
    ) -> None:
        self.kernel = kernel
        self.metrics = metrics
        self.host = host
        self.ttl_ms = ttl_ms
        self.me = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._shared = False
        self._told = False  # the tick has heard of this sidecar's leases
        self._lapse: asyncio.TimerHandle | None = None  # when the held lease runs out
        self._said: str | None = None
        self.keeper: asyncio.Task[None] | None = None  # renewing, once started
        self.hosts: frozenset[str] = frozenset()  # the live hosts, as last renewed

    @property
    def name(self) -> str:
        return f"host:{self.host}"

    async def _take(self, name: str) -> Lease:
        return await self.kernel.commit(lambda r: self._taken(r.conn, name))

    def _taken(self, conn: Conn, name: str) -> Lease:
        return lease_rows.take(conn, name, self.me, ttl_ms=self.ttl_ms, info=release_info())

    def _renewal(self, conn: Conn) -> tuple[Lease, Lease, frozenset[str]]:
        """One transaction: this host's lease, the shared one, and the live hosts."""
        return (
            self._taken(conn, self.name),
            self._taken(conn, SHARED),
            lease_rows.live(conn, "host:"),
        )

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        """Take this host's lease (or refuse to start: another live sidecar has the id),
        and keep the leases until ``stack`` closes, then give them up (started before the
        tick component, so released after the tick in flight finished)."""
        self.bus = bus
        await self.take()
        stack.push_async_callback(self.release)
        self.keeper = asyncio.ensure_future(self.keep())  # cancelled before the release
        stack.callback(self.keeper.cancel)

    async def take(self) -> None:
        """Take this host's lease, or refuse: another live sidecar has the id."""
        lease = await self._take(self.name)
        if not lease.held_by(self.me) and _dead_here(lease.holder):
            await self.kernel.commit(lambda r: lease_rows.release(r.conn, self.name, lease.holder))
            lease = await self._take(self.name)
        if not lease.held_by(self.me):
            left = max(0, lease.left_ms) / 1000
            raise AlreadyRunning(
                f"another sidecar ({lease.holder}) runs with host id {self.host!r} on this"
                f" store (its lease ends in {left:.0f} s unless renewed); give each sidecar"
                " its own [host] id"
            )
        await self.renew()

    async def renew(self) -> None:
        """Renew the host lease; take (or keep) the shared one when it is free."""
        began = asyncio.get_running_loop().time()
        host, shared, hosts = await self.kernel.commit(lambda r: self._renewal(r.conn))
        if not host.held_by(self.me):  # lost while paused: say so, stop ticking shared links
            self._say(f"lost the lease of host id {self.host!r} to {host.holder}")
        if hosts != self.hosts:
            self.hosts = hosts
            self.bus.publish(HostsChanged(hosts))
        # it runs out unrenewed this long after the statements began, at the latest: a
        # renewal whose answer came after that (a slow store) holds nothing
        lapse = began + min(host.left_ms, shared.left_ms) / 1000
        held = shared.held_by(self.me) and host.held_by(self.me)
        held = held and lapse > asyncio.get_running_loop().time()
        if held:
            self._expire_at(lapse)
        self._hold(held)

    def _hold(self, held: bool) -> None:
        """Whether this sidecar ticks the links without a host now: said, counted, and
        published when it changes."""
        if held != self._shared or not self._told:  # the first: the tick is leased from now
            if held != self._shared:
                log.info("%s the links without a host", "ticking" if held else "no longer ticking")
            self._shared, self._told = held, True
            self.bus.publish(OwnershipChanged(held, self.me))
        if not held and self._lapse is not None:
            self._lapse.cancel()
            self._lapse = None
        if self.metrics:
            self.metrics.shared_lease.set(int(held))

    def _expire_at(self, when: float) -> None:
        """The held lease runs out at ``when`` (the loop's monotonic clock) unless renewed
        by then: it is let go then (a renewal moves it)."""
        if self._lapse is not None:
            self._lapse.cancel()
        self._lapse = asyncio.get_running_loop().call_at(when, lambda: self._hold(False))

    def _say(self, message: str) -> None:
        if self._said != message:
            log.warning("%s", message)
            self._said = message

    async def keep(self) -> None:
        """Renew every third of the lease's life, until cancelled."""
        period = self.ttl_ms / 3000
        while True:
            await asyncio.sleep(period)
            try:
                await self.renew()
            except SessionwatchError as exc:  # the store is down: the leases lapse
                self._say(f"could not renew the leases: {exc}")  # let go when they run out

    async def release(self) -> None:
        """A clean stop gives both leases up at once."""
        self._hold(False)
        for name in (SHARED, self.name):
            with contextlib.suppress(SessionwatchError):
                await self._release(name)

    async def _release(self, name: str) -> None:
        await self.kernel.commit(lambda r: lease_rows.release(r.conn, name, self.me))


def _dead_here(holder: str) -> bool:
    """A holder that ran on this machine, under a pid that no longer exists (a crash)."""
    machine, _, rest = holder.partition(":")
    pid_text = rest.partition(":")[0]
    if machine != socket.gethostname() or not pid_text.isdigit():
        return False
    return not pid_alive(int(pid_text))
