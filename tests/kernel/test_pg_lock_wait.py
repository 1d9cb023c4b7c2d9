"""A peer's write while another host sits on the one write lock (cut off, stopped): the
server ends the idle holder's session, and so its lock, within the peer's lock wait, by a
margin, so the peer's write goes through on its first try, never by chance."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from monitor.clock import now_ms
from monitor.errors import StoreError
from monitor.kernel.store import open_store
from monitor.kernel.store.postgres import IDLE_IN_TRANSACTION_MS, WRITE_TIMEOUT_MS
from tests.helpers import PgServer, pg_database


def test_the_holder_s_session_ends_well_within_a_peer_s_lock_wait() -> None:
    assert WRITE_TIMEOUT_MS - IDLE_IN_TRANSACTION_MS >= 2000  # the margin, never a coin flip


async def test_a_peer_s_write_outlives_a_holder_stalled_at_the_boundary(
    pg_server: PgServer,
) -> None:
    """Host a takes the lock and stalls in its transaction past its session's idle limit
    (as when cut off mid-write); host b's write, begun as a locked, waits the whole idle
    limit at most and goes through: a's session was ended, and a's write fails."""
    url = pg_database(pg_server)
    a, b = await open_store(url, clock=now_ms), await open_store(url, clock=now_ms)
    try:
        await b.write(lambda c: c.execute("CREATE TABLE t (v INTEGER)"))
        holding = threading.Event()

        def stall(c: Any) -> None:
            c.execute("INSERT INTO t VALUES (1)")
            holding.set()
            time.sleep((IDLE_IN_TRANSACTION_MS + WRITE_TIMEOUT_MS) / 1000)  # past both

        stalled = asyncio.ensure_future(a.write(stall))
        await asyncio.to_thread(holding.wait, 10)
        await b.write(lambda c: c.execute("INSERT INTO t VALUES (2)"))  # not StoreLocked
        with pytest.raises(StoreError):
            await stalled  # the server ended its session: its write is not taken
        rows = await b.read(lambda c: c.execute("SELECT v FROM t").fetchall())
        assert [(2,)] == [tuple(r) for r in rows]
    finally:
        await a.close()
        await b.close()
