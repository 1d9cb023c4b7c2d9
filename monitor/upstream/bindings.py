"""What the gateway's own state says a link it drives probes (see
:class:`adapters.base.GatewayBound`): the bindings its plugins keep in
``plugin_state_entries`` of its state database, read in the tick's snapshot.

Read only next to the gateway's own SQLite state database; where the table is not there,
every link reads its own ref.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from adapters.base import GatewayBound, Ref

if TYPE_CHECKING:
    from monitor.kernel.store.protocol import Conn
    from monitor.upstream.links import UpstreamLink


class Bound(NamedTuple):
    """What the gateway's state says of the links it drives: the ref to read where it is
    not the link's own, why a link waits (the gateway is working on its source), and the
    thread the sidecar follows beside the probed one (the source the gateway left)."""

    refs: dict[tuple[str, str], Ref]
    busy: dict[tuple[str, str], str]
    follows: dict[tuple[str, str], tuple[str, str]]  # the followed thread, the probed one


NONE = Bound({}, {}, {})


def probe_refs(
    conn: Conn,
    bound: Iterable[tuple[UpstreamLink, GatewayBound]],
    session_id: Callable[[UpstreamLink], str | None],
    now: int,
) -> Bound:
    """For each link whose adapter reads another ref than the link's own, that ref; and
    the links the gateway is busy with."""
    wanted = {
        adapter.binding_entry(link.agent_id, link.session_key): (link, adapter)
        for link, adapter in bound
        if link.thread_id
    }
    if not wanted or not _has_table(conn):
        return NONE
    stored: dict[tuple[str, str, str], Any] = {}
    for plugin, namespace, key in wanted:
        row = conn.execute(
            "SELECT value_json FROM plugin_state_entries WHERE plugin_id = ? AND namespace = ?"
            " AND entry_key = ? AND (expires_at IS NULL OR expires_at > ?)",
            (plugin, namespace, key, now),
        ).fetchone()
        # an unreadable binding is no binding, as the gateway reads it too
        with contextlib.suppress(orjson.JSONDecodeError):
            stored[(plugin, namespace, key)] = orjson.loads(row[0]) if row else None
    found = Bound({}, {}, {})
    for entry, (link, adapter) in wanted.items():
        assert link.thread_id is not None
        binding = stored.get(entry)
        ref = adapter.probed_ref(link.ref, link.thread_id, binding, session_id(link))
        if ref != link.ref:
            found.refs[link.key] = ref
        follow = adapter.followed(ref)
        if follow is not None:
            found.follows[link.key] = follow
        reason = adapter.busy(binding, now)
        if reason:
            found.busy[link.key] = reason
    return found


def _has_table(conn: Conn) -> bool:
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'plugin_state_entries'"
    ).fetchone()
    return row is not None
