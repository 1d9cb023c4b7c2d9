"""Linux's inotify on the event loop: the process sleeps until the kernel says a watched
directory changed.

watchfiles (the fallback where there is no inotify) runs its Rust watcher on a thread that
steps every 50 ms, some 20 wakeups a second with nothing written; here nothing runs between
two changes. Only what the service needs: watch directories (not recursively), and read
the names that changed in them, as batches of paths. ``libc`` through :mod:`ctypes`, as
the kernel's interface is three calls and a fixed record.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import os
import struct
import sys
from collections.abc import AsyncIterator, Callable

IN_MODIFY = 0x2
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

# what a change to a file in a watched directory is: written, created, replaced, removed
# (not IN_CLOSE_WRITE: a reader that opened the file read-write, as SQLite does, and wrote
# nothing raises it when it closes)
CHANGES = IN_MODIFY | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
# the directory itself went away or moved: the watch must be armed again
GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED

_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len; then the name, NUL-padded


class Ended(Exception):
    """The watch tells nothing more: watch again what exists now, and look at everything."""


class Overflow(Ended):
    """The kernel's queue overflowed: changes were lost, every watched path may have moved."""


class DirectoryGone(Ended):
    """A watched directory was removed or moved."""


class Closed(Ended):
    """The watch was closed while it was waited on."""


def available() -> bool:
    """Whether this platform has inotify (Linux)."""
    return sys.platform.startswith("linux") and _libc() is not None


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL | None:
    global _LIBC
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            lib.inotify_init1.argtypes = [ctypes.c_int]
            lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        except (OSError, AttributeError):
            return None
        _LIBC = lib
    return _LIBC


class Inotify:
    """One inotify instance: its watches, and reads of what changed."""

    def __init__(self) -> None:
        lib = _libc()
        if lib is None:
            raise OSError(errno.ENOSYS, "inotify is not available here")
        self._lib = lib
        fd = lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self.fd: int = fd
        self._dirs: dict[int, str] = {}
        # the loop the descriptor is registered with while :meth:`changed` waits, and the
        # wait: closing removes the registration first (a descriptor closed while the loop
        # holds it leaves a stale entry that the next socket given its number collides with)
        self._waiting: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None

    def watch_dir(self, path: str, mask: int = CHANGES) -> None:
        """Watch the directory ``path`` (not its subdirectories). OSError: it cannot be
        (gone, not a directory, no watches left: ``max_user_watches``)."""
        wd = self._lib.inotify_add_watch(self.fd, os.fsencode(path), mask | IN_ONLYDIR)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{os.strerror(err)}: {path}")
        self._dirs[wd] = path

    async def changed(self) -> set[str]:
        """The paths that changed, once at least one did (every event the kernel holds by
        then, in one batch). Raises :class:`Overflow` or :class:`DirectoryGone`."""
        while True:
            if self.fd < 0:
                raise Closed("the watch was closed")
            paths = self._drain()
            if paths:
                return paths
            loop = asyncio.get_running_loop()
            readable: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self.fd, _resolve, readable)
            self._waiting = (loop, readable)
            try:
                await readable
            finally:
                self._unregister()

    def wait(self, timeout: float, *gone: int) -> tuple[set[str], bool]:
        """Blocking, for a command without an event loop: the paths that changed, once one
        did or ``timeout`` s passed, and whether one of the ``gone`` descriptors hung up or
        failed (a pipe whose reader went away) meanwhile."""
        import select

        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        for fd in gone:
            poller.register(fd, select.POLLERR | select.POLLHUP)
        ready = poller.poll(max(int(timeout * 1000), 0))
        hung = any(fd != self.fd for fd, _ in ready)
        return (self._drain() if any(fd == self.fd for fd, _ in ready) else set()), hung

    def _drain(self) -> set[str]:
        paths: set[str] = set()
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return paths
            at = 0
            while at + _HEADER.size <= len(data):
                wd, mask, _, size = _HEADER.unpack_from(data, at)
                name = data[at + _HEADER.size : at + _HEADER.size + size].rstrip(b"\0")
                at += _HEADER.size + size
                if mask & IN_Q_OVERFLOW:
                    raise Overflow("the inotify queue overflowed")
                if mask & GONE:
                    raise DirectoryGone(self._dirs.get(wd, "?"))
                where = self._dirs.get(wd)
                if where is not None and name:
                    paths.add(os.path.join(where, os.fsdecode(name)))

    def _unregister(self) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            loop, readable = waiting
            if not loop.is_closed():
                loop.remove_reader(self.fd)
            _resolve(readable)  # a wait in progress ends: it finds the watch closed

    def close(self) -> None:
        """Close the descriptor, once; a wait on it ends with :class:`Closed`."""
        if self.fd < 0:
            return
        self._unregister()
        fd, self.fd = self.fd, -1
        with contextlib.suppress(OSError):
            os.close(fd)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def watch_dirs(
    dirs: list[str], stop: asyncio.Event, *, armed: Callable[[], None] | None = None
) -> AsyncIterator[set[str]]:
    """The paths that changed in ``dirs``, a batch at a time, until ``stop`` is set;
    ``armed`` is called once every watch is in place. A directory gone or a queue overflow
    ends the iteration with the exception (the caller watches again, and checks everything
    once)."""
    notify = Inotify()
    try:
        for path in dirs:
            notify.watch_dir(path)
        if armed is not None:
            armed()
        stopped = asyncio.ensure_future(stop.wait())
        changed: asyncio.Future[set[str]] | None = None
        try:
            while not stop.is_set():
                changed = asyncio.ensure_future(notify.changed())
                await asyncio.wait([changed, stopped], return_when=asyncio.FIRST_COMPLETED)
                if not changed.done():
                    return
                yield changed.result()
        finally:
            stopped.cancel()
            if changed is not None and not changed.done():  # stopped, or cancelled itself
                changed.cancel()
    finally:
        notify.close()
