"""An event's draft: what a recording is asked for (:class:`NewEvent`, the API's request
model's source), checked and made into the row the signal log records
(:func:`make_draft`), and what recording it gave (:class:`Recorded`)."""

from __future__ import annotations

from monitor.clock import DAY_MS
from monitor.errors import BadInput
from monitor.kernel.events import (
    ActorType,
    EventKind,
    StateEvent,
    compact_payload,
    render_summary,
)
from monitor.kernel.keys import normalize_key, resolve_agent
from monitor.kernel.notices import Notice
from monitor.records import NamedTuple

TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Annotated, Any


OCCURRED_AT_MAX_SKEW_MS = DAY_MS
MAX_ID_LENGTH = 256


# What kind of value an input field holds, for the faces that check it before the kernel
# does: the API's request model is derived from NewEvent (``monitor.web.models``) and turns
# each kind into its JSON Schema. An event's input fields are declared here, once.
KEY = "input:key"  # a session key
IDENT = "input:ident"  # one line of text (an id, a template's summary)
EPOCH_MS = "input:epoch-ms"  # a time in ms since 1970
LAST_MS = 253_402_300_799_999  # the last millisecond of the year 9999: the latest time taken
PAYLOAD = "input:payload"  # the compact payload


class NewEvent(NamedTuple):
    """What a producer (the gateway, the CLI, a test) asks to record, before validation.

    ``summary``, when given, must be one of the kind's templates (``human message via
    <channel>``, ``goal created``...): free text is refused, since the log never holds
    content. The time it occurred is clamped to the last 24 h."""

    session_key: Annotated[str, KEY]
    kind: EventKind
    actor_type: ActorType
    actor_id: Annotated[str, KEY] | None = None
    agent_id: Annotated[str, IDENT] | None = None
    run_id: Annotated[str, IDENT] | None = None
    session_id: Annotated[str, IDENT] | None = None
    summary: Annotated[str, IDENT] | None = None
    dedupe_key: Annotated[str, IDENT] | None = None
    payload: Annotated[Any, PAYLOAD] = None
    occurred_at: Annotated[int, EPOCH_MS] | None = None

    def draft(self, now: int) -> EventDraft:
        """Validated (see :func:`make_draft`); raises :class:`BadInput`."""
        return make_draft(
            session_key=self.session_key,
            kind=self.kind,
            actor_type=self.actor_type,
            now=now,
            agent_id=self.agent_id,
            actor_id=self.actor_id,
            session_id=self.session_id,
            run_id=self.run_id,
            summary=self.summary,
            dedupe_key=self.dedupe_key,
            payload=self.payload,
            occurred_at=self.occurred_at,
        )


class EventDraft(NamedTuple):
    """A validated event about to be recorded: its row, whose ``sequence`` the recording
    assigns (an event's stored fields are :class:`StateEvent`'s, declared once)."""

    row: StateEvent


class Recorded(NamedTuple):
    """What recording returns: the row, whether it already existed, and opened notices."""

    event: StateEvent
    duplicate: bool
    notices: tuple[Notice, ...] = ()


def _ident(name: str, value: str | None) -> str | None:
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if len(text) > MAX_ID_LENGTH or any(ch in text for ch in "\r\n\x00"):
        raise BadInput(f"{name} must be one line of at most {MAX_ID_LENGTH} characters")
    return text


def clamp_occurred_at(occurred_at: int | None, now: int) -> int:
    """Upstream clocks are trusted only within [now - 24 h, now]."""
    if occurred_at is None:
        return now
    return min(max(occurred_at, now - OCCURRED_AT_MAX_SKEW_MS), now)


def _default_dedupe(
    kind: EventKind, key: str, agent_id: str, run_id: str | None, session_id: str | None
) -> str | None:
    if run_id and kind is EventKind.CHILD_SPAWNED:
        return f"child-spawned:{run_id}"
    if run_id and kind in {EventKind.RUN_COMPLETED, EventKind.RUN_FAILED}:
        return f"run-terminal:{run_id}"
    if session_id and kind is EventKind.CREATED:
        return f"created:{agent_id}:{key}:{session_id}"
    if kind is EventKind.ADOPTED:
        return f"adopted:{agent_id}:{key}"
    return None


def make_draft(
    *,
    session_key: str,
    kind: EventKind,
    actor_type: ActorType,
    now: int,
    agent_id: str | None = None,
    actor_id: str | None = None,
    session_id: str | None = None,
    run_id: str | None = None,
    summary: str | None = None,
    dedupe_key: str | None = None,
    payload: Any = None,
    occurred_at: int | None = None,
) -> EventDraft:
    """Validate producer input into an :class:`EventDraft`; raises :class:`BadInput`."""
    key = normalize_key(session_key)
    agent = resolve_agent(key, agent_id)
    actor = normalize_key(actor_id) if actor_id else None
    run = _ident("run id", run_id)
    sid = _ident("session id", session_id)
    compact = compact_payload(kind, payload)
    text = render_summary(kind, compact, summary)
    if kind is EventKind.CHILD_SPAWNED and actor is None:
        raise BadInput("child_spawned needs the parent as its actor id")
    dedupe = _ident("dedupe key", dedupe_key) or _default_dedupe(kind, key, agent, run, sid)
    row = StateEvent(
        sequence=0,  # assigned when it is recorded
        session_key=key,
        agent_id=agent,
        kind=kind.value,
        actor_type=actor_type.value,
        actor_id=actor,
        session_id=sid,
        run_id=run,
        occurred_at=clamp_occurred_at(occurred_at, now),
        summary=text,
        payload=compact,
        dedupe_key=dedupe,
    )
    return EventDraft(row)
