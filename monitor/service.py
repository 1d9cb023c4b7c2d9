"""``sessionwatch serve``: the sidecar's main job.

Start-up runs the sweep and a prune, then the scheduler (the tick 15 s after start and every
60 s, never two at once) and file watching (a change to a linked file wakes an early,
debounced check of its links). Everything starts and stops through one ``AsyncExitStack``;
SIGTERM/SIGINT finish the tick in flight and close the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from watchfiles import awatch

from monitor.config import Config
from monitor.errors import SessionwatchError
from monitor.kernel import Kernel, KernelSettings
from monitor.upstream import UpstreamMonitor

log = logging.getLogger(__name__)

DEBOUNCE_MS = 300


def settings_from(config: Config) -> KernelSettings:
    s = config.session
    return KernelSettings(
        main_key=s.main_key,
        scope=s.scope,
        group_scope=s.group_scope,
        notify_on_create=s.notify_on_create,
    )


class Sidecar:
    """The running service: kernel, monitor, scheduler and file watcher."""

    def __init__(self, kernel: Kernel, monitor: UpstreamMonitor, config: Config) -> None:
        self.kernel = kernel
        self.monitor = monitor
        self.config = config
        self.stopping = asyncio.Event()
        self._paths_changed = asyncio.Event()

    async def run_tick(self, only: set[str] | None = None) -> None:
        try:
            results = await self.monitor.tick(only)
        except SessionwatchError as exc:
            log.warning("tick failed: %s", exc)
            return
        active = [r for r in results if r.outcome not in {"quiet", "skipped"}]
        for r in active:
            log.info("%s: %s (turns %d) %s", r.session_key, r.outcome, r.turns, r.reason or "")
        self._paths_changed.set()

    async def _watched_files(self) -> dict[str, set[str]]:
        """Linked file path -> the session keys linked to it."""
        by_path: dict[str, set[str]] = {}
        for link in await self.monitor.links():
            path = link["ref"].get("filePath")
            if isinstance(path, str) and link["watched"]:
                by_path.setdefault(path, set()).add(link["sessionKey"])
        return by_path

    async def watch_files(self) -> None:
        """Wake an early check of the links whose files changed; the tick stays the truth."""
        while not self.stopping.is_set():
            files = await self._watched_files()
            dirs = sorted({str(Path(p).parent) for p in files if Path(p).parent.is_dir()})
            self._paths_changed.clear()
            if not dirs:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._paths_changed.wait(), 5)
                continue
            stop = asyncio.Event()
            watcher = asyncio.ensure_future(self._wait_changed(stop))
            try:
                async for changes in awatch(
                    *dirs, stop_event=stop, debounce=DEBOUNCE_MS, recursive=False
                ):
                    keys = set().union(*(files.get(str(Path(p)), set()) for _, p in changes))
                    if keys:
                        await self.run_tick(keys)
            finally:
                stop.set()
                watcher.cancel()

    async def _wait_changed(self, stop: asyncio.Event) -> None:
        await self._paths_changed.wait()
        stop.set()


@contextlib.asynccontextmanager
async def running(config: Config, db: Path) -> AsyncIterator[Sidecar]:
    async with AsyncExitStack() as stack:
        kernel = await Kernel.open(db, settings_from(config))
        stack.push_async_callback(kernel.close)
        monitor = UpstreamMonitor(kernel, config)
        stack.push_async_callback(monitor.tick_done)  # runs after the scheduler stopped
        sidecar = Sidecar(kernel, monitor, config)
        pending = await kernel.sweep()
        pruned = await kernel.prune()
        log.info(
            "start-up: %d pending notices, %d events pruned", len(pending), pruned.deleted_events
        )
        scheduler = AsyncIOScheduler(timezone=UTC)
        first = datetime.now(UTC) + timedelta(seconds=config.monitor.initial_delay_s)
        scheduler.add_job(
            sidecar.run_tick,
            "interval",
            seconds=config.monitor.interval_s,
            next_run_time=first,
            max_instances=1,
            coalesce=True,
            id="tick",
        )
        scheduler.start()
        stack.callback(scheduler.shutdown, wait=False)
        if config.monitor.watch_files:
            task = asyncio.ensure_future(sidecar.watch_files())
            stack.callback(task.cancel)
        yield sidecar


async def serve(config: Config, db: Path) -> None:
    """Run until SIGINT/SIGTERM."""
    async with running(config, db) as sidecar:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, sidecar.stopping.set)
        log.info("sessionwatch serving %s", db)
        await sidecar.stopping.wait()
        log.info("stopping: finishing the tick in flight")
