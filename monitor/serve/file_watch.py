"""File watching: a change to a linked file wakes an early, debounced check of its links.

The tick stays the source of truth; this only makes it early. The watch covers the
directories of the watched links' files (an OpenCode link names its database's WAL), and is
re-armed only when those directories change: a link change here (an adoption, a watch) or in
another process (a change the kernel's change hub heard) that keeps them only updates which
session keys a path wakes. It hears all of it on the kernel's change stream, and says what
moved there too (:class:`SourcesMoved`): the tick component checks it.

On Linux the watch is inotify on the event loop (:mod:`monitor.inotify`): nothing runs
between two writes. Elsewhere, or when inotify refuses a watch (``max_user_watches``), it is
watchfiles, whose watcher thread steps every 50 ms.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from monitor import inotify
from monitor.errors import SessionwatchError
from monitor.kernel.bus import Bus, SourcesMoved, SourcesWatched
from monitor.serve.components import set_on_link_changes, start_task

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from contextlib import AsyncExitStack

    from monitor.upstream import UpstreamMonitor

log = logging.getLogger(__name__)

DEBOUNCE_MS = 300
WATCHED_BY = "files"
PAUSE_S = 10.0  # file watching waits this long after the database failed


class FileWatch:
    """Watches the linked files' directories and ticks the links of what changed."""

    bus: Bus  # handed at start

    def __init__(self, monitor: UpstreamMonitor) -> None:
        # watchfiles says "N changes detected" at INFO for every append to a watched file:
        # the log would grow with writes, not with changes of state
        logging.getLogger("watchfiles").setLevel(logging.WARNING)
        self.monitor = monitor
        self._paths_changed = asyncio.Event()  # which files are watched may have changed
        self._polled = False  # inotify refused a watch: watchfiles from then on
        self._said: set[str] | None = None  # the keys whose watching was said (None: none)

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        self.bus = bus
        set_on_link_changes(stack, bus, self._paths_changed)
        start_task(stack, self.run())

    async def run(self) -> None:
        """Wake an early check of the links whose files changed; the tick stays the truth.

        The watch is re-armed only when the set of directories changes; a link change that
        keeps the directories only updates which keys a path wakes.
        """
        while True:  # until the stack cancels it
            files = await self._watched_files_or_none()
            if files is None:
                continue
            self._say_watching(files)
            dirs = _dirs_of(files)
            if not dirs:
                await self._links_may_have_changed()
                continue
            stop = asyncio.Event()
            refresher = asyncio.ensure_future(self._refresh(files, dirs, stop))
            # Whatever changed before the watch was armed is caught by one check, which runs
            # once it is armed (awatch arms on its first step, before it first waits): so
            # nothing written at the start falls between the check and the watch.
            self._check_soon(set().union(*files.values()))
            try:
                async for paths in self._changes(dirs, stop, files):
                    keys = set().union(*(files.get(str(Path(p)), set()) for p in paths))
                    if keys:
                        self.bus.publish(SourcesMoved(frozenset(keys)))
                    wal = set().union(*(files.get(p, set()) for p in paths if p.endswith("-wal")))
                    if wal:
                        self.bus.publish(SourcesMoved(frozenset(wal), settling=True))
            finally:
                self.bus.publish(SourcesWatched(WATCHED_BY, frozenset()))
                stop.set()
                refresher.cancel()

    async def _changes(
        self, dirs: list[str], stop: asyncio.Event, files: dict[str, set[str]]
    ) -> AsyncIterator[set[str]]:
        """The paths that changed in ``dirs``, in batches, until ``stop``; ends when the
        watch must be armed again (a directory gone, changes lost). Once inotify's watches
        are armed, the links of ``files`` are said to be heard (:class:`SourcesWatched`);
        watchfiles' polling is never relied on so."""
        if inotify.available() and not self._polled:
            try:
                armed = self._armed(files)
                async for paths in inotify.watch_dirs(dirs, stop, armed=armed):
                    yield paths
                return
            except inotify.Ended as exc:
                log.info("file watching armed again: %s", exc)
                return
            except OSError as exc:  # no inotify watches left: watchfiles, said once
                log.warning("inotify refused a watch (%s): watching with watchfiles", exc)
                self._polled = True
        from watchfiles import awatch

        async for changes in awatch(*dirs, stop_event=stop, debounce=DEBOUNCE_MS, recursive=False):
            yield {p for _, p in changes}

    def _armed(self, files: dict[str, set[str]]) -> Callable[[], None]:
        def say() -> None:
            keys = frozenset(set().union(*files.values()))
            self.bus.publish(SourcesWatched(WATCHED_BY, keys))

        return say

    async def _links_may_have_changed(self) -> None:
        """Until a link or a watch changed here, or the database changed under another
        process (an adoption or a watch from the CLI, a gateway sharing the file)."""
        await self._paths_changed.wait()
        self._paths_changed.clear()

    async def _watched_files_or_none(self) -> dict[str, set[str]] | None:
        try:
            return await self.monitor.watched_paths()
        except SessionwatchError as exc:
            log.warning("file watching paused: %s", exc)
            await asyncio.sleep(PAUSE_S)
            return None

    async def _refresh(
        self, files: dict[str, set[str]], dirs: list[str], stop: asyncio.Event
    ) -> None:
        """On a link change here or in another process, update the path-to-keys map in
        place; stop the watch (to re-arm) only when directories change."""
        while True:
            await self._links_may_have_changed()
            fresh = await self._watched_files_or_none()
            if fresh is None:
                continue
            if _dirs_of(fresh) != dirs:
                stop.set()
                return
            self._say_watching(fresh)
            fresh_keys = set().union(*fresh.values()) - set().union(*files.values())
            files.clear()
            files.update(fresh)
            if not self._polled:
                self._armed(files)()
            if fresh_keys:  # written to before the map named them: one check catches up
                self._check_soon(fresh_keys)

    def _say_watching(self, files: dict[str, set[str]]) -> None:
        """Each session watched since the last time, once: at start their number; later
        each by its key and file (an adoption and a watch that the gateway, the CLI or the
        API made while serve ran, seen here within half a second)."""
        now = {key: path for path, keys in files.items() for key in keys}
        if self._said is None:
            if now:
                log.info("watching the files of %d adopted, watched sessions", len(now))
            self._said = set()
        else:
            for key in sorted(now.keys() - self._said):
                log.info("now watching %s (%s): adopted and watched since", key, now[key])
        self._said |= now.keys()  # a key whose file came and went is not news again

    def _check_soon(self, keys: set[str]) -> None:
        """One early check of ``keys``: what changed before the watch took them in."""
        self.bus.publish(SourcesMoved(frozenset(keys), catch_up=True))


def _dirs_of(files: dict[str, set[str]]) -> list[str]:
    return sorted({os.path.dirname(p) for p in files if os.path.isdir(os.path.dirname(p))})
