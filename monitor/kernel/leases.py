"""The owner of ``sessionwatch_leases``: named leases with an expiry, held by one sidecar
at a time, for as long as it renews them.

Two kinds are taken: ``host:<id>`` (a sidecar's host id, unique among the live sidecars
on a store) and ``ticks:shared`` (who ticks the links without a host: OpenCode databases
and paired nodes). Taking a lease is one statement: it succeeds when the lease is free,
expired, or already ours; a lease is renewed by taking it again.

A lease's expiry is written and compared on the store's clock, read in the statement's
transaction (:func:`~monitor.kernel.store.protocol.store_now`; on PostgreSQL the
server's): a host whose wall clock is off, either way, neither takes over a live lease nor
keeps one past its time. What a holder learns is how long its lease has left
(``left_ms``), which it times on its own monotonic clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from monitor.kernel.store.protocol import NOW_SQL, store_now

if TYPE_CHECKING:
    from monitor.kernel.store.protocol import Conn


SHARED = "ticks:shared"  # who ticks the links without a host


@dataclass(frozen=True, kw_only=True, slots=True)
class Lease:
    name: str
    holder: str
    expires_at: int  # the store's clock
    info: str | None
    left_ms: int  # how long it has left, by the store's clock, as it was taken

    def held_by(self, holder: str) -> bool:
        return self.holder == holder


def take(conn: Conn, name: str, holder: str, *, ttl_ms: int, info: str = "") -> Lease:
    """Take (or renew) ``name`` for ``holder`` unless another holder's lease is live; the
    lease as it stands afterwards (held by ``holder`` or by whoever has it)."""
    now = store_now(conn)
    conn.execute(
        "INSERT INTO sessionwatch_leases (name, holder, expires_at, info) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,"
        " expires_at = excluded.expires_at, info = excluded.info"
        " WHERE sessionwatch_leases.holder = excluded.holder"
        " OR sessionwatch_leases.expires_at <= ?",
        (name, holder, now + ttl_ms, info, now),
    )
    row = conn.execute(
        "SELECT name, holder, expires_at, info FROM sessionwatch_leases WHERE name = ?", (name,)
    ).fetchone()
    expires = int(row[2])
    return Lease(name=row[0], holder=row[1], expires_at=expires, info=row[3], left_ms=expires - now)


def release(conn: Conn, name: str, holder: str) -> None:
    """Give a lease up at once (a clean stop), if it is still ours."""
    conn.execute("DELETE FROM sessionwatch_leases WHERE name = ? AND holder = ?", (name, holder))


def holds(conn: Conn, name: str, holder: str) -> bool:
    """Whether ``holder`` holds ``name`` now, by the store's clock (a holder paused past
    its lease, whose lease lapsed or went to another, does not)."""
    row = conn.execute(
        f"SELECT 1 FROM sessionwatch_leases WHERE name = ? AND holder = ?"
        f" AND expires_at > {NOW_SQL}",
        (name, holder),
    ).fetchone()
    return row is not None


def live(conn: Conn, prefix: str) -> frozenset[str]:
    """The names after ``prefix`` of the leases named ``prefix...`` that are live now, by
    the store's clock (``host:``: the hosts running on the store)."""
    rows = conn.execute(
        f"SELECT name FROM sessionwatch_leases WHERE name LIKE ? AND expires_at > {NOW_SQL}",
        (prefix + "%",),
    ).fetchall()
    return frozenset(str(name)[len(prefix) :] for (name,) in rows)


def recent_holders(conn: Conn, prefix: str, within_ms: int) -> list[tuple[str, str | None]]:
    """The holder and info of each lease named ``prefix...`` that is live, or ran out less
    than ``within_ms`` ago, by the store's clock."""
    rows = conn.execute(
        "SELECT holder, info FROM sessionwatch_leases"
        f" WHERE name LIKE ? AND expires_at > {NOW_SQL} - ? ORDER BY holder",
        (prefix + "%", within_ms),
    ).fetchall()
    return [(str(holder), info) for holder, info in rows]
