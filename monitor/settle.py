"""The tick's one transaction per link: what a check found, settled beside ``record_event``.

Compare-and-set against the link as it was when the scan began: a link refreshed mid-scan
records nothing and writes no marker. In the same transaction: the ``human_direct_message``
(or ``upstream_missing``) event, the ``compacted`` events of native compactions, the marker
(or the link's deletion), the self-echo memory the check used up, and the link's state
(missing streak, blocked offset, last outcome and its reason, shown by ``links``).
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass
from typing import Any

import orjson

from adapters.base import Outcome
from monitor.events import ActorType, EventKind
from monitor.links import LinkState, UpstreamLink, link_state, read_link, write_link_state
from monitor.signal_log import Recorded, make_draft, record_event

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkResult:
    session_key: str
    outcome: str
    turns: int = 0
    reason: str | None = None
    adapter: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "sessionKey": self.session_key,
            "outcome": self.outcome,
            "turns": self.turns,
            "reason": self.reason,
        }


Settled = tuple[LinkResult, list[Recorded]]


def settle(
    conn: sqlite3.Connection, link: UpstreamLink, outcome: Outcome, now: int, threshold: int
) -> Settled:
    """Settle one check of ``link`` (see the module docstring)."""
    key = link.session_key
    current = read_link(conn, key, link.agent_id)
    if current is None or current.updated_at != link.updated_at or current.ref != link.ref:
        return LinkResult(
            session_key=key, outcome="skipped", reason="link changed during the scan"
        ), []
    session = conn.execute(
        "SELECT session_id, run_active FROM sessionwatch_sessions"
        " WHERE session_key = ? AND agent_id = ?",
        (key, link.agent_id),
    ).fetchone()
    if session and session[1]:
        return LinkResult(session_key=key, outcome="skipped", reason="run active"), []
    session_id = session[0] if session else None
    before = link_state(conn, link, session_id)
    if outcome.status == "missing":
        return _missing(conn, link, session_id, before.streak + 1, now, threshold, outcome.reason)
    if outcome.status == "blocked":
        assert outcome.blocked_offset is not None
        if before.blocked_offset != outcome.blocked_offset:
            log.warning("%s: blocked: %s", key, outcome.reason)
        state = LinkState(blocked_offset=outcome.blocked_offset, outcome="blocked")
        write_link_state(conn, link, session_id, state, outcome.reason or "blocked")
        return LinkResult(session_key=key, outcome="blocked", reason=outcome.reason), []
    if outcome.status == "inconclusive" or outcome.marker is None:
        if before.reason != outcome.reason:
            log.warning("%s: inconclusive: %s", key, outcome.reason)
        state = LinkState(outcome="inconclusive", reason=outcome.reason)
        write_link_state(conn, link, session_id, state)
        return LinkResult(session_key=key, outcome="inconclusive", reason=outcome.reason), []
    recorded = [_compacted(conn, link, native, now) for native in outcome.compactions]
    if outcome.turns:
        recorded.append(_human_turns(conn, link, outcome, now))
    _forget_own(conn, outcome.consumed_own)
    conn.execute(
        "UPDATE session_upstream_links SET last_marker_json = ?, last_scanned_at = ?"
        " WHERE session_key = ? AND agent_id = ? AND updated_at = ?",
        (orjson.dumps(outcome.marker).decode(), now, key, link.agent_id, link.updated_at),
    )
    status = "activity" if outcome.turns else "quiet"
    noted = status if outcome.reason else None  # a plain check leaves no status behind
    write_link_state(conn, link, session_id, LinkState(outcome=noted, reason=outcome.reason))
    return LinkResult(
        session_key=key, outcome=status, turns=len(outcome.turns), reason=outcome.reason
    ), recorded


def _channel(link: UpstreamLink) -> str:
    return link.catalog_id or link.kind or link.upstream_kind


def _human_turns(
    conn: sqlite3.Connection, link: UpstreamLink, outcome: Outcome, now: int
) -> Recorded:
    turns = len(outcome.turns)
    payload: dict[str, Any] = {"channel": _channel(link)}
    if turns > 1:
        payload["turns"] = turns
    draft = make_draft(
        session_key=link.session_key,
        agent_id=link.agent_id,
        kind=EventKind.HUMAN_DIRECT_MESSAGE,
        actor_type=ActorType.HUMAN,
        now=now,
        payload=payload,
        occurred_at=outcome.latest_at,
        dedupe_key=f"upstream:{link.session_key}:{link.source_key}:{outcome.dedupe_id}",
    )
    return record_event(conn, draft, now)


def _compacted(conn: sqlite3.Connection, link: UpstreamLink, native: str, now: int) -> Recorded:
    """A compaction the harness did itself: log-only, once per session and native id."""
    draft = make_draft(
        session_key=link.session_key,
        agent_id=link.agent_id,
        kind=EventKind.COMPACTED,
        actor_type=ActorType.SYSTEM,
        now=now,
        dedupe_key=f"compacted:{link.session_key}:{native}",
    )
    return record_event(conn, draft, now)


def _forget_own(conn: sqlite3.Connection, consumed: list[int]) -> None:
    """Each remembered own message suppresses one upstream prompt: used up, it goes."""
    conn.executemany("DELETE FROM sessionwatch_own_messages WHERE id = ?", [(i,) for i in consumed])


def _missing(
    conn: sqlite3.Connection,
    link: UpstreamLink,
    session_id: str | None,
    streak: int,
    now: int,
    threshold: int,
    reason: str | None,
) -> Settled:
    key = link.session_key
    if streak < threshold:
        state = LinkState(streak=streak, outcome="missing", reason=reason)
        write_link_state(conn, link, session_id, state)
        return LinkResult(session_key=key, outcome="missing", reason=reason), []
    draft = make_draft(
        session_key=key,
        agent_id=link.agent_id,
        kind=EventKind.UPSTREAM_MISSING,
        actor_type=ActorType.SYSTEM,
        now=now,
        payload={"channel": _channel(link)},
        dedupe_key=f"upstream-missing:{key}:{link.source_key}:{link.updated_at}",
    )
    recorded = record_event(conn, draft, now)
    for table in ("session_upstream_links", "sessionwatch_link_state"):
        conn.execute(
            f"DELETE FROM {table} WHERE session_key = ? AND agent_id = ?", (key, link.agent_id)
        )
    log.warning("%s: upstream missing %d times; link removed", key, streak)
    result = LinkResult(session_key=key, outcome="missing", reason="upstream_missing recorded")
    return result, [recorded]
