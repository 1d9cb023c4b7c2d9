"""Stale-state notices: their byte-stable text and the "session created" queue.

A notice is derived from a durable cursor (``material > last_seen``), so every process that
opens the database sees the same pending notices; nothing here is the source of truth.
"""

from __future__ import annotations

from collections import OrderedDict

from monitor.records import NamedTuple

TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

CREATED_SUMMARY_CAP = 8192
CREATED_HEADER = "Recent session creations (bounded summary; older entries may be omitted):"
PROVENANCE_EXPLICIT = "explicit"
PROVENANCE_AMBIENT = "ambient-group"


def notice_text(target: str, last_seen: int) -> str:
    """The stale-state notice, byte-stable while it is pending."""
    return (
        f'Session "{target}" changed (other actor). Reconcile before acting: '
        f'session_status sessionKey "{target}" changesSince {last_seen}.'
    )


class Notice(NamedTuple):
    """One pending stale-state notice for a watcher/target pair."""

    watcher: str
    store_path: str | None
    target: str
    last_seen: int
    provenance: str

    @property
    def text(self) -> str:
        return notice_text(self.target, self.last_seen)

    @property
    def queue_only(self) -> bool:
        """Ambient watchers find the notice on their next turn; they are never woken."""
        return self.provenance == PROVENANCE_AMBIENT

    def as_json(self) -> dict[str, Any]:
        return {"target": self.target, "text": self.text}


class CreatedNotices:
    """The bounded in-memory "New session created" queue, one batch per main session."""

    def __init__(self, *, max_entries: int = 100) -> None:
        self._max_entries = max_entries
        self._pending: dict[str, OrderedDict[str, None]] = {}

    def add(self, main_session: str, created_key: str) -> None:
        entries = self._pending.setdefault(main_session, OrderedDict())
        entries[created_key] = None
        entries.move_to_end(created_key)
        while len(entries) > self._max_entries:
            entries.popitem(last=False)

    def peek(self, main_session: str) -> str | None:
        entries = self._pending.get(main_session)
        if not entries:
            return None
        lines = [f"- New session created: {key}" for key in reversed(entries)]
        text = CREATED_HEADER
        for line in lines:  # newest first, so the cap drops the oldest
            if len(text) + 1 + len(line) > CREATED_SUMMARY_CAP:
                break
            text += "\n" + line
        return text

    def drain(self, main_session: str) -> str | None:
        text = self.peek(main_session)
        self._pending.pop(main_session, None)
        return text
