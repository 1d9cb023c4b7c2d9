"""Upgrades beside a running release: a one-shot command (``status``, ``links``, ``doctor``)
of a newer sessionwatch never migrates a database that a running ``serve`` holds, whatever
release that ``serve`` is. It refuses in one line that names the running ``serve`` and what
to do; the newer ``serve``, once started, upgrades the database and says so once.

A ``serve`` holds a database while its host lease (``host:<id>``, see
:mod:`monitor.kernel.leases`) is live on the store's clock, or, on SQLite, while the pid in
its instance lock file lives. A lease that ran out less than :data:`GRACE_MS` ago still counts: a
``serve`` paused, or between two renewals, is still running. A clean stop gives its lease
up at once.
"""

from __future__ import annotations

import logging

from monitor import __version__
from monitor.errors import StoreError

TYPE_CHECKING = False  # typing costs a one-shot command's start (tests/test_cli_argv.py)

if TYPE_CHECKING:
    from monitor.kernel.store.protocol import Conn

log = logging.getLogger(__name__)

GRACE_MS = 60_000
RELEASE_PREFIX = "sessionwatch "  # a host lease's info: the release of the serve holding it


class SchemaInUse(StoreError):
    """An older schema that a running ``serve`` uses: a one-shot command does not upgrade it."""


def release_info() -> str:
    """What a ``serve`` writes into its host lease: its release."""
    return f"{RELEASE_PREFIX}{__version__}"


def running_serves(conn: Conn) -> list[str]:
    """Each ``serve`` whose host lease is live (or ran out less than a minute ago, by the
    store's clock), as a person reads it: its release when it says it, and its machine and
    pid."""
    from monitor.kernel.leases import recent_holders  # only for a schema to upgrade

    try:
        rows = recent_holders(conn, "host:", GRACE_MS)
    except Exception:  # a schema before leases: no serve of it takes one
        return []
    return [_who(str(holder), info) for holder, info in rows]


def _who(holder: str, info: object) -> str:
    machine_pid = ":".join(holder.split(":")[:2])
    said = str(info) if isinstance(info, str) and info.startswith(RELEASE_PREFIX) else ""
    return f"{said or 'an earlier release'} on {machine_pid}"


def refuse_under_serve(shown: str, found: int, target: int, serves: list[str]) -> None:
    """:class:`SchemaInUse`, in one line, when ``serves`` run on a database at the older
    schema ``found``."""
    if not serves or not 0 < found < target:
        return
    raise SchemaInUse(
        f"the state database {shown} is at schema {found}, and a running serve uses it"
        f" ({'; '.join(serves)}): this sessionwatch {__version__} would upgrade it to schema"
        f" {target} under it, so it leaves it as it is. Stop that serve and start this"
        " release's serve (it upgrades the database at start), or use the running release's"
        " own commands"
    )


def say_upgraded(shown: str, found: int, target: int) -> None:
    """The one line an upgrade leaves in the log."""
    if 0 < found < target:
        log.warning("upgraded the state database %s from schema %d to %d", shown, found, target)
