"""Stale-state notices: their byte-stable text, and the "New session created" queue.

A notice is derived from a durable cursor (``material > last_seen``), so every process that
opens the database sees the same pending notices. The created-session queue is kept in the
database too (``sessionwatch_created_notices``, bounded per main session), written in the
transaction that records ``created``: so ``sessionwatch session`` queues what ``PUT
/v1/sessions/{key}`` does, and ``sessionwatch notices`` reads what the API does.
"""

from __future__ import annotations

from monitor.records import NamedTuple

TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

    from monitor.kernel.store.protocol import Conn

CREATED_SUMMARY_CAP = 8192
CREATED_QUEUE_CAP = 100  # created sessions kept per main session
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


# -- the "New session created" queue: the owner of sessionwatch_created_notices ----------


def queue_created(conn: Conn, main_session: str, created_key: str, now: int) -> None:
    """Queue ``created_key`` for ``main_session``'s next read of its notices, in the
    transaction that records ``created``: the newest :data:`CREATED_QUEUE_CAP` are kept."""
    conn.execute(
        "INSERT INTO sessionwatch_created_notices (main_session_key, created_key, created_at)"
        " VALUES (?, ?, ?) ON CONFLICT (main_session_key, created_key)"
        " DO UPDATE SET created_at = excluded.created_at",
        (main_session, created_key, now),
    )
    conn.execute(
        "DELETE FROM sessionwatch_created_notices WHERE main_session_key = ? AND created_key"
        " NOT IN (SELECT created_key FROM sessionwatch_created_notices"
        " WHERE main_session_key = ? ORDER BY created_at DESC, created_key DESC LIMIT ?)",
        (main_session, main_session, CREATED_QUEUE_CAP),
    )


def created_text(conn: Conn, main_session: str, *, drain: bool = False) -> str | None:
    """The batched "New session created" notice of ``main_session``, newest first and
    capped at :data:`CREATED_SUMMARY_CAP` characters (so the cap drops the oldest); with
    ``drain``, the queue is emptied in the same transaction."""
    rows = conn.execute(
        "SELECT created_key FROM sessionwatch_created_notices WHERE main_session_key = ?"
        " ORDER BY created_at DESC, created_key DESC",
        (main_session,),
    ).fetchall()
    if not rows:
        return None
    if drain:
        conn.execute(
            "DELETE FROM sessionwatch_created_notices WHERE main_session_key = ?",
            (main_session,),
        )
    text = CREATED_HEADER
    for (key,) in rows:
        line = f"- New session created: {key}"
        if len(text) + 1 + len(line) > CREATED_SUMMARY_CAP:
            break
        text += "\n" + line
    return text


class Inbox(NamedTuple):
    """What a watcher reads: its pending stale-state notices, and (for a main session) the
    batched "New session created" notice. The API and the CLI answer it alike."""

    notices: list[Notice]
    created: str | None = None

    def as_json(self) -> list[dict[str, Any]]:
        out = [n.as_json() for n in self.notices]
        if self.created is not None:
            out.append({"target": None, "text": self.created})
        return out
