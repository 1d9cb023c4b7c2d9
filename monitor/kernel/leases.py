"""The owner of ``sessionwatch_leases``: named leases with an expiry, held by one sidecar
at a time, for as long as it renews them.

Two kinds are taken: ``host:<id>`` (a sidecar's host id, unique among the live sidecars
on a store) and ``ticks:shared`` (who ticks the links without a host: OpenCode databases
and paired nodes). Taking a lease is one statement: it succeeds when the lease is free,
expired, or already ours; a lease is renewed by taking it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from monitor.kernel.store.protocol import Conn


@dataclass(frozen=True, kw_only=True, slots=True)
class Lease:
    name: str
    holder: str
    expires_at: int
    info: str | None

    def held_by(self, holder: str) -> bool:
        return self.holder == holder


def take(conn: Conn, name: str, holder: str, *, now: int, ttl_ms: int, info: str = "") -> Lease:
    """Take (or renew) ``name`` for ``holder`` unless another holder's lease is live; the
    lease as it stands afterwards (held by ``holder`` or by whoever has it)."""
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
    return Lease(name=row[0], holder=row[1], expires_at=int(row[2]), info=row[3])


def release(conn: Conn, name: str, holder: str) -> None:
    """Give a lease up at once (a clean stop), if it is still ours."""
    conn.execute("DELETE FROM sessionwatch_leases WHERE name = ? AND holder = ?", (name, holder))
