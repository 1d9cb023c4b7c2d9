"""The HTTP API's contract: every request body, query and answer, declared once.

Each shape is a ``msgspec`` Struct. Request bodies and queries are decoded and checked
through them (unknown fields refused, types and ranges enforced, in one C call), and the
OpenAPI document's schemas are generated from the same Structs (:mod:`monitor.web.openapi`), so
the validation and the published contract cannot drift apart. Answers are declared here
too; the tests check every real answer against the document generated from them.

msgspec rather than pydantic: the project already chose orjson for speed, and msgspec
decodes and validates a request body in about a microsecond, without a second runtime
model layer; its JSON Schema output is what OpenAPI 3.1 takes.
"""

from __future__ import annotations

import enum
import functools
import operator
import re
import types
import typing
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from adapters.registry import adoptable_names
from adapters.states import STATES
from monitor.errors import BadInput
from monitor.kernel import drafts as input_kinds
from monitor.kernel.drafts import LAST_MS, NewEvent
from monitor.kernel.events import MAX_INT64
from monitor.kernel.sessions import SessionRow
from monitor.records import hints

T = TypeVar("T")
Unset = msgspec.UnsetType
UNSET = msgspec.UNSET

# A time in ms since 1970, up to the end of year 9999: before 1970 or later is refused.
EpochMs = Annotated[int, msgspec.Meta(ge=0, le=LAST_MS)]
# JSON Schema counts 3.0 as an integer; so does the API (``whole`` turns it into an int).
WholeEpochMs = Annotated[float, msgspec.Meta(multiple_of=1, ge=0, le=float(LAST_MS))]
Sequence = Annotated[int, msgspec.Meta(ge=0, le=MAX_INT64)]
# A key is at most 512 characters (before it is lower-cased).
KEY_MAX = 512
# Not blank; the server trims and normalizes it.
Text = Annotated[str, msgspec.Meta(max_length=65536, pattern=r"\S")]

# What the server checks, said in the document so that a client (or schemathesis) knows
# which values are accepted. A key is trimmed and lower-cased; an agent-qualified key is
# ``agent:<agentId>:<rest>``. (A bare key with an ``agentId`` is accepted too where the
# route takes one; the document describes the agent-qualified form.)
# Python's str.strip() also strips \x1c-\x1f and \x85, which a JSON Schema \s does not
# match: they count as space here.
_WS = r"[\s\x1c-\x1f\x85]"
_KEY_CHARS = r"[^\t\r\n\x00]"
_SOLID = r"[^\s\x1c-\x1f\x85:\t\r\n\x00]"
KEY_PATTERN = rf"^{_WS}*[Aa][Gg][Ee][Nn][Tt]:{_SOLID}+:{_KEY_CHARS}*{_SOLID}{_KEY_CHARS}*$"
# In a URL path a key cannot hold ``/`` (nor ``?``, ``#``, which end the path).
PATH_KEY_PATTERN = KEY_PATTERN.replace(r"[^\t", r"[^/?#\t").replace(r"[^\s", r"[^/?#\s")
SessionKey = Annotated[
    str,
    msgspec.Meta(
        pattern=KEY_PATTERN,
        max_length=KEY_MAX,
        description="an agent-qualified session key, agent:<agentId>:<rest>",
    ),
]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
AnyKey = Annotated[
    str,
    msgspec.Meta(
        pattern=rf"^{_KEY_CHARS}*{_SOLID}{_KEY_CHARS}*$",
        max_length=KEY_MAX,
        description="a session key: agent:<agentId>:<rest>, or a bare key (with agentId)",
    ),
]
Ident = Annotated[
    str, msgspec.Meta(pattern=r"^[^\r\n\x00]*$", max_length=200, description="one line")
]
Token = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^\s*[a-z0-9][a-z0-9._:/@+-]{0,63}\s*$",
        description="a short identifier: letters, digits, ._:/@+-; at most 64",
    ),
]
# Parsed by the one function the CLI uses too (upstream.session_catalog.parse_since), whose
# refusal names the accepted forms; a pattern here refused real dates (the 29th to the 31st).
Since = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=64,
        description="an age (30m, 6h, 2d, 1w) or an ISO date or date and time (2026-11-30,"
        " 2026-11-30T09:00, with an optional UTC offset)",
    ),
]
# Checked by the upstream monitor (its message lists the kinds); the enum is for the document.
AdapterKind = Annotated[str, msgspec.Meta(extra_json_schema={"enum": list(adoptable_names())})]


class Body(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    """A request body: a JSON object whose unknown fields are refused by name."""


class NoBody(Body):
    """The body of a route that takes none: empty, or ``{}``; any field is refused by name."""


class Answer(msgspec.Struct, rename="camel"):
    """An answer: every field is always present (``null`` when it has no value)."""


class Query(msgspec.Struct, rename="camel"):
    """A route's query parameters (strings in the URL, converted and checked). An absent
    parameter is ``UNSET``, never ``None``: the string ``null`` is not a number."""


# -- requests ----------------------------------------------------------------------------


class SessionUpsert(Body):
    agent_id: str | None = None
    session_id: str | None = None
    store_path: str | None = None
    run_active: bool | None = None


class OwnMessage(Body):
    text: Text
    agent_id: Ident | None = None


WholeTurns = Annotated[float, msgspec.Meta(multiple_of=1, ge=1, le=1_000_000)]


class Payload(msgspec.Struct, rename="camel", omit_defaults=True):
    """The compact payload: every other field is dropped, never stored."""

    outcome: Token | None = None  # run_failed: error, timeout or cancelled
    channel: Token | None = None
    turns: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | WholeTurns | None = None
    catalog_id: Token | None = None  # adopted and imported only
    host_id: Token | None = None


# The wire type of each kind of input value the kernel names (see drafts.NewEvent).
_INPUT_TYPES: dict[str, Any] = {
    input_kinds.KEY: AnyKey,
    input_kinds.IDENT: Ident,
    input_kinds.EPOCH_MS: EpochMs | WholeEpochMs,
    input_kinds.PAYLOAD: Payload | None,
}


def _wire_type(hint: Any) -> Any:
    """A kernel field's type as the API checks it: a value kind the kernel names becomes
    its constrained wire type (a union, member by member); any other type is as it is."""
    if typing.get_origin(hint) is Annotated:
        base, *marks = typing.get_args(hint)
        kinds = [_INPUT_TYPES[m] for m in marks if isinstance(m, str) and m in _INPUT_TYPES]
        return kinds[0] if kinds else base
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return functools.reduce(operator.or_, [_wire_type(a) for a in typing.get_args(hint)])
    return hint


def body_of(row: type[tuple[Any, ...]], name: str) -> type[Body]:
    """The request model of a kernel input type (a NamedTuple): its fields, in order, with
    their defaults, each typed as the API checks it; its docstring is the model's."""
    defaults: dict[str, Any] = getattr(row, "_field_defaults", {})  # namedtuple's API
    fields: list[tuple[Any, ...]] = []
    for field, hint in hints(row).items():
        wire = _wire_type(hint)
        fields.append((field, wire, defaults[field]) if field in defaults else (field, wire))
    model = typing.cast(type[Body], msgspec.defstruct(name, fields, bases=(Body,)))
    model.__doc__ = row.__doc__
    return model


if typing.TYPE_CHECKING:
    EventIn = Body
else:
    EventIn = body_of(NewEvent, "EventIn")


class SpawnIn(Body):
    parent: SessionKey
    child: SessionKey
    run_id: Annotated[str, msgspec.Meta(pattern=r"^[^\r\n\x00]*\S[^\r\n\x00]*$", max_length=200)]


class WatchIn(Body):
    """A bare or self watch answers ``{"watched": false, "reason": ...}``."""

    watcher: AnyKey
    target: AnyKey
    store_path: Ident | None = None


class LinkIn(Body):
    """Adopt a native session: ``catalogId`` from the catalog; or ``kind`` with ``path``
    (and ``thread``, the session id, for ``opencode``); or a node kind (``claude-node``,
    ``codex-node``, ``pi-node``, ``opencode-node``) with ``node`` and ``thread``."""

    session_key: SessionKey
    catalog_id: NonEmpty | None = None
    kind: AdapterKind | None = None
    path: NonEmpty | None = None
    node: NonEmpty | None = None
    thread: NonEmpty | None = None
    agent_id: str | None = None
    session_id: str | None = None


# -- queries -----------------------------------------------------------------------------


DOING = "|".join(STATES)


class AgentQuery(Query):
    agent_id: Ident | Unset = UNSET


class StatusQuery(Query):
    changes_since: Sequence | Unset = UNSET
    agent_id: Ident | Unset = UNSET


class SessionsQuery(Query):
    keys: Annotated[str, msgspec.Meta(pattern=r"^[^\t\r\n\x00]*$")] | Unset = UNSET
    # adopted sessions doing one of these now (comma-separated), the longest first
    state: Annotated[str, msgspec.Meta(pattern=f"^({DOING})(,({DOING}))*$")] | Unset = UNSET


class NoticesQuery(Query):
    store_path: Ident | Unset = UNSET


class CatalogQuery(Query):
    kind: AdapterKind | Unset = UNSET
    cwd: Annotated[str, msgspec.Meta(pattern=r"^[^\x00]*$")] | Unset = UNSET
    since: Since | Unset = UNSET
    search: str | Unset = UNSET
    limit: Annotated[int, msgspec.Meta(ge=1, le=10000)] | Unset = UNSET


def whole(value: int | float | None) -> int | None:
    """An integer the client may have written as ``3.0``."""
    return None if value is None else int(value)


def given(value: T | Unset) -> T | None:
    """A query parameter's value, None when it is absent."""
    return None if isinstance(value, msgspec.UnsetType) else value


# -- answers -----------------------------------------------------------------------------


class ErrorDetail(Answer):
    code: str
    message: str


class ErrorAnswer(Answer):
    error: ErrorDetail


class NotRecorded(Answer):
    recorded: Literal[False]
    error: ErrorDetail


class Ok(Answer):
    ok: Literal[True]


def answer_of(row: type[tuple[Any, ...]], name: str) -> type[Answer]:
    """The answer model of a kernel row type (a NamedTuple): the same fields and types,
    camelCase on the wire; declared once, in the kernel (``wire.fields_of`` answers it)."""
    fields = list(hints(row, extras=False).items())  # in the fields' order
    return typing.cast(type[Answer], msgspec.defstruct(name, fields, bases=(Answer,)))


if typing.TYPE_CHECKING:  # derived at run time; to the type checker, answers
    SessionInfo = Answer
else:
    SessionInfo = answer_of(SessionRow, "SessionInfo")


class NowDoing(Answer):
    """What an adopted session is doing now, since when (ms): ``working``, ``waiting``
    (for a person), ``asking``, ``quiet`` (working, no record for a while) or ``unknown``."""

    state: str
    since: int | None
    upstream_kind: str


class SessionVersion(Answer):
    session_key: str
    agent_id: str | None  # null: no agent, no head
    state_version: int
    doing: NowDoing | None  # asked with ``state`` only


class EventRecord(Answer):
    sequence: int
    session_key: str
    agent_id: str
    kind: str
    actor_type: str
    actor_id: str | None
    summary: str
    occurred_at: int
    payload: dict[str, Any] | None
    duplicate: bool


class EventRecorded(EventRecord):
    recorded: Literal[True]


class Watched(Answer, omit_defaults=True):
    watched: bool
    reason: str | None = None  # why not, when ``watched`` is false


class DeltaEvent(msgspec.Struct, rename="camel"):
    sequence: int
    kind: str
    actor_type: str
    summary: str
    occurred_at: int
    actor_id: str | msgspec.UnsetType = msgspec.UNSET
    run_id: str | msgspec.UnsetType = msgspec.UNSET
    payload: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class StateChanges(Answer):
    events: list[DeltaEvent]
    truncated: bool
    earliest_available_sequence: int
    history_gap: bool


class Status(msgspec.Struct, rename="camel"):
    ok: Literal[True]
    session_key: str
    state_version: int
    state_changes: StateChanges | msgspec.UnsetType = msgspec.UNSET


class Sessions(Answer):
    sessions: list[SessionVersion]


class NoticeOut(Answer):
    target: str | None
    text: str


class Notices(Answer):
    notices: list[NoticeOut]


class CatalogSession(Answer):
    catalog_id: str
    kind: str
    native_id: str
    path: str
    cwd: str | None
    title: str | None
    updated_at: int | None
    size: int | None
    session_key: str | None
    session_keys: list[str]  # every key linked to it (sessionKey is the first)
    node: str | None
    score: float | None


class CatalogError(Answer):
    path: str
    reason: str


class Catalog(Answer):
    sessions: list[CatalogSession]
    skipped: int
    errors: list[CatalogError]


class Link(Answer):
    session_key: str
    agent_id: str
    kind: str | None
    upstream_kind: str
    catalog_id: str
    host_id: str
    thread_id: str
    foreign: bool
    ref: dict[str, Any]
    marker: dict[str, Any]
    watched: bool
    blocked: dict[str, Any] | None
    missing_streak: int
    status: dict[str, Any] | None
    drift: dict[str, Any] | None
    last_scanned_at: int | None
    doing: LinkNowDoing


class LinkNowDoing(Answer):
    state: str  # working, waiting, asking, quiet or unknown (see ``NowDoing``)
    since: int | None


class Links(Answer):
    links: list[Link]


class UiTicket(Answer):
    path: str  # ``/ui/login?ticket=...``: spent by its first use
    expires_in_s: int


class Adopted(Answer):
    link: dict[str, Any] | None
    declined: str | None
    warnings: list[str]  # the key moved from another source; the source has other keys


# -- decoding ----------------------------------------------------------------------------

_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$")


def _field_names(model: type[msgspec.Struct]) -> list[str]:
    return sorted(model.__struct_encode_fields__)


def explain(exc: msgspec.DecodeError | msgspec.ValidationError, model: type[Any]) -> str:
    """msgspec's message, led by the field it is about (``kind: invalid enum value 'x'``)."""
    text = str(exc)
    if not isinstance(exc, msgspec.ValidationError):
        return f"request body is not valid JSON: {text}"
    match = _AT.match(text)
    what, path = (match["what"], match["path"]) if match else (text, None)
    missing = re.fullmatch(r"Object missing required field `(.+)`", what)
    if missing:
        return f"{missing[1]} is required"
    unknown = re.fullmatch(r"Object contains unknown field `(.+)`", what)
    if unknown:
        allowed = ", ".join(_field_names(model))
        return f"unknown field {unknown[1]!r} (allowed: {allowed})"
    if what == "Expected `object`, got `array`" and not path:
        return "request body must be a JSON object"
    what = what[0].lower() + what[1:]
    if path:
        name = path.lstrip(".")
        described = _description(model, name)
        if "matching regex" in what and described:  # say what it means, not the regex
            return f"{name}: expected {described}"
        if what.startswith("invalid enum value"):
            kinds = _enum_values(model, name)
            what += f" (known: {', '.join(kinds)})" if kinds else ""
        return f"{name}: {what}"
    return what


def _description(model: type[Any], name: str) -> str | None:
    """The ``description`` a field's type declares (``SessionKey``, ``Ident``...)."""
    for f in msgspec.inspect.type_info(model).fields:  # type: ignore[attr-defined]
        if f.encode_name != name:
            continue
        kind = f.type
        options = kind.types if isinstance(kind, msgspec.inspect.UnionType) else (kind,)
        for option in options:
            extra = getattr(option, "extra_json_schema", None) or {}
            if extra.get("description"):
                return str(extra["description"])
    return None


def _enum_values(model: type[Any], name: str) -> list[str]:
    for f in msgspec.structs.fields(model):
        kind = f.type
        if f.encode_name == name and isinstance(kind, type) and issubclass(kind, enum.Enum):
            return [str(m.value) for m in kind]
    return []


_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def decode(model: type[T], raw: bytes) -> T:
    """A request body as ``model``; :class:`BadInput` names what is wrong."""
    decoder = _decoders.get(model)
    if decoder is None:
        decoder = _decoders[model] = msgspec.json.Decoder(model)
    try:
        value: T = decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BadInput(explain(exc, model)) from None
    except RecursionError:  # msgspec's own bound on nesting, far below what a caller means
        raise BadInput("the body is nested too deep to be read") from None
    return value


def convert_query(model: type[T], query: dict[str, str]) -> T:
    """Query parameters as ``model`` (strings converted; an unknown one was refused before,
    by the guard, against the document). A number is digits only: ``1e3`` or ``1.0`` is not
    read as 1000 or 1."""
    known = {k: v for k, v in query.items() if k in _query_names(model)}
    for name in _integer_names(model):
        raw = known.get(name)
        if raw is not None and not (raw.isascii() and raw.isdigit()):
            raise BadInput(f"{name} must be a whole number written in digits, got {raw!r}")
    try:
        value: T = msgspec.convert(known, model, strict=False)
    except msgspec.ValidationError as exc:
        raise BadInput(explain(exc, model)) from None
    return value


_integers: dict[type[Any], tuple[str, ...]] = {}


def _integer_names(model: type[Any]) -> tuple[str, ...]:
    """The wire names of a query's integer fields (found once a model: msgspec's
    ``fields`` evaluates the model's annotations at every call)."""
    found = _integers.get(model)
    if found is None:
        fields = msgspec.structs.fields(model)
        found = _integers[model] = tuple(f.encode_name for f in fields if _has_int(f.type))
    return found


def _has_int(tp: Any) -> bool:
    if tp is int:
        return True
    return any(_has_int(arg) for arg in typing.get_args(tp))


def _query_names(model: type[Any]) -> tuple[str, ...]:
    names: tuple[str, ...] = model.__struct_encode_fields__
    return names


_encoder = msgspec.json.Encoder()


def encode(answer: msgspec.Struct) -> bytes:
    return _encoder.encode(answer)


def answer(model: type[msgspec.Struct], data: Any) -> bytes:
    """``data`` (from :mod:`monitor.web.wire`) encoded as ``model``: what is not in the
    model's shape fails here, never on a client."""
    return _encoder.encode(msgspec.convert(data, model))
