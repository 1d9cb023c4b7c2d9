"""``sessionwatch serve``: the sidecar's main job, the composition root.

Start-up takes the database's instance lock (:mod:`monitor.private`), runs the sweep and a
prune, then starts the HTTP API, the tick loop (15 s after start and every 60 s, never two
at once) and file watching (:mod:`monitor.file_watch`), all through one
``AsyncExitStack``. SIGTERM/SIGINT stop accepting requests, finish the tick in
flight and close the database, in that order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

from adapters.base import NodeAddress
from adapters.registry import node_kinds
from monitor.clock import now_ms
from monitor.config import Config, is_loopback, is_pg_url, without_password
from monitor.delivery.hooks import HooksClient
from monitor.delivery.ledger import Delivery
from monitor.delivery.timers import LoopTimers
from monitor.doctor import node_reachable
from monitor.errors import (
    ConfigError,
    SchemaTooNew,
    SessionwatchError,
    StoreError,
    StoreLocked,
)
from monitor.file_watch import FileWatch
from monitor.kernel import Kernel, KernelSettings
from monitor.kernel.store import open_store
from monitor.kernel.store.protocol import StateStore
from monitor.kernel.store.sqlite_conn import made_by_sessionwatch
from monitor.metrics import Metrics
from monitor.node_watch import NodeWatch
from monitor.paths import expand_user, refuse_if_not_ours
from monitor.private import (
    check_private_state,
    load_token,
    read_secret,
    take_instance_lock,
)
from monitor.retry import Backoff
from monitor.upstream import UpstreamMonitor
from monitor.upstream.host_leases import HostLeases, ttl_for
from monitor.upstream.links import delete_links
from monitor.upstream.monitor import node_address, root_paths
from monitor.upstream.tick_health import TickHealth
from monitor.web.api import build_app
from monitor.web.common import start_site
from monitor.web.node import build_node_app, present
from monitor.web.openapi import VERSION
from monitor.web.status_page import PageSources

log = logging.getLogger(__name__)


class Sidecar:
    """The running service: kernel, monitor, metrics, scheduler and file watcher."""

    def __init__(
        self,
        kernel: Kernel,
        monitor: UpstreamMonitor,
        config: Config,
        metrics: Metrics,
        *,
        paths_changed: asyncio.Event,
        tick_health: TickHealth,
        waker: HooksClient | None = None,
        delivery: Delivery | None = None,
        db_display: str = "",
        stopping: asyncio.Event | None = None,
    ) -> None:
        """``paths_changed``: set by the kernel (a watch from anywhere) and the monitor (an
        adoption): which files are watched may have changed. ``db_display``: the store, as
        the status page names it (no password)."""
        self.kernel = kernel
        self.monitor = monitor
        self.config = config
        self.metrics = metrics
        self.stopping = stopping or asyncio.Event()
        self.addresses: list[str] = []  # where the API listens, once it does
        self.waker = waker
        self.delivery = delivery
        self.db_display = db_display
        self.tick_health = tick_health
        self._paths_changed = paths_changed
        self._schedule = asyncio.Event()
        self._skip_logged = False
        self.files = FileWatch(
            monitor, kernel.changes, paths_changed, self.stopping, tick=self.run_tick
        )
        self.node_watch = NodeWatch(
            monitor, kernel.changes, self.stopping, tick=self.run_tick, nodes=self.nodes
        )

    def nodes(self) -> dict[str, NodeAddress]:
        """The paired nodes as the configuration names them now (a reload may change it)."""
        return {name: node_address(node) for name, node in self.config.nodes.items()}

    def links_may_have_changed(self) -> None:
        """Re-arm file watching: the files watched may differ (after a reload of roots)."""
        self._paths_changed.set()

    async def tick_on_schedule(self) -> None:
        """The fixed tick, the source of truth: ``initial_delay_s`` after start, then on a
        grid of ``interval_s``. A reloaded interval applies from the next tick: the wait in
        course is measured again from the last tick (:meth:`schedule_changed`). Never two at
        once: a tick due while one runs (a slow one, an early check) is skipped and said once
        (:meth:`scheduled_tick`), and the ticks a slow one ran past are one skip, not a
        queue. Cancelling this loop never cancels a tick in flight: the monitor's
        ``tick_done`` waits for it on the way out. Timed on the loop's monotonic clock."""
        loop = asyncio.get_running_loop()
        due = loop.time() + self.config.monitor.initial_delay_s
        last: float | None = None  # when the last tick started
        while not self.stopping.is_set():
            if await self._rescheduled(due - loop.time()):
                if last is not None:
                    due = last + self.config.monitor.interval_s
                continue
            last = loop.time()
            try:
                await asyncio.shield(asyncio.ensure_future(self.scheduled_tick()))
            except Exception:  # a bug in one tick must not end the ticks: said, and on
                log.exception("a tick failed unexpectedly; the next one runs as planned")
            interval = self.tick_health.interval_s = self.config.monitor.interval_s
            due += interval
            if due < loop.time():  # it ran past its next time: those ticks are skipped
                self._say_skipped()
                due += math.ceil((loop.time() - due) / interval) * interval

    def schedule_changed(self) -> None:
        """The tick's interval may have changed (a reload): the wait in course ends."""
        self._schedule.set()

    async def _rescheduled(self, wait_s: float) -> bool:
        """Wait ``wait_s``; True when the schedule changed meanwhile."""
        try:
            await asyncio.wait_for(self._schedule.wait(), max(0.0, wait_s))
        except TimeoutError:
            return False
        self._schedule.clear()
        return True

    def _say_skipped(self) -> None:
        if not self._skip_logged:
            log.warning("the previous tick is still running; skipping ticks until it ends")
            self._skip_logged = True

    async def scheduled_tick(self) -> None:
        """The fixed tick. One still running (waiting for a locked database, say) is not
        queued behind: this one is skipped, and that is logged once until a tick completes."""
        if self.monitor.busy:
            self._say_skipped()
            return
        if await self.run_tick():  # a tick that waited in vain for the store says it again
            self._skip_logged = False
        await self.kernel.maybe_prune()  # hourly, whoever writes the log

    async def run_tick(self, only: set[str] | None = None, *, rearm: bool = True) -> bool:
        """One tick; whether the store took all it had to write."""
        start = time.perf_counter()
        try:
            results = await self.monitor.tick(only)
        except SessionwatchError as exc:
            log.warning("tick failed: %s", exc)
            self.tick_health.refused(str(exc))
            return False
        duration = time.perf_counter() - start
        self.metrics.ticks.inc()
        self.metrics.tick_seconds.observe(duration)
        self.tick_health.ran(int(time.time() * 1000), duration, results)
        counted: dict[tuple[str, str], int] = {}
        for r in results:
            self.metrics.outcomes.labels(r.adapter or "none", r.outcome).inc()
            label = (r.adapter or "none", r.outcome)
            counted[label] = counted.get(label, 0) + 1
            if r.outcome == "activity" and not r.unsettled:  # a change; states say themselves
                log.info("%s: %d turns recorded %s", r.session_key, r.turns, r.reason or "")
        if only is None:  # a whole tick: the links as they stand now
            self.metrics.links_now.clear()
            for (adapter, outcome), n in counted.items():
                self.metrics.links_now.labels(adapter, outcome).set(n)
        if rearm and any(r.outcome == "missing" for r in results):
            self._paths_changed.set()
        return not any(r.unsettled for r in results)


async def _start_api(stack: AsyncExitStack, sidecar: Sidecar, token: str, listen: str) -> list[str]:
    page = PageSources(
        kernel=sidecar.kernel,
        monitor=sidecar.monitor,
        tick=sidecar.tick_health,
        config=lambda: sidecar.config,
        waker=lambda: sidecar.waker,
        db=sidecar.db_display,
        version=VERSION,
        node_check=node_reachable,
    )
    app = build_app(sidecar.kernel, sidecar.monitor, sidecar.metrics, token, page)
    allowed = sidecar.config.api.allowed_hosts
    return await start_site(stack, app, listen, "[api] listen", allowed)


async def open_state(
    db: Path | str, stopping: asyncio.Event | None, metrics: Metrics
) -> StateStore | None:
    """Open the state database, waiting while another process holds it locked: retried with
    backoff, said once in the log, until it opens (the store) or ``stopping`` is set (None)."""
    backoff = Backoff(0.5, 5.0)
    while True:
        try:
            return await open_store(db, clock=now_ms, on_error=metrics.db_errors.inc)
        except (StoreLocked, StoreError) as exc:
            if isinstance(exc, SchemaTooNew) or not (
                isinstance(exc, StoreLocked) or isinstance(db, str)
            ):
                raise  # a SQLite file that cannot be opened, or a newer schema: said at once
            if backoff.fresh:
                log.warning("%s; retrying until it answers", exc)
        if await backoff.wait(stopping):
            return None


@contextlib.asynccontextmanager
async def running(
    config: Config, db: Path | str, stopping: asyncio.Event | None = None
) -> AsyncIterator[Sidecar | None]:
    """The whole service on one exit stack; None when stopped before the database opened.
    ``db``: the SQLite file (one ``serve`` per file, kept private) or a PostgreSQL URL."""
    async with AsyncExitStack() as stack:
        lock = None
        if isinstance(db, Path):
            refuse_if_not_ours(db, "the state database")  # before its lock: says whose it is
            lock = take_instance_lock(db)
            stack.callback(lock.close)
            check_private_state(db, ours=made_by_sessionwatch)
        token = load_token(Path(expand_user(config.api.token_file)))
        metrics = Metrics()
        timers = LoopTimers()
        tick_health = TickHealth(
            interval_s=config.monitor.interval_s, budget_s=config.monitor.adapter_budget_s
        )
        waker = _hooks_client(config, metrics, db, timers, tick_health)
        if waker:
            stack.push_async_callback(waker.close)
        paths_changed = asyncio.Event()
        store = await open_state(db, stopping, metrics)
        if store is None:
            yield None
            return
        delivery = Delivery(store, waker, timers=timers, metrics=metrics) if waker else None
        kernel = await Kernel.on_store(
            store,
            KernelSettings.of(config),
            metrics=metrics,
            on_notices=delivery.deliver if delivery else None,
            on_delete=(delete_links,),
            on_watches_changed=paths_changed.set,
        )
        stack.push_async_callback(kernel.close)
        if delivery is not None:
            stack.push_async_callback(delivery.close)
        leases = await _host_leases(kernel, config, metrics)
        if leases is not None:
            stack.push_async_callback(leases.release)  # after the tick in flight finished
        monitor = UpstreamMonitor.from_config(
            kernel,
            config,
            metrics=metrics,
            on_links_changed=paths_changed.set,
            holds_shared=leases.holds_shared if leases else lambda: True,
        )
        stack.push_async_callback(monitor.tick_done)  # after the tick loop and API stopped
        sidecar = Sidecar(
            kernel,
            monitor,
            config,
            metrics,
            paths_changed=paths_changed,
            tick_health=tick_health,
            waker=waker,
            delivery=delivery,
            db_display=without_password(db) if is_pg_url(db) else str(db),
            stopping=stopping,
        )
        if leases is not None:
            keeper = asyncio.ensure_future(leases.keep(sidecar.stopping))
            stack.callback(keeper.cancel)
        pending = await kernel.sweep()
        pruned = await kernel.prune()
        log.info(
            "start-up: %d pending notices, %d events pruned", len(pending), pruned.deleted_events
        )
        metrics.undecided_notices.set(kernel.undecided_notices)
        if kernel.undecided_notices:
            log.warning(
                "%d notices an earlier sessionwatch left pending on this database, which the"
                " gateway shares, cannot be told from the gateway's own: they are left to the"
                " gateway, and the next change recorded on each of their pairs wakes it",
                kernel.undecided_notices,
            )
        ticks = asyncio.ensure_future(sidecar.tick_on_schedule())
        stack.callback(ticks.cancel)
        if config.monitor.watch_files:
            task = asyncio.ensure_future(sidecar.files.run())
            stack.callback(task.cancel)
            nodes = asyncio.ensure_future(sidecar.node_watch.run())
            stack.callback(nodes.cancel)
        if delivery is not None:  # notices other processes opened wake their watchers too
            notices = asyncio.ensure_future(
                delivery.follow(kernel.changes, kernel.pending, sidecar.stopping)
            )
            stack.callback(notices.cancel)
        sidecar.addresses = await _start_api(stack, sidecar, token, config.api.listen)
        if lock is not None:
            lock.say_serving(sidecar.addresses)  # where `open` finds this serve
        yield sidecar


def _hooks_client(
    config: Config, metrics: Metrics, db: Path | str, timers: LoopTimers, tick: TickHealth
) -> HooksClient | None:
    """The hooks client of ``[gateway]``, else of the gateway's own configuration next to it
    (said once at start, the token never), else none."""
    gateway = config.gateway
    if not gateway.wakes:
        return _openclaw_client(config, metrics, db, timers, tick)
    token_file = Path(expand_user(gateway.hooks_token_file))
    read_secret(token_file, "the hooks token file")  # a missing or shared file stops start-up
    return HooksClient(
        gateway.hooks_url,
        token_file,
        timers=timers,
        on_outcome=tick.news,
        main_key=config.session.main_key,
        retry_s=gateway.retry_interval_s,
        metrics=metrics,
    )


def _openclaw_client(
    config: Config, metrics: Metrics, db: Path | str, timers: LoopTimers, tick: TickHealth
) -> HooksClient | None:
    from monitor.openclaw import found_hooks

    hooks = found_hooks(config, db)
    if hooks is None:
        return None
    state = hooks.install.state_dir
    try:
        url, _ = hooks.current()
    except SessionwatchError as exc:
        log.warning("next to OpenClaw at %s, but no wakes: %s", state, exc)
        return None
    log.info("next to OpenClaw at %s: state %s, hooks %s", state, db, url)
    return HooksClient(
        url,
        Path(),
        timers=timers,
        on_outcome=tick.news,
        main_key=config.session.main_key,
        retry_s=config.gateway.retry_interval_s,
        metrics=metrics,
        credentials=hooks.current,
    )


async def _host_leases(kernel: Kernel, config: Config, metrics: Metrics) -> HostLeases | None:
    """On a store several sidecars share: this sidecar's host lease (its id must be set,
    and unique among the live ones); None on a file only this sidecar serves."""
    if not kernel.store.shared:
        return None
    if not config.host.id:
        raise ConfigError(
            "a store several sidecars share needs this sidecar's own [host] id"
            ' (for example: [host] id = "laptop")'
        )
    ttl_ms = ttl_for(config.monitor.interval_s)
    leases = HostLeases(kernel, config.host.id, ttl_ms=ttl_ms, metrics=metrics)
    await leases.start()
    return leases


async def serve(config: Config, db: Path | str, config_path: Path | str | None = None) -> None:
    """Run until SIGINT/SIGTERM; SIGHUP reads ``config_path`` again (see monitor.reload)."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    async with running(config, db, stopping) as sidecar:
        if sidecar is None:
            log.info("stopped before the state database could be opened")
            return

        def on_hangup() -> None:
            from monitor.reload import reload

            sidecar.config = reload(sidecar.config, config_path, sidecar.monitor, sidecar.waker)
            sidecar.links_may_have_changed()
            sidecar.schedule_changed()

        loop.add_signal_handler(signal.SIGHUP, on_hangup)
        shown = without_password(db) if isinstance(db, str) else db
        log.info("sessionwatch serving %s on %s", shown, ", ".join(sidecar.addresses))
        await stopping.wait()
        log.info("stopping: no new requests; finishing the tick in flight")


def node_roots(config: Config) -> dict[str, str]:
    """The roots a node serves: each format a node can serve, from the configuration."""
    served = set(node_kinds().values())
    return {kind: str(path) for kind, path in root_paths(config.roots).items() if kind in served}


async def serve_node(
    config: Config, listen: str, token_file: Path, tls_file: Path | None = None
) -> None:
    """``sessionwatch node``: serve this machine's sessions read-only until SIGINT/SIGTERM;
    over TLS with its own certificate (``tls_file``), else plain HTTP on loopback only."""
    if tls_file is None and not listen.startswith("unix:"):
        host = listen.rpartition(":")[0] or "127.0.0.1"
        if not is_loopback(host):  # refused before anything is made
            raise ConfigError(
                f"--listen {listen}: plain HTTP is served on loopback only (the token and the"
                " sessions' metadata would cross the network in clear). Add --tls, or listen"
                " on 127.0.0.1 and forward the port over SSH"
            )
    token = load_token(Path(expand_user(token_file)))
    context = fingerprint = None
    if tls_file is not None:
        from monitor.node_tls import server_context

        context, fingerprint = server_context(Path(expand_user(tls_file)))
    roots = node_roots(config)
    app = build_node_app(roots, token)
    async with AsyncExitStack() as stack:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        allowed = config.api.allowed_hosts
        addresses = ", ".join(await start_site(stack, app, listen, "--listen", allowed, context))
        found = present(roots)
        served = ", ".join(f"{kind} {roots[kind]}" for kind in found) or "nothing yet"
        absent = [kind for kind in sorted(roots) if kind not in found]
        if absent:  # served once they exist: the node looks at each request
            served += f" ({', '.join(absent)}: no such root yet)"
        log.info("sessionwatch node serving %s on %s", served, addresses)
        if fingerprint is not None:
            log.info('the node\'s certificate: fingerprint = "sha256:%s" (pin it)', fingerprint)
        await stopping.wait()
