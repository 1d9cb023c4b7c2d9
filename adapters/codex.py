"""Codex CLI rollout JSONL: which record is a direct human turn.

Pure: a parsed record and the rollout's state in, a :class:`Verdict` (or None) out (the
rules in full are in docs/formats.md). A typed prompt is written in whichever form the
version writes, and some versions write two or three forms of the same prompt:

- ``event_msg`` ``user_message`` (every envelope version up to about 0.147);
- ``event_msg`` ``item_completed`` with an ``item`` of type ``UserMessage`` (newer);
- a role-``user`` ``response_item`` beside either. In a ``legacy`` envelope rollout it only
  duplicates the event and never counts (but for the ``!cmd`` shell escape, which has no
  event); a typed one whose event never comes is reported as unclassified when its turn
  goes on; in a ``paginated`` rollout it counts when its ``content_item_kinds`` say typed
  input, as the fallback for a file without ``UserMessage`` items;
- a bare role-``user`` item in a pre-envelope (legacy bare) rollout.

The forms of one prompt are counted once: each counted prompt waits (by text hash) for its
twins in the other forms, which it consumes. Contextual items (``CONTEXTUAL_MARKERS``, kinds
other than typed input), heartbeats, inherited lines of forked and sub-agent threads, and
everything in a sub-agent or automation rollout never count.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from adapters.base import (
    UNCLASSIFIED,
    Adapter,
    Settings,
    Verdict,
    as_int,
    as_list,
    as_text,
    content_text,
    member,
    normalize_text,
    normalized_hash,
    text_hash,
)
from adapters.codex_lines import (
    _ENVELOPE,
    _ENVELOPE_REACH,
    _GOES_ON,
    CONTEXTUAL_MARKERS,
    ECHO_LIMIT,
    HUMAN_THREAD_SOURCES,
    INPUT_BLOCKS,
    KNOWN_ITEMS,
    KNOWN_TYPES,
    SHELL_ESCAPE,
    SHELL_KIND,
    SUBTYPES,
    TESTED_VERSION,
    TURN_GOES_ON,
    TYPED_KINDS,
    may_be_turn_at,
)
from adapters.jsonl_format import JsonlFormat
from adapters.states import WAITING, WORKING


def idle(state: CodexState, line: bytes) -> bool:
    """Whether a line the pre-filter let through cannot matter now: an event that says a
    turn went on, or a turn's context, matters only while a prompt seen only as a role-user
    item waits for it (:func:`_turn_goes_on`); with none waiting it is not parsed. 0.171.0
    writes five of them a turn, half of what the pre-filter lets through. Only a record
    whose type is read for sure (:data:`_ENVELOPE`) is left."""
    if state.unmatched:
        return False
    envelope = _ENVELOPE.match(line, 0, _ENVELOPE_REACH)
    if envelope is None:
        return False
    kind, subtype, _ = envelope.groups()
    return kind == b"turn_context" or (kind == b"event_msg" and subtype in _GOES_ON)


@dataclass
class CodexState:
    legacy: bool = False  # a pre-envelope rollout (bare items)
    subagent: bool = False  # a sub-agent or automation rollout: nothing in it is human
    paginated: bool = False  # ``session_meta.history_mode == "paginated"``
    history_start: int | None = None  # ``subagent_history_start_ordinal``
    fork_cutoff: str | None = None  # a forked thread's own start; older lines are copies
    echo: list[list[str]] = field(default_factory=list)  # [form, hash] awaiting its twins
    # typed role-user items of an envelope rollout not (yet) seen as an event: a prompt
    # written only in that form is reported when its turn goes on, never a silent 0
    unmatched: list[str] = field(default_factory=list)

    def to_marker(self) -> dict[str, Any]:
        return {
            "legacy": self.legacy,
            "subagent": self.subagent,
            "paginated": self.paginated,
            "historyStart": self.history_start,
            "forkCutoff": self.fork_cutoff,
            "echo": [list(e) for e in self.echo],
            "unmatched": list(self.unmatched),
        }

    @classmethod
    def from_marker(cls, marker: dict[str, Any]) -> CodexState:
        start = marker.get("historyStart")
        cutoff = marker.get("forkCutoff")
        pairs = [e for e in as_list(marker.get("echo")) if isinstance(e, list) and len(e) == 2]
        return cls(
            legacy=marker.get("legacy") is True,
            subagent=marker.get("subagent") is True,
            paginated=marker.get("paginated") is True,
            history_start=as_int(start),
            fork_cutoff=as_text(cutoff),
            echo=[[str(a), str(b)] for a, b in pairs],
            unmatched=[str(u) for u in as_list(marker.get("unmatched"))],
        )

    def apply_meta(self, payload: dict[str, Any], timestamp: Any) -> None:
        self.legacy = False
        self.subagent = is_subagent_meta(payload)
        self.paginated = payload.get("history_mode") == "paginated"
        start = payload.get("subagent_history_start_ordinal")
        self.history_start = as_int(start)
        forked = payload.get("forked_from_id")
        own_start = payload.get("timestamp", timestamp)
        self.fork_cutoff = own_start if forked and isinstance(own_start, str) else None


def is_subagent_meta(payload: dict[str, Any]) -> bool:
    """A rollout whose prompts come from another agent or from automation."""
    source = payload.get("source")
    if isinstance(source, dict) and ("subagent" in source or "internal" in source):
        return True
    if payload.get("thread_source") not in HUMAN_THREAD_SOURCES:
        return True
    return bool(payload.get("parent_thread_id"))


def state_from_first_record(record: dict[str, Any]) -> CodexState:
    """A rollout's first line tells its shape: an envelope ``session_meta`` or legacy."""
    state = CodexState()
    if record.get("type") == "session_meta" and isinstance(record.get("payload"), dict):
        state.apply_meta(record["payload"], record.get("timestamp"))
        return state
    state.legacy = "payload" not in record and "id" in record and "type" not in record
    return state


def declared_version(record: dict[str, Any]) -> str | None:
    payload = record.get("payload")
    if record.get("type") == "session_meta" and isinstance(payload, dict):
        version = payload.get("cli_version")
        return as_text(version)
    return None


def _typed(text: str) -> str | None:
    body = text.lstrip()
    normalized = normalize_text(body)
    if not normalized or body.startswith(CONTEXTUAL_MARKERS):
        return None
    return normalized_hash(normalized)


def _once(state: CodexState, form: str, digest: str | None) -> Verdict | None:
    """Count a prompt once across its forms: a twin of a counted prompt is consumed."""
    if digest is None:
        return None
    if digest in state.unmatched:
        state.unmatched.remove(digest)
    for i, (seen_form, seen) in enumerate(state.echo):
        if seen == digest and seen_form != form:
            del state.echo[i]
            return None
    state.echo.append([form, digest])
    del state.echo[:-ECHO_LIMIT]
    return Verdict(turn=digest)


def _suppress(state: CodexState, text: str) -> None:
    """A contextual twin: the same text in another form is not a prompt either."""
    normalized = normalize_text(text)
    if normalized:
        state.echo.append(["context", normalized_hash(normalized)])
        del state.echo[:-ECHO_LIMIT]


_Ordered = TypeVar("_Ordered", int, str)  # an ordinal, or an ISO time


def _inherited(record: dict[str, Any], payload: dict[str, Any], state: CodexState) -> bool:
    if _before(as_int(record.get("ordinal")), state.history_start):
        return True
    if _marked_inherited(record) or _marked_inherited(payload):
        return True
    return _before(as_text(record.get("timestamp")), state.fork_cutoff)


def _before(at: _Ordered | None, start: _Ordered | None) -> bool:
    """``at`` comes before ``start``, both known (an ordinal, or an ISO time)."""
    return at is not None and start is not None and at < start


def _marked_inherited(holder: dict[str, Any]) -> bool:
    return member(holder.get("metadata"), "inherited_user_message") is True


def _user_item(item: dict[str, Any]) -> str:
    if item.get("type") != "message" or item.get("role") != "user":
        return ""
    return content_text(item.get("content"), INPUT_BLOCKS)


def _legacy(record: dict[str, Any]) -> Verdict | None:
    text = _user_item(record)
    if text.lstrip().startswith(SHELL_ESCAPE):
        return Verdict(turn=text_hash(text))
    digest = _typed(text)
    return Verdict(turn=digest) if digest else None


def _user_message_event(payload: dict[str, Any], state: CodexState) -> Verdict | None:
    message = payload.get("message")
    if not isinstance(message, str):
        return UNCLASSIFIED
    if payload.get("kind") not in (None, "plain"):
        return None
    return _once(state, "event", _typed(message))


def _completed_item(payload: dict[str, Any], state: CodexState) -> Verdict | None:
    item = payload.get("item")
    if not isinstance(item, dict):
        return None
    kind = item.get("type")  # a ContextCompaction item repeats the ``compacted`` record
    if kind != "UserMessage":
        return UNCLASSIFIED if _misspelt_user_message(kind) else None
    content = item.get("content")
    if not isinstance(content, list):
        return UNCLASSIFIED
    return _once(state, "item", _typed(content_text(content, INPUT_BLOCKS)))


def _response_item(payload: dict[str, Any], state: CodexState) -> Verdict | None:
    if payload.get("type") != "message" or payload.get("role") != "user":
        return None
    if not isinstance(payload.get("content"), list):
        return UNCLASSIFIED
    text = content_text(payload.get("content"), INPUT_BLOCKS)
    passthrough = payload.get("internal_chat_message_metadata_passthrough")
    kinds = member(passthrough, "content_item_kinds")
    if text.lstrip().startswith(SHELL_ESCAPE) or kinds == [SHELL_KIND]:
        return Verdict(turn=text_hash(text))  # the !cmd shell escape has no other form
    if not state.paginated:
        _awaits_its_event(state, text)
        return None
    if isinstance(kinds, list) and not _typed_kinds(kinds):
        _suppress(state, text)
        return None
    return _once(state, "response", _typed(text))


def _awaits_its_event(state: CodexState, text: str) -> None:
    """An unpaginated thread's role-user item duplicates the ``user_message`` event, which
    is what counts; until that is seen, the prompt waits as unmatched (see
    :func:`_turn_goes_on`)."""
    digest = _typed(text)
    if digest and not any(seen == digest for _, seen in state.echo):
        state.unmatched = [*state.unmatched, digest][-ECHO_LIMIT:]


def _typed_kinds(kinds: list[Any]) -> bool:
    """Content item kinds a person typed (text, maybe with images or files)."""
    return bool(kinds) and set(kinds) <= TYPED_KINDS and "user.text" in kinds


def _turn_goes_on(state: CodexState) -> Verdict | None:
    """The turn went on past a typed prompt seen only as a role-user item: no form of it we
    count was written, so it is reported as unclassified (once), never dropped silently."""
    if not state.unmatched:
        return None
    state.unmatched = []
    return UNCLASSIFIED


def unknown_subtype(kind: str, payload: Any) -> str | None:
    """``event_msg:X``, ``response_item:X`` or ``item_completed:X`` for a subtype Codex
    never declared; a subtype that is not a string is left to the rules (unclassified where
    it looks like a user's)."""
    known = SUBTYPES.get(kind)
    if known is None or not isinstance(payload, dict):
        return None
    subtype = payload.get("type")
    if isinstance(subtype, str) and subtype not in known:
        return f"{kind}:{subtype}"
    item = payload.get("item") if subtype == "item_completed" else None
    name = as_text(member(item, "type"))
    if name is None or name in KNOWN_ITEMS or _misspelt_user_message(name):
        return None  # a misspelt UserMessage is unclassified instead
    return f"item_completed:{name}"


def _misspelt_user_message(kind: Any) -> bool:
    """An item type that is ``UserMessage`` but for its case."""
    return isinstance(kind, str) and kind.lower() == "usermessage"


def classify_codex_record(record: dict[str, Any], state: CodexState) -> Verdict | None:
    """What one rollout line is (see the module docstring). Updates ``state``."""
    kind = record.get("type")
    payload = record.get("payload")
    if kind == "session_meta" and isinstance(payload, dict):
        return _session_meta(record, payload, state)
    if state.legacy or _bare_meta(record):
        return _legacy_line(record, state)
    drift = _drift(kind, payload)
    if drift is not None:
        return drift
    if state.subagent or not isinstance(payload, dict):
        return None
    read = _BY_TYPE.get(str(kind))
    if read is None or _inherited(record, payload, state):
        return None
    return read(record, payload, state)


def _session_meta(
    record: dict[str, Any], payload: dict[str, Any], state: CodexState
) -> Verdict | None:
    """The meta line: the session's state, and the Codex version it declares."""
    state.apply_meta(payload, record.get("timestamp"))
    version = declared_version(record)
    return Verdict(version=version) if version else None


def _bare_meta(record: dict[str, Any]) -> bool:
    """A legacy rollout's meta line: an ``id`` and no type or payload."""
    return record.get("type") is None and "payload" not in record and "id" in record


def _legacy_line(record: dict[str, Any], state: CodexState) -> Verdict | None:
    """A line of a legacy rollout, which its bare meta line marks as one."""
    if _bare_meta(record):
        state.legacy = True
        return None
    return None if state.subagent else _legacy(record)


def _drift(kind: Any, payload: Any) -> Verdict | None:
    """A record type, or a subtype of one, that Codex never declared."""
    if kind not in KNOWN_TYPES:
        return Verdict(unknown_type=str(kind))
    unknown = unknown_subtype(str(kind), payload)
    return Verdict(unknown_type=unknown) if unknown is not None else None


def _compaction(
    record: dict[str, Any], payload: dict[str, Any], state: CodexState
) -> Verdict | None:
    ordinal = record.get("ordinal")
    native = ordinal if isinstance(ordinal, int) else record.get("timestamp")
    return Verdict(compaction=f"codex:{native}") if native is not None else None


def _event(record: dict[str, Any], payload: dict[str, Any], state: CodexState) -> Verdict | None:
    read = _BY_EVENT.get(str(payload.get("type")))
    return read(payload, state) if read is not None else None


Read = Callable[[dict[str, Any], dict[str, Any], CodexState], Verdict | None]
# what each record type says, past the checks every record gets (the meta, a legacy rollout,
# drift, a sub-agent's or an inherited line)
_BY_TYPE: dict[str, Read] = {
    "compacted": _compaction,
    "turn_context": lambda record, payload, state: _turn_goes_on(state),
    "event_msg": _event,
    "response_item": lambda record, payload, state: _response_item(payload, state),
}
# and each event of an ``event_msg``
_BY_EVENT: dict[str, Callable[[dict[str, Any], CodexState], Verdict | None]] = {
    **{name: (lambda payload, state: _turn_goes_on(state)) for name in TURN_GOES_ON},
    "user_message": _user_message_event,
    "item_completed": _completed_item,
}


def codex_native_id(record: dict[str, Any]) -> str | None:
    """The id of a prompt's record where the format gives one (``UserMessage`` items)."""
    payload = record.get("payload")
    if isinstance(payload, dict):
        item = payload.get("item")
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            return str(item["id"])
        if isinstance(payload.get("id"), str):
            return str(payload["id"])
    return None


def codex_prompt_text(record: dict[str, Any]) -> str:
    """The text of a record the classifier counted as a turn (the catalog's title)."""
    payload = record.get("payload")
    if not isinstance(payload, dict):
        return _user_item(record)  # the legacy envelope
    if isinstance(payload.get("message"), str):
        return str(payload["message"])
    item = payload.get("item")
    if isinstance(item, dict):
        return content_text(item.get("content"), INPUT_BLOCKS)
    return content_text(payload.get("content"), INPUT_BLOCKS)


def rollout_candidate(folder: str, name: str) -> bool | None:
    return True if name.startswith("rollout-") else None


def rollout_thread_id(stem: str) -> str:
    """``rollout-<timestamp>-<thread id>``: the part after the timestamp."""
    if stem.startswith("rollout-"):
        return stem[len("rollout-") :][20:] or stem
    return stem


def describe_rollout(
    first: dict[str, Any], head: list[dict[str, Any]]
) -> tuple[str | None, str | None] | None:
    """The rollout's id and working directory from its ``session_meta`` (or a legacy first
    line); a sub-agent rollout is not adoptable."""
    payload = first.get("payload") if first.get("type") == "session_meta" else first
    if not isinstance(payload, dict):
        raise ValueError("no session_meta")
    if is_subagent_meta(payload):
        return None
    cwd = payload.get("cwd")
    return str(payload.get("id") or "") or None, as_text(cwd)


ARCHIVE_DIR = "archived_sessions"


def archived_rollout(path: str, root: str) -> str | None:
    """Codex's archive (``codex archive``, the app-server's ``thread/archive``) moves a
    rollout from ``sessions/`` to the flat ``archived_sessions/`` beside it; unarchiving
    moves it back. A person's archive is not a disappearance."""
    if not root:
        return None
    archive = os.path.join(os.path.dirname(os.path.realpath(root)), ARCHIVE_DIR)
    name = os.path.basename(path)
    for found in (name, name + ".zst"):
        if os.path.isfile(os.path.join(archive, found)):
            return f"archived by Codex ({ARCHIVE_DIR}/{found}); followed when unarchived"
    return None


UNREAD_META = frozenset({"base_instructions", "instructions"})  # the system prompt: unread


def codex_wire(record: dict[str, Any]) -> dict[str, Any]:
    """What a paired node sends of a record the pre-filter let through: all of it but the
    system prompt a ``session_meta`` carries, which no rule reads."""
    payload = record.get("payload")
    if record.get("type") != "session_meta" or not isinstance(payload, dict):
        return record
    return {**record, "payload": {k: v for k, v in payload.items() if k not in UNREAD_META}}


def _first(record: Any) -> CodexState:
    return state_from_first_record(record) if isinstance(record, dict) else CodexState()


def _declines(state: CodexState) -> str | None:
    return "a Codex sub-agent rollout is not adoptable" if state.subagent else None


# the task events Codex 0.171.0 writes around each turn (tests/fixtures/states)
_CODEX_TASKS = {"task_started": WORKING, "task_complete": WAITING, "turn_aborted": WAITING}


def codex_state(record: dict[str, Any]) -> str | None:
    """A turn's task started (working), completed or aborted (waiting)."""
    if record.get("type") != "event_msg":
        return None
    kind = member(record.get("payload"), "type")
    return _CODEX_TASKS.get(kind) if isinstance(kind, str) else None


def codex_state_wire(record: dict[str, Any]) -> dict[str, Any]:
    """What :func:`codex_state` reads of a record: its type and time, its payload's type."""
    payload = record.get("payload")
    kind = payload.get("type") if isinstance(payload, dict) else None
    return {
        "type": record.get("type"),
        "timestamp": record.get("timestamp"),
        "payload": {"type": kind},
    }


FORMAT = JsonlFormat[CodexState](
    kind="codex",
    classify=classify_codex_record,
    native_id=codex_native_id,
    state_from_marker=CodexState.from_marker,
    state_from_first=_first,
    prefilter=may_be_turn_at,
    idle=idle,
    strict=False,
    tested_version=TESTED_VERSION,
    prompt_text=codex_prompt_text,
    thread_id=rollout_thread_id,
    describe=describe_rollout,
    candidate=rollout_candidate,
    declines=_declines,
    ref_thread=True,
    compressed=True,  # local_thread_store_compression: rollouts idle for 7 days
    moved=archived_rollout,
    wire=codex_wire,
    catalog_lines=(),  # the first line names the working directory; no title in the file
    state_of=codex_state,
    state_wire=codex_state_wire,
    boundaries=(
        (WORKING, (b'"task_started"',)),
        (WAITING, (b'"task_complete"', b'"turn_aborted"')),
    ),
)


def build(settings: Settings) -> Adapter:
    from adapters.jsonl_adapter import JsonlAdapter

    return JsonlAdapter(FORMAT, settings)
