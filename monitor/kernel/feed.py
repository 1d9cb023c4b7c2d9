"""Notices as they open, for a watcher that follows instead of polling.

:class:`NoticeFeed` compares a watcher's pending notices with what it already handed out
and yields the ones that opened since. It looks again whenever the database changed
(``PRAGMA data_version`` moves with every commit of another connection: the service's
writer, the monitor, a CLI process, a gateway sharing the file), checked every
``POLL_S``; so a notice reaches the follower within about that long of the commit that
opened it, whoever made it. A notice's text is byte-stable while it is pending and names
the sequence it was frozen at, so ``(target, text)`` identifies it: a notice drained and
then opened again by new work is a new one.

The feed only peeks; draining stays an explicit call. Used by the SSE route
``GET /v1/watchers/{key}/notices/stream`` and by ``sessionwatch notices --follow``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

POLL_S = 0.2
KEEPALIVE_S = 15.0

Notice = dict[str, Any]  # {"target": str | None, "text": str}


def data_version(conn: sqlite3.Connection) -> int:
    """SQLite's counter of commits by other connections (``PRAGMA data_version``)."""
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


class NoticeFeed:
    """One follower's view: when :meth:`changed` says to look, peek and pass the pending
    notices to :meth:`fresh`."""

    def __init__(self, read: Callable[[Callable[[sqlite3.Connection], int]], int]) -> None:
        self._read = read  # runs a small read on the connection the feed watches
        self._seen: set[tuple[Any, str]] = set()
        self._at: int | None = None

    def changed(self) -> bool:
        """Whether the database changed since the last look (True the first time)."""
        now = self._read(data_version)
        moved = now != self._at
        self._at = now
        return moved

    def fresh(self, pending: list[Notice]) -> list[Notice]:
        """The ``pending`` notices (as the peek route answers them) not handed out yet."""
        keys = [(n["target"], n["text"]) for n in pending]
        out = [n for n, k in zip(pending, keys, strict=True) if k not in self._seen]
        self._seen = set(keys)
        return out
