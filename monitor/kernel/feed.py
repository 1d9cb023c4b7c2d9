"""Notices as they open, for a watcher that follows instead of polling.

:class:`NoticeFeed` compares a watcher's pending notices with what it already handed out
and yields the ones that opened since. It looks again whenever the database changed
(the store's ``version()``: SQLite's ``PRAGMA data_version``, which moves with every commit
of another connection, or PostgreSQL's ``NOTIFY`` count, which moves with every commit of
any sidecar on any host), checked every ``POLL_S``; so a notice reaches the follower within
about that long of the commit that opened it, whoever made it. A notice's text is
byte-stable while it is pending and names the sequence it was frozen at, so ``(target,
text)`` identifies it: a notice drained and then opened again by new work is a new one.

The feed only peeks; draining stays an explicit call. Used by the SSE route
``GET /v1/watchers/{key}/notices/stream`` and by ``sessionwatch notices --follow``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

POLL_S = 0.2
KEEPALIVE_S = 15.0

Notice = dict[str, Any]  # {"target": str | None, "text": str}


class NoticeFeed:
    """One follower's view: when :meth:`changed` says to look, peek and pass the pending
    notices to :meth:`fresh`."""

    def __init__(self, version: Callable[[], int]) -> None:
        self._version = version  # the store's change counter
        self._seen: set[tuple[Any, str]] = set()
        self._at: int | None = None

    def changed(self) -> bool:
        """Whether the database changed since the last look (True the first time)."""
        now = self._version()
        moved = now != self._at
        self._at = now
        return moved

    def fresh(self, pending: list[Notice]) -> list[Notice]:
        """The ``pending`` notices (as the peek route answers them) not handed out yet."""
        keys = [(n["target"], n["text"]) for n in pending]
        out = [n for n, k in zip(pending, keys, strict=True) if k not in self._seen]
        self._seen = set(keys)
        return out
