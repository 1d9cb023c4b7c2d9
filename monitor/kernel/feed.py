"""Notices as they open, for a watcher that follows instead of polling.

:class:`NoticeFeed` compares a watcher's pending notices with what it already handed out
and yields the ones that opened since; the follower looks again at each change the kernel's
change hub hears (:mod:`monitor.kernel.changes`), so a notice reaches it within about
``POLL_S`` of the commit that opened it, whoever made it. A notice's text is byte-stable
while it is pending and names the sequence it was frozen at, so ``(target, text)``
identifies it: a notice drained and then opened again by new work is a new one.

The feed only peeks; draining stays an explicit call. Used by the SSE route
``GET /v1/watchers/{key}/notices/stream`` and by ``sessionwatch notices --follow``.
"""

from __future__ import annotations

from typing import Any

NoticeJson = dict[str, Any]  # {"target": str | None, "text": str}, as the peek answers it


class NoticeFeed:
    """One follower's view of a watcher's notices."""

    def __init__(self) -> None:
        self._seen: set[tuple[Any, str]] = set()

    def fresh(self, pending: list[NoticeJson]) -> list[NoticeJson]:
        """The ``pending`` notices (as the peek route answers them) not handed out yet."""
        keys = [(n["target"], n["text"]) for n in pending]
        out = [n for n, k in zip(pending, keys, strict=True) if k not in self._seen]
        self._seen = set(keys)
        return out
