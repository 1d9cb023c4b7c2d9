"""The owner of ``sessionwatch_sessions`` (what the sidecar knows of gateway sessions) and
``sessionwatch_own_messages`` (the hashes of OpenClaw-side messages, for self-echo): all
their SQL."""

from __future__ import annotations

from collections import defaultdict

from monitor.records import NamedTuple

TYPE_CHECKING = False

if TYPE_CHECKING:
    from monitor.kernel.store.protocol import Conn


class SessionRow(NamedTuple):
    """What the sidecar knows of one gateway session."""

    session_key: str
    agent_id: str
    session_id: str | None
    store_path: str | None
    run_active: bool
    created_at: int
    updated_at: int


SessionFlags = tuple[str | None, bool]  # the session id, and whether a run is active


def write_session_row(
    conn: Conn,
    key: str,
    agent_id: str,
    *,
    session_id: str | None,
    now: int,
    store_path: str | None = None,
    run_active: bool | None = None,
) -> bool:
    """Create or update a known session (None leaves a field as it is); True if it existed."""
    existed = conn.execute(
        "SELECT 1 FROM sessionwatch_sessions WHERE session_key = ? AND agent_id = ?",
        (key, agent_id),
    ).fetchone()
    conn.execute(
        "INSERT INTO sessionwatch_sessions (session_key, agent_id, session_id,"
        " store_path, run_active, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(session_key, agent_id) DO UPDATE SET"
        " session_id = coalesce(excluded.session_id, sessionwatch_sessions.session_id),"
        " store_path = coalesce(excluded.store_path, sessionwatch_sessions.store_path),"
        " run_active = CASE WHEN CAST(? AS INTEGER) IS NULL"
        " THEN sessionwatch_sessions.run_active ELSE excluded.run_active END,"
        " updated_at = excluded.updated_at",
        (key, agent_id, session_id, store_path, int(bool(run_active)), now, now, _int(run_active)),
    )
    return existed is not None


def read_session(conn: Conn, key: str, agent_id: str) -> SessionRow | None:
    row = conn.execute(
        "SELECT session_key, agent_id, session_id, store_path, run_active, created_at,"
        " updated_at FROM sessionwatch_sessions WHERE session_key = ? AND agent_id = ?",
        (key, agent_id),
    ).fetchone()
    if row is None:
        return None
    return SessionRow(row[0], row[1], row[2], row[3], bool(row[4]), row[5], row[6])


def session_flags(conn: Conn, key: str, agent_id: str) -> SessionFlags | None:
    row = conn.execute(
        "SELECT session_id, run_active FROM sessionwatch_sessions"
        " WHERE session_key = ? AND agent_id = ?",
        (key, agent_id),
    ).fetchone()
    return (row[0], bool(row[1])) if row else None


def all_session_flags(conn: Conn) -> dict[tuple[str, str], SessionFlags]:
    return {
        (r[0], r[1]): (r[2], bool(r[3]))
        for r in conn.execute(
            "SELECT session_key, agent_id, session_id, run_active FROM sessionwatch_sessions"
        )
    }


def remember_own(conn: Conn, key: str, agent_id: str, digest: str, now: int, limit: int) -> None:
    """Remember one own message's hash; only the newest ``limit`` per session are kept."""
    conn.execute(
        "INSERT INTO sessionwatch_own_messages (session_key, agent_id, text_hash,"
        " created_at) VALUES (?, ?, ?, ?)",
        (key, agent_id, digest, now),
    )
    conn.execute(
        "DELETE FROM sessionwatch_own_messages WHERE session_key = ? AND agent_id = ?"
        " AND id NOT IN (SELECT id FROM sessionwatch_own_messages WHERE session_key = ?"
        " AND agent_id = ? ORDER BY id DESC LIMIT ?)",
        (key, agent_id, key, agent_id, limit),
    )


def recent_own(conn: Conn, limit: int) -> dict[tuple[str, str], list[tuple[int, str]]]:
    """Per session, its newest ``limit`` own messages as ``(id, hash)``, oldest first."""
    own: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for row_id, key, agent, digest in conn.execute(
        "SELECT id, session_key, agent_id, text_hash FROM (SELECT id, session_key, agent_id,"
        " text_hash, row_number() OVER (PARTITION BY session_key, agent_id ORDER BY id DESC)"
        " AS n FROM sessionwatch_own_messages) AS recent WHERE n <= ? ORDER BY id",
        (limit,),
    ):
        own[(key, agent)].append((row_id, digest))
    return own


def forget_own(conn: Conn, ids: list[int]) -> None:
    """Own messages that suppressed an upstream prompt are used up."""
    conn.executemany("DELETE FROM sessionwatch_own_messages WHERE id = ?", [(i,) for i in ids])


def forget_session_own(conn: Conn, key: str) -> None:
    """A reset: the session's self-echo memory goes."""
    conn.execute("DELETE FROM sessionwatch_own_messages WHERE session_key = ?", (key,))


def delete_sessions(conn: Conn, scope: str, params: tuple[str, ...]) -> None:
    """Remove the known sessions and own messages of a ``keys.session_scope``."""
    conn.execute(f"DELETE FROM sessionwatch_own_messages WHERE {scope}", params)
    conn.execute(f"DELETE FROM sessionwatch_sessions WHERE {scope}", params)


def _int(flag: bool | None) -> int | None:
    return None if flag is None else int(flag)
