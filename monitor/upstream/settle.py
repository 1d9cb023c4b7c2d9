"""The tick's one transaction per link: what a check found, settled beside ``record_event``.

Compare-and-set against the link as it was when the scan began: its source, its
``updated_at`` and its marker. A link whose source changed mid-scan records nothing. One
whose marker another check moved meanwhile (``serve``'s tick and its early checks, a
``sessionwatch tick``, another host on a shared store, or the gateway's own monitor, whose
marker update moves ``updated_at``) records nothing and writes no marker, and is checked
again from the new marker (:data:`MARKER_MOVED`). A marker moved here moves ``updated_at``
too (:func:`links.advance_marker`), which is what the gateway's monitor compares before it
records. So any number of checkers, the gateway's included, record each turn once.

One window is the gateway's own: its monitor records a turn (dedupe id: the offset its read
ended at), then moves the marker in a second transaction. A check that settles between the
two finds the marker unmoved, and has read on past that offset (the agent's reply came).
Its record would carry another dedupe id: the turn twice. The first write is visible,
though: an ``upstream:<key>:<source>:<offset>`` event beyond the marker this check read
from means a settle in flight, and the turns before that offset are its
(:func:`_not_recorded`); only those after it are recorded here, and the marker moves on (the
gateway's marker write then finds ``updated_at`` moved, and changes nothing). What is
left: a gateway that compares ``updated_at`` and then records in separate transactions can
still record after a settle here; and sources whose dedupe ids are not offsets (a Codex
thread's turn ids, a paired node's entry uuids) carry no order to compare.

In the same transaction: the ``human_direct_message`` (or ``upstream_missing``) event, the
``compacted`` events of native compactions, the marker (or the link's deletion), the
self-echo memory the check used up, and the link's state (missing streak, blocked offset,
last outcome and its reason, shown by ``links``). Where the gateway probes a branch of the
link's thread, what the check found in the source beside it is settled there too, on the
sidecar's own marker and its own compare-and-set (:func:`_followed`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from adapters.base import Followed, Outcome
from adapters.states import UNKNOWN, Doing
from monitor.kernel.bus import DoingChanged, LinksChanged
from monitor.kernel.drafts import EventDraft, make_draft
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.recorder import Recorder
from monitor.kernel.sessions import forget_own, session_flags
from monitor.kernel.signal_log import newest_dedupe_key
from monitor.upstream import links
from monitor.upstream.links import LinkState, UpstreamLink, link_state, read_link, write_link_state

if TYPE_CHECKING:
    from monitor.kernel.store.protocol import Conn

log = logging.getLogger(__name__)


TickOutcome = Literal["activity", "quiet", "missing", "blocked", "inconclusive", "skipped"]


BUDGET_EXCEEDED = "adapter budget exceeded"
MARKER_MOVED = "another check moved the marker during the scan"


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkResult:
    session_key: str
    outcome: TickOutcome
    turns: int = 0
    reason: str | None = None
    adapter: str | None = None
    unsettled: bool = False  # the store refused the findings: they wait, the marker stays
    moved: bool = False  # another check settled first: nothing written, check it again
    more: bool = False  # the read stopped at the scan cap: more to read at once


_UNHEALTHY = ("missing", "blocked", "inconclusive")


def settle(record: Recorder, link: UpstreamLink, outcome: Outcome, threshold: int) -> LinkResult:
    """Settle one check of ``link`` (see the module docstring)."""
    conn, key = record.conn, link.session_key
    stale = _stale(conn, link)
    if stale is not None:
        return stale
    session = session_flags(conn, key, link.agent_id)
    if session and session[1]:
        return LinkResult(session_key=key, outcome="skipped", reason="run active")
    session_id = session[0] if session else None
    before = link_state(conn, link, session_id)
    if before.outcome in _UNHEALTHY and outcome.status in ("quiet", "activity"):
        log.info("%s: readable again (was %s)", key, before.outcome)  # once, as each was said
    if outcome.status == "missing":
        return _missing(record, link, session_id, before.streak + 1, threshold, outcome.reason)
    if outcome.status in ("blocked", "inconclusive") or outcome.marker is None:
        return _unread(conn, link, session_id, before, outcome)
    return _found(record, link, session_id, outcome, before.doing)


def _stale(conn: Conn, link: UpstreamLink) -> LinkResult | None:
    """A skip when the link changed since it was read (another source, or its marker moved
    by another check), else None."""
    key = link.session_key
    current = read_link(conn, key, link.agent_id)
    if current is None or current.source_key != link.source_key or current.ref != link.ref:
        return LinkResult(session_key=key, outcome="skipped", reason="link changed during the scan")
    if current.updated_at != link.updated_at or current.marker != link.marker:
        return LinkResult(session_key=key, outcome="skipped", reason=MARKER_MOVED, moved=True)
    return None


def _unread(
    conn: Conn, link: UpstreamLink, session_id: str | None, before: LinkState, outcome: Outcome
) -> LinkResult:
    """A check that could not read the link (blocked at an offset, or inconclusive): its
    state written, said when it changed; its marker stays."""
    key = link.session_key
    if outcome.status == "blocked":
        assert outcome.blocked_offset is not None
        if before.blocked_offset != outcome.blocked_offset:
            log.warning("%s: blocked: %s", key, outcome.reason)
        state = LinkState(blocked_offset=outcome.blocked_offset, outcome="blocked")
        write_link_state(conn, link, session_id, state, outcome.reason or "blocked")
        return LinkResult(session_key=key, outcome="blocked", reason=outcome.reason)
    if before.reason != outcome.reason:
        log.warning("%s: inconclusive: %s", key, outcome.reason)
    state = LinkState(outcome="inconclusive", reason=outcome.reason)
    write_link_state(conn, link, session_id, state)
    return LinkResult(session_key=key, outcome="inconclusive", reason=outcome.reason)


def _found(
    record: Recorder, link: UpstreamLink, session_id: str | None, outcome: Outcome, doing: Doing
) -> LinkResult:
    """A check that read the link: its compactions and turns recorded (those another
    checker has not), its marker moved, and what the session is doing now (``doing``:
    before), in the one transaction."""
    conn, now = record.conn, record.now
    assert outcome.marker is not None
    for native in outcome.compactions:
        record(_compacted(link, native, now))
    turns = _not_recorded(record, link, outcome)
    if turns.turns:
        record(_human_turns(link, turns, now))
    beside = _followed(record, link, outcome.followed)
    forget_own(conn, outcome.consumed_own)
    advanced = links.advance_marker(conn, link, outcome.marker, now)
    found = len(turns.turns) + max(beside, 0)
    status: TickOutcome = "activity" if found else "quiet"
    noted = status if outcome.reason else None  # a plain check leaves no status behind
    # it read records (a boundary among them, at least); else it kept what it was doing
    read = outcome.status == "activity" or outcome.boundary is not None
    now_doing = _doing(record, link, doing, outcome) if read else doing
    state = LinkState(outcome=noted, reason=outcome.reason, doing=now_doing)
    write_link_state(conn, advanced, session_id, state, seen_at=now if read else None)
    return LinkResult(
        session_key=link.session_key,
        outcome=status,
        turns=found,
        reason=outcome.reason,
        more=outcome.more,
        moved=beside < 0,
    )


def _doing(record: Recorder, link: UpstreamLink, before: Doing, outcome: Outcome) -> Doing:
    """What the session is doing once the check's records are read (since the check's
    time when the record that says so has none), said when it changed."""
    after = before.after(outcome.boundary)
    if after.since is None and after.state != UNKNOWN:
        after = after._replace(since=record.now)
    if after != before:
        waited = before.waited(outcome.boundary)
        record.say(DoingChanged(link.session_key, after.state, after.since, before.state, waited))
        links.note_doing(record.conn, link, after, record.now)
    return after


def _followed(record: Recorder, link: UpstreamLink, followed: Followed | None) -> int:
    """Settle what the check found in the thread followed beside the link (the source the
    gateway left for its branch), against the sidecar's own marker there: the turns
    recorded, or -1 when another check moved that marker since it was read (nothing is
    written; the link is checked again). The gateway's link and marker are not touched,
    and the dedupe key (``upstream-source:``) cannot meet one of the gateway's."""
    if followed is None:
        return 0
    kept = links.follow_marker(record.conn, link, followed.thread, followed.beside)
    if kept != followed.since:
        return -1
    found = followed.outcome
    if found.marker is None:
        return 0
    if found.turns:
        record(_human_turns(link, found, record.now, prefix="upstream-source"))
    if found.marker != kept:
        links.write_follow(record.conn, link, followed, found.marker, record.now)
    return len(found.turns)


def _not_recorded(record: Recorder, link: UpstreamLink, outcome: Outcome) -> Outcome:
    """``outcome`` without the turns another checker recorded in the same read range and
    has not moved the marker past yet (the module docstring): the newest upstream event of
    this link and source, when its dedupe id is an offset beyond where this read began."""
    if not outcome.turns or outcome.read_from is None:
        return outcome
    prefix = f"upstream:{link.session_key}:{link.source_key}:"
    newest = newest_dedupe_key(
        record.conn, link.session_key, link.agent_id, EventKind.HUMAN_DIRECT_MESSAGE.value, prefix
    )
    recorded = newest[len(prefix) :] if newest else ""
    if not recorded.isdigit() or int(recorded) <= outcome.read_from:
        return outcome
    end = int(recorded)
    kept = [t for t in outcome.turns if t.offset is None or t.offset >= end]
    if len(kept) == len(outcome.turns):
        return outcome
    log.info(
        "%s: %d turn(s) up to offset %d were recorded by another checker, its marker not moved",
        link.session_key,
        len(outcome.turns) - len(kept),
        end,
    )
    return dataclasses.replace(outcome, turns=kept)


def _channel(link: UpstreamLink) -> str:
    return link.catalog_id or link.kind or link.upstream_kind


def _human_turns(
    link: UpstreamLink, outcome: Outcome, now: int, prefix: str = "upstream"
) -> EventDraft:
    """The gateway monitor's own row, field by field: the channel in the summary only
    (``human message via codex``), a payload only for a burst (``{"turns": N}``), else
    none (NULL)."""
    turns = len(outcome.turns)
    return make_draft(
        session_key=link.session_key,
        agent_id=link.agent_id,
        kind=EventKind.HUMAN_DIRECT_MESSAGE,
        actor_type=ActorType.HUMAN,
        now=now,
        summary=f"human message via {_channel(link)}",
        payload={"turns": turns} if turns > 1 else None,
        occurred_at=outcome.latest_at,
        dedupe_key=f"{prefix}:{link.session_key}:{link.source_key}:{outcome.dedupe_id}",
    )


def _compacted(link: UpstreamLink, native: str, now: int) -> EventDraft:
    """A compaction the harness did itself: log-only, once per session and native id."""
    return make_draft(
        session_key=link.session_key,
        agent_id=link.agent_id,
        kind=EventKind.COMPACTED,
        actor_type=ActorType.SYSTEM,
        now=now,
        dedupe_key=f"compacted:{link.session_key}:{native}",
    )


def _missing(
    record: Recorder,
    link: UpstreamLink,
    session_id: str | None,
    streak: int,
    threshold: int,
    reason: str | None,
) -> LinkResult:
    key = link.session_key
    if streak < threshold:
        if streak == 1:
            log.warning("%s: not found (%s); upstream_missing after %d misses", key, reason,
                        threshold)  # fmt: skip
        state = LinkState(streak=streak, outcome="missing", reason=reason)
        write_link_state(record.conn, link, session_id, state)
        return LinkResult(session_key=key, outcome="missing", reason=reason)
    draft = make_draft(
        session_key=key,
        agent_id=link.agent_id,
        kind=EventKind.UPSTREAM_MISSING,
        actor_type=ActorType.SYSTEM,
        now=record.now,
        payload={"channel": _channel(link)},
        dedupe_key=f"upstream-missing:{key}:{link.source_key}:{link.updated_at}",
    )
    record(draft)
    links.delete_links(record.conn, "session_key = ? AND agent_id = ?", (key, link.agent_id))
    record.say(LinksChanged())
    log.warning("%s: upstream missing %d times; link removed", key, streak)
    return LinkResult(session_key=key, outcome="missing", reason="upstream_missing recorded")
