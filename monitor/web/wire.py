"""The wire format: the typed values of the kernel and the upstream monitor as the JSON
objects the API answers and the CLI prints. Each camelCase key is spelled here, once, or
derived from the field name of a kernel row answered as it is (:func:`fields_of`), but
``session_status``'s, which the kernel spells (it builds that answer in SQL).

The HTTP API passes every object built here through its answer model
(:func:`monitor.web.models.answer`), the one the OpenAPI document is generated from, so an
answer that left its document would fail there. The CLI prints the same objects without
that check: it must not pay msgspec's import on every one-shot command.
"""

from __future__ import annotations

TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

    from adapters.base import Drift
    from monitor.kernel.events import StateEvent
    from monitor.kernel.retention import PruneResult
    from monitor.kernel.sessions import SessionRow
    from monitor.kernel.signal_log import SessionStatus, StateVersion
    from monitor.upstream.adoption import AdoptedLink
    from monitor.upstream.links import LinkView, SessionDoing, UpstreamLink
    from monitor.upstream.settle import LinkResult

    Json = dict[str, Any]


def event_record(event: StateEvent, *, duplicate: bool) -> Json:
    """A recorded event, as ``POST /v1/events`` answers and ``sessionwatch record`` prints."""
    return {
        "sequence": event.sequence,
        "sessionKey": event.session_key,
        "agentId": event.agent_id,
        "kind": event.kind,
        "actorType": event.actor_type,
        "actorId": event.actor_id,
        "summary": event.summary,
        "occurredAt": event.occurred_at,
        "payload": event.payload or None,
        "duplicate": duplicate,
    }


def status(found: SessionStatus) -> Json:
    """The ``session_status`` object: the kernel's, which also builds it in SQL
    (:func:`monitor.kernel.signal_log.status_answer`), and in Python where SQL cannot."""
    from monitor.kernel.signal_log import status_object  # not on every command's start

    return status_object(found)


def state_versions(versions: list[StateVersion]) -> list[Json]:
    return [state_version(v) for v in versions]


def camel(name: str) -> str:
    """``session_key`` as ``sessionKey``: msgspec's ``rename="camel"``, for the CLI."""
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


_NAMES: dict[type, tuple[str, ...]] = {}


def fields_of(row: tuple[Any, ...]) -> Json:
    """A kernel row (a NamedTuple) whose answer is its fields as they are, camelCase
    (the answer model is derived from the same type: ``models.answer_of``)."""
    names = _NAMES.get(type(row))
    if names is None:
        names = _NAMES[type(row)] = tuple(camel(f) for f in type(row).__annotations__)
    return dict(zip(names, row, strict=True))


def state_version(version: StateVersion) -> Json:
    return {**fields_of(version), "doing": None}


def session_info(row: SessionRow) -> Json:
    return fields_of(row)


def pruned(result: PruneResult) -> Json:
    return fields_of(result)


def _link_fields(link: UpstreamLink) -> Json:
    return {
        "sessionKey": link.session_key,
        "agentId": link.agent_id,
        "kind": link.kind,
        "upstreamKind": link.upstream_kind,
        "catalogId": link.catalog_id,
        "hostId": link.host_id,
        "threadId": link.thread_id,
    }


def drift(found: Drift) -> Json | None:
    """What a link's reading found that it did not know, or None when it found nothing."""
    if not found:
        return None
    return {
        "version": found.version,
        "newerThanTested": found.newer,
        "unknownTypes": dict(found.unknown_types),
        "unclassifiedUserRecords": found.unclassified,
        "invalidLines": found.invalid,
        "lastInvalidOffset": found.last_invalid_offset,
    }


def link(view: LinkView) -> Json:
    """A link with its state, as ``GET /v1/links`` answers and ``sessionwatch links`` prints."""
    blocked, check = view.blocked, view.status
    return {
        **_link_fields(view.link),
        "foreign": view.link.foreign,
        "ref": view.link.ref,
        "marker": view.marker,
        "watched": view.watched,
        "blocked": {"offset": blocked.offset, "reason": blocked.reason} if blocked else None,
        "missingStreak": view.missing_streak,
        "status": {"outcome": check.outcome, "reason": check.reason} if check else None,
        "drift": drift(view.drift),
        "lastScannedAt": view.link.last_scanned_at,
        "doing": {"state": view.doing.state, "since": view.doing.since},
    }


def doing(found: SessionDoing, version: int) -> Json:
    """An adopted session, its state version and what it is doing, as ``GET /v1/sessions
    ?state=`` answers."""
    return {
        "sessionKey": found.session_key,
        "agentId": found.agent_id,
        "stateVersion": version,
        "doing": {"state": found.state, "since": found.since, "upstreamKind": found.upstream_kind},
    }


def links(views: list[LinkView]) -> list[Json]:
    return [link(v) for v in views]


def adopted(result: AdoptedLink) -> Json:
    """What an adoption made: its link (with the marker as people see it), or why not."""
    made: Json | None = None
    if result.link is not None:
        from monitor.upstream.links import public_marker

        made = {
            **_link_fields(result.link),
            "ref": result.link.ref,
            "marker": public_marker(result.link.marker),
            "lastScannedAt": result.link.last_scanned_at,
            "createdAt": result.link.created_at,
            "updatedAt": result.link.updated_at,
        }
    return {"link": made, "declined": result.declined, "warnings": list(result.warnings)}


def link_result(result: LinkResult) -> Json:
    """One link's outcome of a tick, as ``sessionwatch tick`` prints it."""
    return {
        "sessionKey": result.session_key,
        "outcome": result.outcome,
        "turns": result.turns,
        "reason": result.reason,
    }
