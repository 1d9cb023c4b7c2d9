"""Notices as they open, for a watcher that follows instead of polling.

The follower reads :meth:`monitor.kernel.Kernel.follow` at each change: the notices that
opened since its last read (from the notice outbox, so that one acknowledged a moment after
it opened, by a wake the gateway accepted at once, is still seen), then what is pending.
:class:`NoticeFeed` hands out each once. A notice's text is byte-stable while it is pending
and names the sequence it was frozen at, so ``(target, text)`` identifies it: a notice
drained and then opened again by new work is a new one.

The feed only peeks; draining stays an explicit call. Used by the SSE route
``GET /v1/watchers/{key}/notices/stream`` and by ``sessionwatch notices --follow``.
"""

from __future__ import annotations

from typing import Any

NoticeJson = dict[str, Any]  # {"target": str | None, "text": str}, as the peek answers it


class NoticeFeed:
    """One follower's view of a watcher's notices: where it follows the outbox from, and
    what it has handed out of what it last read."""

    def __init__(self) -> None:
        self.after: int | None = None  # the outbox row read last; None before the first read
        self._seen: set[tuple[Any, str]] = set()

    def fresh(self, read: tuple[list[NoticeJson], int]) -> list[NoticeJson]:
        """Of one :meth:`~monitor.kernel.Kernel.follow` answer, the notices not handed out
        yet."""
        notices, self.after = read
        keys = [(n["target"], n["text"]) for n in notices]
        out: list[NoticeJson] = []
        for n, k in zip(notices, keys, strict=True):
            if k not in self._seen:
                self._seen.add(k)
                out.append(n)
        self._seen = set(keys)
        return out
