"""The closed set of state-event kinds, their notify policy, summaries and payloads.

Events carry metadata and a one-line summary, never message content. Summaries are fixed
templates; payloads keep only ``outcome``, ``channel``, ``turns`` and, for ``adopted`` and
``imported``, the catalog and host ids (:data:`CATALOG_ID`, :data:`HOST_ID`).

A payload is stored as OpenClaw stores it, a JSON object with OpenClaw's field names; those
two are the only field names of OpenClaw's camelCase spelled below the web layer. How an event
is answered over the API is :mod:`monitor.web`'s.
"""

from __future__ import annotations

import re
from enum import StrEnum

import orjson

from monitor.errors import BadInput, did_you_mean
from monitor.records import NamedTuple

TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any


class EventKind(StrEnum):
    HUMAN_DIRECT_MESSAGE = "human_direct_message"
    UPSTREAM_MISSING = "upstream_missing"
    GOAL_CHANGED = "goal_changed"
    CHILD_SPAWNED = "child_spawned"
    RUN_COMPLETED = "run_completed"
    RUN_FAILED = "run_failed"
    COMPACTED = "compacted"
    ADOPTED = "adopted"
    IMPORTED = "imported"
    CREATED = "created"


class ActorType(StrEnum):
    HUMAN = "human"
    AGENT = "agent"
    SYSTEM = "system"


NOTIFYING_KINDS = frozenset(
    {EventKind.HUMAN_DIRECT_MESSAGE, EventKind.UPSTREAM_MISSING, EventKind.GOAL_CHANGED}
)

DELTA_PAYLOAD_FIELDS = ("outcome", "channel", "turns")
# The payload fields of ``adopted`` and ``imported``, named as OpenClaw stores them.
CATALOG_ID = "catalogId"
HOST_ID = "hostId"
RUN_FAILED_OUTCOMES = {"error": "failed", "timeout": "timed out", "cancelled": "cancelled"}
_TOKEN = r"^[a-z0-9][a-z0-9._:/@+-]{0,63}$"  # compiled at first use (re caches it)
_MAX_TURNS = 1_000_000
MAX_INT64 = 2**63 - 1  # SQLite's integers


def json_object(raw: str | None) -> dict[str, Any]:
    """A JSON column (an event's payload, a link's ref or marker) as an object: anything else
    (NULL, not JSON, not an object; left by hand or by a writer we do not know) reads as
    empty."""
    if not raw:
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return value if type(value) is dict else {}


def parse_kind(raw: str) -> EventKind:
    try:
        return EventKind(raw)
    except ValueError:
        known = ", ".join(k.value for k in EventKind)
        raise BadInput(f'unknown event kind "{raw}" (known: {known})') from None


def parse_actor(raw: str) -> ActorType:
    try:
        return ActorType(raw)
    except ValueError:
        raise BadInput(f'unknown actor "{raw}" (known: human, agent, system)') from None


def _token(name: str, value: Any) -> str:
    if not isinstance(value, str) or not re.match(_TOKEN, value.strip().lower()):
        raise BadInput(
            f"payload.{name} must be a short identifier (letters, digits, ._:/@+-; at most 64)"
        )
    return value.strip().lower()


def compact_payload(kind: EventKind, raw: Any) -> dict[str, Any]:
    """Keep only the compact payload fields; reject wrong types, drop anything else."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BadInput("payload must be a JSON object")
    refuse_a_mistyped_via(kind, raw)
    out: dict[str, Any] = {}
    if raw.get("outcome") is not None:
        out["outcome"] = _token("outcome", raw["outcome"])
    if raw.get("channel") is not None:
        out["channel"] = _token("channel", raw["channel"])
    turns = raw.get("turns")
    if turns is not None:
        if isinstance(turns, bool) or not isinstance(turns, int) or not 1 <= turns <= _MAX_TURNS:
            raise BadInput("payload.turns must be a positive integer")
        out["turns"] = turns
    if kind in {EventKind.ADOPTED, EventKind.IMPORTED}:
        for field in (CATALOG_ID, HOST_ID):
            if raw.get(field) is not None:
                out[field] = _token(field, raw[field])
    if kind is EventKind.RUN_FAILED:
        outcome = out.setdefault("outcome", "error")
        if outcome not in RUN_FAILED_OUTCOMES:
            raise BadInput("payload.outcome of run_failed must be error, timeout or cancelled")
    return out


def lacks_via(kind: EventKind, payload: dict[str, Any] | None) -> bool:
    """Whether ``kind``'s summary names a payload key (``channel``, ``catalogId``) that
    ``payload`` lacks: it would read "via unknown"."""
    via = _VIA.get(kind)
    return via is not None and (payload or {}).get(via[1]) is None


def refuse_a_mistyped_via(kind: EventKind, raw: dict[str, Any]) -> None:
    """Other keys are dropped, as OpenClaw's compact payload drops them; but where the
    summary names a key the payload lacks ("human message via unknown") and a key given is
    a near miss of it (``chanel``), that is a typo, refused with the key it meant."""
    if not lacks_via(kind, raw):
        return
    via = _VIA[kind]
    for key in raw:
        near = did_you_mean(str(key), (via[1],)) if isinstance(key, str) else ""
        if near:
            raise BadInput(f"payload: unknown key {key!r}{near}")


_VIA = {
    EventKind.HUMAN_DIRECT_MESSAGE: ("human message via ", "channel"),
    EventKind.UPSTREAM_MISSING: ("upstream missing via ", "channel"),
    EventKind.ADOPTED: ("adopted from ", CATALOG_ID),  # OpenClaw's wording
    EventKind.IMPORTED: ("history imported via ", CATALOG_ID),
}
_FIXED = {
    EventKind.CHILD_SPAWNED: ("child session spawned",),
    EventKind.RUN_COMPLETED: ("child run completed",),
    EventKind.COMPACTED: ("session compacted",),
    EventKind.CREATED: ("session created",),
    EventKind.GOAL_CHANGED: ("goal updated", "goal created"),
}


def summary_schema(kind: EventKind) -> dict[str, Any]:
    """What :func:`render_summary` accepts as a requested summary of ``kind``, as JSON
    Schema (for the published API contract)."""
    if kind in _VIA:
        prefix = re.escape(_VIA[kind][0]).replace("\\ ", " ")
        return {"pattern": rf"^\s*{prefix}[a-z0-9][a-z0-9._:/@+-]{{0,63}}\s*$"}
    if kind is EventKind.RUN_FAILED:
        return {"enum": [f"child run {text}" for text in RUN_FAILED_OUTCOMES.values()]}
    return {"enum": list(_FIXED[kind])}


def render_summary(kind: EventKind, payload: dict[str, Any], requested: str | None) -> str:
    """The event's one-line summary from its kind's template.

    ``requested`` may pick among a kind's templates (``goal created``) or name the channel of
    a ``... via <channel>`` template; free text is refused, since summaries never carry content.
    """
    wanted = requested.strip() if requested is not None else None
    if kind in _VIA:
        prefix, field = _VIA[kind]
        if wanted is not None:
            if not wanted.startswith(prefix):
                raise BadInput(f'summary of {kind.value} must read "{prefix}<{field}>"')
            via = _token(field, wanted[len(prefix) :])
            if payload.get(field, via) != via:
                raise BadInput(f"summary names {field} {via}, payload says {payload[field]}")
            return prefix + via  # in the summary only, as the gateway's own rows have it
        return prefix + str(payload.get(field, "unknown"))
    if kind is EventKind.RUN_FAILED:
        default = f"child run {RUN_FAILED_OUTCOMES[payload['outcome']]}"
        if wanted is not None and wanted != default:
            raise BadInput(f'summary of run_failed must match its outcome: "{default}"')
        return default
    templates = _FIXED[kind]
    if wanted is None:
        return templates[0]
    if wanted not in templates:
        options = ", ".join(f'"{t}"' for t in templates)
        raise BadInput(f"summary of {kind.value} must be one of {options}")
    return wanted


class StateEvent(NamedTuple):
    """One row of the signal log."""

    sequence: int
    session_key: str
    agent_id: str
    kind: str
    actor_type: str
    actor_id: str | None
    session_id: str | None
    run_id: str | None
    occurred_at: int
    summary: str
    payload: dict[str, Any]
    dedupe_key: str | None
