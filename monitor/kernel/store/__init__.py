"""Which store a target names: a ``postgresql://`` URL, else a SQLite file. The stores are
imported only when opened, so a one-shot command on SQLite never loads psycopg."""

from __future__ import annotations

from collections.abc import Callable

from monitor.clock import Clock
from monitor.config import is_pg_url

TYPE_CHECKING = False

if TYPE_CHECKING:
    from pathlib import Path

    from monitor.kernel.store.protocol import StateStore


async def open_store(
    target: Path | str,
    *,
    clock: Clock,
    direct: bool = False,
    on_error: Callable[[], None] | None = None,
) -> StateStore:
    """The store ``target`` names: a ``postgresql://`` URL, else a SQLite file (``direct``:
    on the calling thread, for one-shot commands; else group commit on a writer thread)."""
    if is_pg_url(target):
        from monitor.kernel.store.postgres import PgStore

        return await PgStore.open(target, clock=clock, on_error=on_error, one_shot=direct)
    if direct:
        from monitor.kernel.store.sqlite_conn import DirectStore

        direct_store = await DirectStore.open(target, clock=clock)
        direct_store.on_error = on_error
        return direct_store
    from monitor.kernel.store.sqlite import Store

    return await Store.open(target, clock=clock, on_error=on_error)
