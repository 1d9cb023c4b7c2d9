"""The state database's schema: OpenClaw's four tables plus our own ``sessionwatch_`` tables.

The sidecar may open a database a gateway created first, in OpenClaw's older shape (tables
without ``STRICT``, cursors without ``watcher_store_path`` and ``provenance``, no links
table). :func:`migrate` creates what is missing and adds missing columns; it never drops,
rewrites or reorders the gateway's tables or rows.
"""

from __future__ import annotations

import sqlite3

from monitor.errors import SchemaTooNew, StoreError

TYPE_CHECKING = False

if TYPE_CHECKING:
    from monitor.kernel.store.protocol import Conn

SCHEMA_VERSION = 7

# How the links an earlier sessionwatch (schema 1) wrote map to OpenClaw's vocabulary: its
# adapter name becomes (upstream_kind, catalog_id); a paired node's host is ``node:<nodeId>``.
_LEGACY_LINK_KINDS = {
    "claude": ("claude-cli", "claude"),
    "claude-node": ("claude-cli", "claude"),
    "codex": ("codex-rollout", "codex"),
    "pi": ("pi-cli", "pi"),
    "opencode": ("opencode-cli", "opencode"),
}
LOCAL_HOST_ID = "gateway:local"

_OPENCLAW_TABLES = {
    "session_state_events": """
        CREATE TABLE IF NOT EXISTS session_state_events (
            sequence INTEGER PRIMARY KEY AUTOINCREMENT,
            dedupe_key TEXT UNIQUE,
            session_key TEXT NOT NULL,
            session_id TEXT,
            agent_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            actor_type TEXT NOT NULL,
            actor_id TEXT,
            run_id TEXT,
            occurred_at INTEGER NOT NULL,
            summary TEXT NOT NULL,
            payload_json TEXT
        ) STRICT""",
    "session_state_heads": """
        CREATE TABLE IF NOT EXISTS session_state_heads (
            session_key TEXT NOT NULL,
            agent_id TEXT NOT NULL,
            last_sequence INTEGER NOT NULL,
            pruned_max_sequence INTEGER NOT NULL DEFAULT 0,
            updated_at INTEGER NOT NULL,
            PRIMARY KEY (session_key, agent_id)
        ) STRICT""",
    "session_watch_cursors": """
        CREATE TABLE IF NOT EXISTS session_watch_cursors (
            watcher_session_key TEXT NOT NULL,
            watcher_store_path TEXT,
            target_session_key TEXT NOT NULL,
            last_seen_sequence INTEGER NOT NULL DEFAULT 0,
            notified_sequence INTEGER NOT NULL DEFAULT 0,
            material_sequence INTEGER NOT NULL DEFAULT 0,
            provenance TEXT NOT NULL DEFAULT 'explicit'
                CHECK (provenance IN ('explicit', 'ambient-group')),
            updated_at INTEGER NOT NULL,
            PRIMARY KEY (watcher_session_key, target_session_key)
        ) STRICT""",
    # OpenClaw's exact definition: its schema check compares every column, constraint and
    # index, and refuses a database that differs.
    "session_upstream_links": """
        CREATE TABLE IF NOT EXISTS session_upstream_links (
            session_key TEXT NOT NULL,
            agent_id TEXT NOT NULL,
            catalog_id TEXT NOT NULL,
            host_id TEXT NOT NULL,
            thread_id TEXT NOT NULL,
            upstream_kind TEXT NOT NULL,
            upstream_ref_json TEXT,
            last_marker_json TEXT,
            last_scanned_at INTEGER,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            PRIMARY KEY (session_key, agent_id)
        ) STRICT""",
}

# Columns an older gateway table may lack, with the clause ALTER TABLE adds them with.
_ADDABLE_COLUMNS = {
    "session_state_events": {
        "dedupe_key": "TEXT",
        "session_id": "TEXT",
        "actor_id": "TEXT",
        "run_id": "TEXT",
        "payload_json": "TEXT",
    },
    "session_state_heads": {
        "pruned_max_sequence": "INTEGER NOT NULL DEFAULT 0",
        "updated_at": "INTEGER NOT NULL DEFAULT 0",
    },
    "session_watch_cursors": {
        "watcher_store_path": "TEXT",
        "last_seen_sequence": "INTEGER NOT NULL DEFAULT 0",
        "notified_sequence": "INTEGER NOT NULL DEFAULT 0",
        "material_sequence": "INTEGER NOT NULL DEFAULT 0",
        "provenance": "TEXT NOT NULL DEFAULT 'explicit'"
        " CHECK (provenance IN ('explicit', 'ambient-group'))",
        "updated_at": "INTEGER NOT NULL DEFAULT 0",
    },
    "session_upstream_links": {
        "last_marker_json": "TEXT",
        "last_scanned_at": "INTEGER",
    },
}

INDEXES = (
    "CREATE INDEX IF NOT EXISTS idx_session_state_events_session_sequence"
    " ON session_state_events (session_key, sequence DESC)",
    "CREATE INDEX IF NOT EXISTS idx_session_state_events_time"
    " ON session_state_events (occurred_at DESC, sequence DESC)",
    "CREATE INDEX IF NOT EXISTS idx_session_watch_cursors_target"
    " ON session_watch_cursors (target_session_key)",
    "CREATE INDEX IF NOT EXISTS idx_session_upstream_links_catalog_id"
    " ON session_upstream_links (catalog_id)",
)

_OWN_TABLES = (
    """CREATE TABLE IF NOT EXISTS sessionwatch_meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) STRICT""",
    # What the sidecar knows of gateway sessions: ids, store path, whether a run is active.
    """CREATE TABLE IF NOT EXISTS sessionwatch_sessions (
        session_key TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        session_id TEXT,
        store_path TEXT,
        run_active INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (session_key, agent_id)
    ) STRICT""",
    # Self-echo memory: hashes of the last OpenClaw-side user messages, never their text.
    """CREATE TABLE IF NOT EXISTS sessionwatch_own_messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_key TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        text_hash TEXT NOT NULL,
        created_at INTEGER NOT NULL
    ) STRICT""",
    "CREATE INDEX IF NOT EXISTS idx_sessionwatch_own_messages_session"
    " ON sessionwatch_own_messages (session_key, agent_id, id DESC)",
    # Durable monitor state per link: the missing streak and the blocked offset.
    """CREATE TABLE IF NOT EXISTS sessionwatch_link_state (
        session_key TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        source_key TEXT NOT NULL,
        link_updated_at INTEGER NOT NULL,
        missing_streak INTEGER NOT NULL DEFAULT 0,
        blocked_offset INTEGER,
        blocked_reason TEXT,
        session_id TEXT,
        last_outcome TEXT,
        last_reason TEXT,
        PRIMARY KEY (session_key, agent_id)
    ) STRICT""",
    # The sidecar's own marker in a thread the gateway stopped probing (a Codex source
    # after the gateway's branch; see monitor.upstream.settle). Added within schema 6: an
    # older sidecar never reads it.
    """CREATE TABLE IF NOT EXISTS sessionwatch_source_follows (
        session_key TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        source_key TEXT NOT NULL,
        thread_id TEXT NOT NULL,
        beside_thread_id TEXT NOT NULL,
        marker_json TEXT NOT NULL,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (session_key, agent_id)
    ) STRICT""",
    # What each adopted session was doing, from when (each change, written with it; the
    # last before the past day and all since: the page's 24-hour chart; schema 7).
    """CREATE TABLE IF NOT EXISTS sessionwatch_doing_history (
        session_key TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        since INTEGER NOT NULL,
        state TEXT NOT NULL,
        PRIMARY KEY (session_key, agent_id, since)
    ) STRICT""",
    # Leases: who ticks the links without a host, which sidecar holds a host id (schema 3).
    """CREATE TABLE IF NOT EXISTS sessionwatch_leases (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        expires_at INTEGER NOT NULL,
        info TEXT
    ) STRICT""",
    # Per watcher: when its last wake went (the window) and who holds its lease to send
    # (schema 3; the lease since schema 6; see monitor.delivery.claims).
    """CREATE TABLE IF NOT EXISTS sessionwatch_wakes (
        watcher_session_key TEXT PRIMARY KEY,
        woken_at INTEGER NOT NULL,
        notice TEXT,
        holder TEXT,
        lease_until INTEGER NOT NULL DEFAULT 0
    ) STRICT""",
    # Every notice a sidecar opened, written with it: what delivery wakes and readers tail
    # (schema 6; see monitor.kernel.outbox).
    """CREATE TABLE IF NOT EXISTS sessionwatch_notice_outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        watcher_session_key TEXT NOT NULL,
        target_session_key TEXT NOT NULL,
        last_seen_sequence INTEGER NOT NULL,
        state TEXT NOT NULL,
        unanswered INTEGER NOT NULL DEFAULT 0,
        opened_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    ) STRICT""",
    "CREATE INDEX IF NOT EXISTS idx_sessionwatch_notice_outbox_watcher"
    " ON sessionwatch_notice_outbox (watcher_session_key, id)",
    "CREATE INDEX IF NOT EXISTS idx_sessionwatch_notice_outbox_due"
    " ON sessionwatch_notice_outbox (state) WHERE state IN ('wake', 'sending')",
    # The notices a sidecar process opened, by watermark: only these are ours to wake the
    # gateway for (schema 4; see monitor.kernel.cursors).
    """CREATE TABLE IF NOT EXISTS sessionwatch_opened_notices (
        watcher_session_key TEXT NOT NULL,
        target_session_key TEXT NOT NULL,
        notified_sequence INTEGER NOT NULL,
        PRIMARY KEY (watcher_session_key, target_session_key)
    ) STRICT""",
    # The "New session created" queue, per main session (schema 5; see
    # monitor.kernel.notices): durable, so that every process reads the same.
    """CREATE TABLE IF NOT EXISTS sessionwatch_created_notices (
        main_session_key TEXT NOT NULL,
        created_key TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (main_session_key, created_key)
    ) STRICT""",
)
# Columns of our own tables added after they were first created.
_OWN_ADDABLE = {
    "sessionwatch_link_state": {
        "session_id": "TEXT",
        "last_outcome": "TEXT",
        "last_reason": "TEXT",
        # what the session is doing (adapters.states), of the source ``doing_source``, and
        # the time of the last record read (``quiet`` is derived from it when read; schema
        # 7): a sidecar of schema 6 still running never reads nor clears them
        "doing": "TEXT",
        "doing_since": "INTEGER",
        "doing_source": "TEXT",
        "doing_seen_at": "INTEGER",
    },
    "sessionwatch_wakes": {
        "holder": "TEXT",
        "lease_until": "INTEGER NOT NULL DEFAULT 0",
    },
}


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _ensure_unique_dedupe_key(conn: sqlite3.Connection) -> None:
    """Recording relies on ``ON CONFLICT(dedupe_key)``: make sure a unique index backs it."""
    for row in conn.execute("PRAGMA index_list(session_state_events)"):
        name, unique = row[1], row[2]
        if unique:
            cols = [c[2] for c in conn.execute(f"PRAGMA index_info({name})")]
            if cols == ["dedupe_key"]:
                return
    conn.execute(
        "CREATE UNIQUE INDEX IF NOT EXISTS sessionwatch_events_dedupe_key"
        " ON session_state_events (dedupe_key)"
    )


def _table_shape(conn: sqlite3.Connection, table: str) -> list[tuple[object, ...]]:
    return [tuple(row[1:]) for row in conn.execute(f"PRAGMA table_info({table})")]


def _canonical_shape(table: str) -> list[tuple[object, ...]]:
    scratch = sqlite3.connect(":memory:")
    try:
        scratch.execute(_OPENCLAW_TABLES[table])
        return _table_shape(scratch, table)
    finally:
        scratch.close()


def _rebuild_links(conn: sqlite3.Connection, found: int) -> None:
    """Give ``session_upstream_links`` OpenClaw's exact shape, keeping every link and marker.

    Schema 1 of sessionwatch made ``catalog_id``, ``host_id`` and ``thread_id`` nullable and
    wrote its adapter names as kinds; their rows are carried over in OpenClaw's vocabulary.
    """
    if found != 1:  # only sessionwatch's own schema-1 table is rebuilt, never a gateway's
        return
    if _table_shape(conn, "session_upstream_links") == _canonical_shape("session_upstream_links"):
        return
    conn.execute("ALTER TABLE session_upstream_links RENAME TO sessionwatch_links_schema1")
    conn.execute("DROP INDEX IF EXISTS idx_session_upstream_links_catalog_id")
    conn.execute(_OPENCLAW_TABLES["session_upstream_links"])
    kind_case = " ".join(
        f"WHEN '{old}' THEN '{new}'" for old, (new, _) in _LEGACY_LINK_KINDS.items()
    )
    catalog_case = " ".join(
        f"WHEN '{old}' THEN '{catalog}'" for old, (_, catalog) in _LEGACY_LINK_KINDS.items()
    )
    conn.execute(
        "INSERT INTO session_upstream_links (session_key, agent_id, catalog_id, host_id,"
        " thread_id, upstream_kind, upstream_ref_json, last_marker_json, last_scanned_at,"
        " created_at, updated_at)"
        f" SELECT session_key, agent_id, CASE upstream_kind {catalog_case}"
        " ELSE coalesce(catalog_id, upstream_kind) END,"
        " coalesce(host_id, CASE WHEN upstream_kind = 'claude-node'"
        f" THEN 'node:' || json_extract(upstream_ref_json, '$.nodeId') ELSE '{LOCAL_HOST_ID}' END),"
        " coalesce(thread_id, json_extract(upstream_ref_json, '$.threadId'), ''),"
        f" CASE upstream_kind {kind_case} ELSE upstream_kind END,"
        " upstream_ref_json, last_marker_json, last_scanned_at, created_at, updated_at"
        " FROM sessionwatch_links_schema1"
    )
    conn.execute("DROP TABLE sessionwatch_links_schema1")


# The schema that first marked the notices a sidecar opened (sessionwatch_opened_notices).
OPENED_MARKS_SINCE = 4

# The schema that first kept the notice outbox (sessionwatch_notice_outbox).
OUTBOX_SINCE = 6


def fill_outbox(conn: Conn, now_ms: int) -> int:
    """An upgrade from a schema before :data:`OUTBOX_SINCE`: each pending notice a sidecar
    marked as its own gets its outbox row, so that it is woken as before (``queue`` where
    the watch policy never wakes: an ambient watch, a sub-agent watcher). How many."""
    return int(
        conn.execute(
            "INSERT INTO sessionwatch_notice_outbox (watcher_session_key, target_session_key,"
            " last_seen_sequence, state, unanswered, opened_at, updated_at)"
            " SELECT c.watcher_session_key, c.target_session_key, c.last_seen_sequence,"
            " CASE WHEN c.provenance = 'ambient-group' OR c.watcher_session_key LIKE"
            " 'agent:%:subagent:%' THEN 'queue' ELSE 'wake' END, 0, ?, ?"
            " FROM session_watch_cursors c JOIN sessionwatch_opened_notices o"
            " ON o.watcher_session_key = c.watcher_session_key"
            " AND o.target_session_key = c.target_session_key"
            " AND o.notified_sequence = c.notified_sequence"
            " WHERE c.material_sequence > c.last_seen_sequence"
            " AND c.watcher_session_key LIKE 'agent:%:%'"
            " ORDER BY c.watcher_session_key, c.target_session_key",
            (now_ms, now_ms),
        ).rowcount
    )


# Set in the same transaction as an upgrade from a schema before the marks: how many pending
# notices the upgrade left unmarked because a gateway shares the database (see
# :func:`mark_legacy_notices`).
UNDECIDED_KEY = "legacy_notices_undecided"


def foreign_tables(conn: sqlite3.Connection) -> list[str]:
    """The tables of this SQLite database that sessionwatch does not create: a gateway's.

    sessionwatch creates OpenClaw's four session-state tables and its own ``sessionwatch_``
    tables, nothing else; OpenClaw's state database holds many more of the gateway's own.
    """
    rows = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        " AND name NOT LIKE 'sessionwatch_%' ORDER BY name"
    ).fetchall()
    return [str(r[0]) for r in rows if r[0] not in _OPENCLAW_TABLES]


def made_by_sessionwatch(conn: sqlite3.Connection) -> bool:
    """Whether sessionwatch made this database: it recorded a schema version, and holds no
    table of anyone else's. A gateway's state database always holds tables of its own."""
    return read_schema_version(conn) > 0 and not foreign_tables(conn)


def mark_legacy_notices(conn: Conn, *, gateway_shares: bool) -> int:
    """An upgrade from a schema before :data:`OPENED_MARKS_SINCE`: the notices an earlier
    sidecar left pending carry no mark, so no sidecar would ever wake them.

    On a database only sessionwatch ever wrote, every pending notice was a sidecar's: each
    is marked as opened here, so it is woken once through the gateway's hooks. Where a
    gateway shares the database, its own notices cannot be told from the earlier sidecar's;
    they are left to the gateway, counted under :data:`UNDECIDED_KEY` (said at start, in the
    metrics and on the status page), and the next change this sidecar records on such a
    pair wakes it (:func:`monitor.kernel.cursors.advance_watchers`). Returns how many were
    marked."""
    pending = (
        " FROM session_watch_cursors WHERE material_sequence > last_seen_sequence"
        " AND notified_sequence > last_seen_sequence"
    )
    if gateway_shares:
        row = conn.execute("SELECT count(*)" + pending).fetchone()
        write_meta(conn, UNDECIDED_KEY, str(int(row[0]) if row else 0))
        return 0
    return int(
        conn.execute(
            "INSERT INTO sessionwatch_opened_notices (watcher_session_key, target_session_key,"
            " notified_sequence) SELECT watcher_session_key, target_session_key,"
            " notified_sequence" + pending + " ON CONFLICT (watcher_session_key,"
            " target_session_key) DO NOTHING"
        ).rowcount
    )


def read_schema_version(conn: sqlite3.Connection) -> int:
    """The recorded schema version, 0 for a database sessionwatch never opened."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sessionwatch_meta'"
    ).fetchone()
    if not exists:
        return 0
    return schema_number(read_meta(conn, "schema_version"))


def schema_number(raw: str | None) -> int:
    """A stored schema version as a number; :class:`StoreError` for one that is not a
    whole number (a database damaged, or not written by sessionwatch)."""
    if raw is None:
        return 0
    if not raw.isascii() or not raw.isdigit():
        raise StoreError(
            f"the state database's schema version is {raw!r}, not a whole number: it was not"
            " written by sessionwatch, or it is damaged; nothing was changed"
        )
    return int(raw)


def read_meta(conn: Conn, key: str) -> str | None:
    """A value of ``sessionwatch_meta``, the sidecar's own key-value table."""
    row = conn.execute("SELECT value FROM sessionwatch_meta WHERE key = ?", (key,)).fetchone()
    return str(row[0]) if row else None


def write_meta(conn: Conn, key: str, value: str) -> None:
    conn.execute(
        "INSERT INTO sessionwatch_meta (key, value) VALUES (?, ?)"
        " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


def refuse_newer(conn: sqlite3.Connection) -> int:
    """The schema version found; :class:`SchemaTooNew`, naming both versions, for a database
    a newer sessionwatch wrote. It only reads, so it runs before anything may write."""
    found = read_schema_version(conn)
    if found > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"the state database has schema version {found}, newer than this sessionwatch"
            f" understands ({SCHEMA_VERSION}); upgrade sessionwatch"
        )
    return found


def migrate(conn: sqlite3.Connection, now_ms: int) -> int:
    """Bring the schema to :data:`SCHEMA_VERSION` inside the caller's transaction.

    Returns the version found. Raises :class:`SchemaTooNew` for a newer database.
    """
    found = refuse_newer(conn)
    for table, ddl in _OPENCLAW_TABLES.items():
        conn.execute(ddl)
        present = _columns(conn, table)
        for column, clause in _ADDABLE_COLUMNS[table].items():
            if column not in present:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {clause}")
    _rebuild_links(conn, found)
    _ensure_unique_dedupe_key(conn)
    for statement in (*INDEXES, *_OWN_TABLES):
        conn.execute(statement)
    for table, columns in _OWN_ADDABLE.items():
        present = _columns(conn, table)
        for column, clause in columns.items():
            if column not in present:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {clause}")
    if 0 < found < OPENED_MARKS_SINCE:
        mark_legacy_notices(conn, gateway_shares=bool(foreign_tables(conn)))
    if 0 < found < OUTBOX_SINCE:
        fill_outbox(conn, now_ms)
    if found < SCHEMA_VERSION:
        write_meta(conn, "schema_version", str(SCHEMA_VERSION))
        conn.execute(
            "INSERT OR IGNORE INTO sessionwatch_meta (key, value) VALUES ('created_at', ?)",
            (str(now_ms),),
        )
    return found
