"""``sessionwatch serve``: the sidecar's main job, the composition root.

Start-up starts each part of the service as a component on one ``AsyncExitStack`` (each
owns its start and stop, apscheduler's ``start(exit_stack)``), in one order
(:class:`~monitor.serve.components.Parts`): the database's instance lock
(:mod:`monitor.private`); the store; the kernel; what the status page shows, which hears
from the start; the upstream monitor, which must hear the leases' first word; the hooks
client; delivery, which must hear the sweep's notices; the host lease on a shared store;
recovery; the tick schedule (:mod:`.ticks`, 15 s after start and every 60 s, never two at
once); file and node watching; retention; the title reader; the log level; the
configuration in force; the API site. The parts talk through the change bus
(:mod:`monitor.kernel.bus`), never through this module. SIGTERM/SIGINT close the stack:
the parts stop in the reverse order (no new requests, the tick in flight finished, the
database closed last), and that is their one stop signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

from adapters.registry import node_served
from monitor.clock import Clock, now_ms
from monitor.config import ApiConfig, Config, is_loopback, is_pg_url, without_password
from monitor.delivery.hooks import HooksClient
from monitor.delivery.ledger import Delivery
from monitor.delivery.timers import LoopTimers, Timers
from monitor.doctor import node_reachable
from monitor.errors import (
    ConfigError,
    SchemaTooNew,
    SessionwatchError,
    StoreError,
    StoreLocked,
)
from monitor.kernel import Kernel, KernelSettings
from monitor.kernel.bus import Bus
from monitor.kernel.events import EventKind
from monitor.kernel.store import open_store
from monitor.kernel.store.protocol import StateStore
from monitor.kernel.store.sqlite_conn import made_by_sessionwatch
from monitor.metrics import Metrics
from monitor.paths import expand_user, refuse_if_not_ours
from monitor.private import (
    check_private_state,
    load_token,
    read_secret,
    take_instance_lock,
)
from monitor.retry import Backoff
from monitor.serve.components import Component, Parts, start_task
from monitor.serve.file_watch import FileWatch
from monitor.serve.node_watch import NodeWatch
from monitor.serve.reload import ConfigInForce, LogLevel
from monitor.serve.ticks import Ticks
from monitor.upstream import UpstreamMonitor
from monitor.upstream.configured import nodes_of, root_paths
from monitor.upstream.host_leases import HostLeases, ttl_for
from monitor.upstream.links import delete_links
from monitor.web.api import BUS, build_app
from monitor.web.common import start_site
from monitor.web.node import build_node_app, present
from monitor.web.openapi import VERSION
from monitor.web.page_state import PageState
from monitor.web.titles import TitleReader, catalog_titles

log = logging.getLogger(__name__)


class Sidecar:
    """The running service's parts, each a handle of its own (``running`` made them): for
    ``serve``'s log line, tests and benches. None of them reaches back here."""

    def __init__(
        self,
        kernel: Kernel,
        monitor: UpstreamMonitor,
        configuration: ConfigInForce,
        metrics: Metrics,
        *,
        ticks: Ticks,
        api: ApiSite,
        waker: HooksClient | None = None,
        delivery: Delivery | None = None,
        leases: HostLeases | None = None,
        page: PageState | None = None,
        parts: list[Component] | None = None,
    ) -> None:
        self.kernel = kernel
        self.monitor = monitor
        self.configuration = configuration
        self.metrics = metrics
        self.ticks = ticks
        self.api = api
        self.waker = waker
        self.delivery = delivery
        self.leases = leases
        self.page = page
        self.parts = parts or []  # in the order they started

    @property
    def config(self) -> Config:
        """The configuration in force (a reload replaces it)."""
        return self.configuration.config

    @property
    def addresses(self) -> list[str]:
        """Where the API listens."""
        return self.api.addresses


class ApiSite:
    """The API site, and the status page on it: started last, so that requests come once
    every other part runs."""

    def __init__(
        self,
        kernel: Kernel,
        monitor: UpstreamMonitor,
        metrics: Metrics,
        token: str,
        page: PageState,
        api: ApiConfig,
    ) -> None:
        self.app = build_app(kernel, monitor, metrics, token, page)
        self.listen, self.allowed = api.listen, api.allowed_hosts
        self.addresses: list[str] = []  # once it listens

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        self.app[BUS] = bus  # the notice stream listens on it
        self.addresses = await start_site(
            stack, self.app, self.listen, "[api] listen", self.allowed
        )


class Recovery:
    """Start-up recovery: the notices the sweep finds pending are published (and so
    delivered: delivery starts first), and a prune."""

    def __init__(self, kernel: Kernel, metrics: Metrics) -> None:
        self.kernel = kernel
        self.metrics = metrics

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        kernel, metrics = self.kernel, self.metrics
        pending = await kernel.sweep()
        pruned = await kernel.retention.prune()
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


class HourlyPrune:
    """Retention on the service's own schedule, hourly, so that a log others write to (the
    gateway) is pruned too; a recording prunes when it is due as well (the kernel's)."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        start_task(stack, self.run())

    async def run(self) -> None:
        while True:  # until the stack cancels it
            await self.kernel.retention.when_due()
            due_s = (self.kernel.retention.next_at - self.kernel.clock()) / 1000
            await asyncio.sleep(min(3600.0, max(1.0, due_s)))


async def open_state(
    db: Path | str, stopping: asyncio.Event | None, metrics: Metrics, clock: Clock = now_ms
) -> StateStore | None:
    """Open the state database, waiting while another process holds it locked: retried with
    backoff, said once in the log, until it opens (the store) or ``stopping`` is set (None)."""
    backoff = Backoff(0.5, 5.0)
    while True:
        try:
            return await open_store(db, clock=clock, on_error=metrics.db_errors.inc)
        except (StoreLocked, StoreError) as exc:
            if isinstance(exc, SchemaTooNew) or not (
                isinstance(exc, StoreLocked) or isinstance(db, str)
            ):
                raise  # a SQLite file that cannot be opened, or a newer schema: said at once
            if backoff.fresh:
                log.warning("%s; retrying until it answers", exc)
        if await backoff.wait(stopping):
            return None


async def gateway_made(db: Path, stopping: asyncio.Event, poll_s: float = 0.5) -> bool:
    """Wait while ``db`` is the state database of an OpenClaw install whose gateway has not
    made it yet (its first start comes after this ``serve``'s: a unit's ``After=`` does not
    wait for a file), said once; True once it is made, or when it is no such database;
    False when stopped first."""
    from monitor.openclaw.files import awaited_state_db

    install = await asyncio.to_thread(awaited_state_db, db)
    if install is None:
        return True
    log.warning(
        "next to OpenClaw at %s (%s), whose gateway has not made its state database yet:"
        " waiting for %s, which serve follows once the gateway's first start makes it"
        " (--db or [store] path would run serve on a database of its own, which the"
        " gateway never reads)",
        install.state_dir,
        install.config_path,
        db,
    )
    while install is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), poll_s)
        if stopping.is_set():
            return False
        install = await asyncio.to_thread(awaited_state_db, db)
    log.info("OpenClaw's gateway made its state database %s: serving on it", db)
    return True


@contextlib.asynccontextmanager
async def running(
    config: Config,
    db: Path | str,
    stopping: asyncio.Event | None = None,
    *,
    clock: Clock = now_ms,
    timers: Timers | None = None,
    config_path: Path | str | None = None,
    hangup: bool = False,
) -> AsyncIterator[Sidecar | None]:
    """The whole service on one exit stack; None when stopped before the database opened.
    ``db``: the SQLite file (one ``serve`` per file, kept private) or a PostgreSQL URL;
    ``clock``: the wall clock of what is stored; ``timers``: what delivery times on (its
    windows, quiet periods and retries), the loop's monotonic clock unless given. A
    simulation moves both through weeks; a wall clock moved alone leaves a window open.
    ``hangup``: ``SIGHUP`` reads the configuration again, from ``config_path`` (as at start:
    else ``$SESSIONWATCH_CONFIG``, else the defaults); ``serve``'s, one per process."""
    stopping = stopping or asyncio.Event()
    if isinstance(db, Path) and not await gateway_made(db, stopping):
        yield None
        return
    async with AsyncExitStack() as stack:
        bus = Bus()  # the service's changes, from every part to every part
        parts = Parts(stack, bus)
        lock = None
        if isinstance(db, Path):
            refuse_if_not_ours(db, "the state database")  # before its lock: says whose it is
            lock = take_instance_lock(db)
            await parts.start(lock)  # first: let go last
            check_private_state(db, ours=made_by_sessionwatch)
        token = load_token(Path(expand_user(config.api.token_file)))
        metrics = Metrics(event_kinds=[k.value for k in EventKind])
        timers = timers or LoopTimers(clock)
        waker = _hooks_client(config, metrics, db, timers, bus)
        store = await open_state(db, stopping, metrics, clock)
        if store is None:
            yield None
            return
        await parts.start(store)
        kernel = Kernel(
            store, KernelSettings.of(config), metrics=metrics, on_delete=(delete_links,), bus=bus
        )
        await parts.start(kernel)
        delivery = (
            Delivery(kernel, waker, timers=timers, metrics=metrics, host=_host_of(kernel, config))
            if waker
            else None
        )
        leases = _host_leases(kernel, config, metrics)
        monitor = UpstreamMonitor.from_config(kernel, config, metrics=metrics)
        ticks = Ticks(
            monitor.ticker,
            metrics,
            timers,
            interval_s=config.monitor.interval_s,
            initial_delay_s=config.monitor.initial_delay_s,
        )
        level = LogLevel()
        configuration = ConfigInForce(
            config,
            config_path,
            parts=parts.order,  # those running when a reload comes
            hangup=hangup,
        )
        titles = TitleReader(catalog_titles(monitor))
        page = PageState(
            kernel,
            monitor,
            config,
            titles,
            db=without_password(db) if is_pg_url(db) else str(db),
            version=VERSION,
            wakes_to=waker.url if waker is not None else None,
            node_check=node_reachable,
        )
        api = ApiSite(kernel, monitor, metrics, token, page, config.api)
        watching: list[Component] = (
            [FileWatch(monitor), NodeWatch(monitor, nodes=nodes_of(config))]
            if config.monitor.watch_files
            else []
        )
        service: list[Component] = [
            page,  # hears from the start: the sweep, each tick, each wake
            monitor,
            monitor.ticker,  # before the leases: it hears their first word
            *([waker] if waker else []),  # closed after delivery stopped
            *([delivery] if delivery else []),  # before the sweep: it wakes what it finds
            *([leases] if leases else []),  # released after the tick in flight
            Recovery(kernel, metrics),
            ticks,
            *watching,
            HourlyPrune(kernel),
            titles,
            level,
            configuration,
            api,  # last: requests come once all runs
        ]
        await parts.start(*service)
        if lock is not None:
            lock.say_serving(api.addresses)  # where `open` finds this serve
        yield Sidecar(
            kernel,
            monitor,
            configuration,
            metrics,
            ticks=ticks,
            api=api,
            waker=waker,
            delivery=delivery,
            leases=leases,
            page=page,
            parts=parts.order,
        )


def _hooks_client(
    config: Config, metrics: Metrics, db: Path | str, timers: Timers, bus: Bus
) -> HooksClient | None:
    """The hooks client of ``[gateway]``, else of the gateway's own configuration next to it
    (said once at start, the token never), else none."""
    gateway = config.gateway
    if not gateway.wakes:
        return _openclaw_client(config, metrics, db, timers, bus)
    token_file = Path(expand_user(gateway.hooks_token_file))
    read_secret(token_file, "the hooks token file")  # a missing or shared file stops start-up
    log.info("wakes go to %s/wake (the token in %s)", gateway.hooks_url.rstrip("/"), token_file)
    return HooksClient(
        gateway.hooks_url,
        token_file,
        timers=timers,
        bus=bus,
        main_key=config.session.main_key,
        retry_s=gateway.retry_interval_s,
        metrics=metrics,
    )


def _openclaw_client(
    config: Config, metrics: Metrics, db: Path | str, timers: Timers, bus: Bus
) -> HooksClient | None:
    from monitor.openclaw.files import found_hooks

    hooks = found_hooks(config, db)
    if hooks is None:
        log.info(
            "no wakes: no [gateway] hooks_url, and no OpenClaw next to %s; notices wait to be read",
            db,
        )
        return None
    state = hooks.install.state_dir
    try:
        url, _ = hooks.current()
    except SessionwatchError as exc:  # read again at each wake: a fix applies, no restart
        url = ""
        log.warning(
            "next to OpenClaw at %s: state %s; no wakes until its configuration says where:"
            " %s (read again at each wake)",
            state,
            db,
            exc,
        )
    else:
        log.info(
            "next to OpenClaw at %s: state %s; wakes go to %s/wake", state, db, url.rstrip("/")
        )
    return HooksClient(
        url,
        Path(),
        timers=timers,
        bus=bus,
        main_key=config.session.main_key,
        retry_s=config.gateway.retry_interval_s,
        metrics=metrics,
        credentials=hooks,
    )


def _host_of(kernel: Kernel, config: Config) -> str | None:
    """This sidecar's host id on a store several share (its share of the watchers)."""
    return config.host.id if kernel.store.shared else None


def _host_leases(kernel: Kernel, config: Config, metrics: Metrics) -> HostLeases | None:
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
    return HostLeases(kernel, config.host.id, ttl_ms=ttl_ms, metrics=metrics)


async def serve(config: Config, db: Path | str, config_path: Path | str | None = None) -> None:
    """Run until SIGINT/SIGTERM; SIGHUP reads ``config_path`` again (:mod:`.reload`)."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    async with running(config, db, stopping, config_path=config_path, hangup=True) as sidecar:
        if sidecar is None:
            log.info("stopped before the state database could be opened")
            return
        shown = without_password(db) if isinstance(db, str) else db
        log.info("sessionwatch serving %s on %s", shown, ", ".join(sidecar.addresses))
        await stopping.wait()
        log.info("stopping: no new requests; finishing the tick in flight")


def node_roots(config: Config) -> dict[str, str]:
    """The roots a node serves: each format a node can serve, from the configuration."""
    served = set(node_served())
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
        from monitor.serve.node_tls import server_context

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
