"""What the kernel answers without writing: a session's status and changes, state
versions, what people typed lately, a session's recent events, every pending notice, and
the fingerprint the status page watches. Each answer is one read of the store."""

from __future__ import annotations

from monitor.errors import BadInput
from monitor.kernel import cursors
from monitor.kernel.keys import normalize_key, resolve_agent
from monitor.kernel.signal_log import (
    Activity,
    SessionStatus,
    StateVersion,
    human_activity,
    last_sequence,
    recent_events,
    session_status,
    state_versions,
    status_answer,
)

TYPE_CHECKING = False

if TYPE_CHECKING:
    from monitor.kernel.events import StateEvent
    from monitor.kernel.notices import Notice
    from monitor.kernel.store.protocol import StateStore


class Views:
    """The kernel's read-only answers over its store: the half of
    :class:`~monitor.kernel.kernel.Kernel` that writes nothing (it is their class)."""

    store: StateStore

    async def status(
        self, key: str, *, agent_id: str | None = None, changes_since: int | None = None
    ) -> SessionStatus:
        """A session's state version, and its changes after ``changes_since`` on ask."""
        k, agent = _scope(key, agent_id, changes_since)
        return await self.store.peek(lambda conn: session_status(conn, k, agent, changes_since))

    async def changes_answer(self, key: str, *, agent_id: str | None, since: int) -> bytes:
        """``session_status`` with ``changesSince``, as the JSON the API answers, built by
        the database (:func:`~monitor.kernel.signal_log.status_answer`)."""
        k, agent = _scope(key, agent_id, since)
        return await self.store.peek(lambda c: status_answer(c, k, agent, since), single=True)

    async def state_versions(self, keys: list[str]) -> list[StateVersion]:
        """The state version per session; all sessions with a head when ``keys`` is empty."""
        wanted = [normalize_key(k) for k in keys]
        return await self.store.read(lambda conn: state_versions(conn, wanted))

    async def activity(self) -> dict[str, Activity]:
        """Per session key: when a person last typed into it, and the turns of the last
        hour and day."""
        now = self.store.clock()
        return await self.store.peek(lambda conn: human_activity(conn, now))

    async def recent_events(self, key: str, limit: int = 50) -> list[StateEvent]:
        """The newest events of one session, newest first (metadata and summaries only,
        as the log holds)."""
        k = normalize_key(key)
        return await self.store.peek(lambda conn: recent_events(conn, k, limit))

    async def fingerprint(self) -> tuple[int, tuple[int, int, int]]:
        """Moves with every event logged and every cursor that moved (the status page)."""
        return await self.store.peek(lambda conn: (last_sequence(conn), cursors.progress(conn)))

    async def all_pending(self) -> list[Notice]:
        """Every watcher's pending notices, whoever opened them."""
        return await self.store.peek(lambda conn: [c.notice() for c in cursors.list_pending(conn)])

    async def pending(self) -> list[Notice]:
        """Every watcher's pending notices that a sidecar opened (this process or another):
        what it may wake the gateway for. A gateway's own notices are its own to deliver."""
        return await self.store.peek(
            lambda conn: [c.notice() for c in cursors.list_pending(conn, opened_here=True)]
        )


def _scope(key: str, agent_id: str | None, since: int | None) -> tuple[str, str]:
    """The session's key and agent, from what a caller asked; a bad ``since`` refused."""
    k = normalize_key(key)
    agent = resolve_agent(k, agent_id)
    if since is not None and since < 0:
        raise BadInput("changesSince must be a non-negative integer")
    return k, agent
