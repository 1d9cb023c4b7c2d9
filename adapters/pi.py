"""Pi v3 session JSONL: which entry is a direct human turn.

Pure: a parsed entry and the file's state (the fork cut-off of a forked file) in, the hash of
a human turn (or None) out. The rules are in docs/formats.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from adapters.base import (
    UNCLASSIFIED,
    Adapter,
    Settings,
    Verdict,
    as_text,
    content_text,
    member,
    normalize_text,
    parse_time,
    text_hash,
    unknown_blocks,
)
from adapters.jsonl_format import JsonlFormat
from adapters.states import WAITING, WORKING
from monitor.errors import Declined

MIGRATE_HINT = "not a Pi v3 session: resume it once in Pi to migrate it to v3"
TESTED_VERSION = "3"
NEWER = (
    "a Pi session of a newer layout ({declared}) than this sessionwatch reads (version 3):"
    " not supported yet"
)
KNOWN_TYPES = frozenset(
    {
        "session",
        "message",
        "model_change",
        "thinking_level_change",
        "compaction",
        "branch_summary",
        "custom",
        "custom_message",
        "label",
        "session_info",
    }
)
KNOWN_ROLES = frozenset(
    {"user", "assistant", "toolResult", "bashExecution", "custom", "system"}
)  # ``system``: the system prompt, which Pi persists as a message
KNOWN_USER_BLOCKS = frozenset({"text", "image"})


@dataclass
class PiState:
    fork_cutoff: str | None = None

    def to_marker(self) -> dict[str, Any]:
        return {"forkCutoff": self.fork_cutoff}

    @classmethod
    def from_marker(cls, marker: dict[str, Any]) -> PiState:
        cutoff = marker.get("forkCutoff")
        return cls(fork_cutoff=as_text(cutoff))


def state_from_header(record: Any) -> PiState:
    """The header of a v3 file. An older file is declined with the migration hint (Pi
    migrates it when it resumes it); a newer layout is declined as not supported, with the
    version it declares: a file never migrates down."""
    newer = _newer_layout(record)
    if newer is not None:
        raise Declined(NEWER.format(declared=newer))
    if member(record, "type") != "session" or record.get("version") != 3:
        raise Declined(MIGRATE_HINT)
    cutoff = record.get("timestamp") if record.get("parentSession") else None
    return PiState(fork_cutoff=as_text(cutoff))


def _newer_layout(record: Any) -> str | None:
    """How a header of a layout newer than v3 declares itself, or None: a ``session``
    header of a version above 3, or the ``kind``-tagged records (header, entry, record)
    seen in other projects' fixtures."""
    if not isinstance(record, dict):
        return None
    version = record.get("version")
    if record.get("type") == "session" and isinstance(version, int) and version > 3:
        return f"version {version}"
    if record.get("kind") == "header" and "type" not in record:
        return _kind_tagged(record)
    return None


def _kind_tagged(header: dict[str, Any]) -> str:
    """How a ``kind``-tagged header declares its version."""
    version = header.get("version")
    declared = version if version is not None else header.get("formatVersion")
    return f"version {declared}" if declared is not None else "kind-tagged records"


TEXT_BLOCKS = frozenset({"text"})


def _copied_by_fork(record: dict[str, Any], state: PiState) -> bool:
    if state.fork_cutoff is None:
        return False
    cutoff, at = parse_time(state.fork_cutoff), parse_time(record.get("timestamp"))
    return cutoff is not None and at is not None and at < cutoff


def classify_pi_record(record: dict[str, Any], state: PiState) -> Verdict | None:
    """What one entry is: a direct human turn (a prompt or a ``!`` shell escape), a
    compaction, or drift."""
    kind = record.get("type")
    if kind == "session":
        state.fork_cutoff = state_from_header(record).fork_cutoff
        return Verdict(version=str(record.get("version")))
    if kind not in KNOWN_TYPES:
        return Verdict(unknown_type=str(kind))
    if _copied_by_fork(record, state):
        return None
    if kind == "compaction":
        entry = record.get("id")
        return Verdict(compaction=f"pi:{entry}") if isinstance(entry, str) else None
    return _message(record.get("message")) if kind == "message" else None


def _message(message: Any) -> Verdict | None:
    """A message entry's message, read by its role."""
    if not isinstance(message, dict):
        return UNCLASSIFIED
    role = message.get("role")
    read = _BY_ROLE.get(role) if isinstance(role, str) else None
    return read(message) if read is not None else _other_role(role)


def _shell_escape(message: dict[str, Any]) -> Verdict | None:
    """A ``!`` command the person ran."""
    command = message.get("command")
    return Verdict(turn=text_hash(f"!{command}")) if isinstance(command, str) and command else None


def _user(message: dict[str, Any]) -> Verdict | None:
    """A user message: a turn when its text blocks say something; a block nobody knows is
    reported, never guessed."""
    content = message.get("content")
    if not isinstance(content, (str, list)):  # a tuple: a union is built per call
        return UNCLASSIFIED
    if unknown_blocks(content, KNOWN_USER_BLOCKS):
        return UNCLASSIFIED
    text = content_text(content, TEXT_BLOCKS)
    return Verdict(turn=text_hash(text)) if normalize_text(text) else None


def _other_role(role: Any) -> Verdict | None:
    """Any other role: nothing, unless nobody knows it or it looks like a user's."""
    user_like = isinstance(role, str) and "user" in role.lower()
    return UNCLASSIFIED if user_like or role not in KNOWN_ROLES else None


_BY_ROLE: dict[str, Callable[[dict[str, Any]], Verdict | None]] = {
    "bashExecution": _shell_escape,
    "user": _user,
}


HEAD = 256  # id, parentId and timestamp come before the message
_MESSAGE_FIRST = b'{"type":"message",'
_ROLE = b'"message":{"role":"'
_QUIET_ROLES = frozenset({b"assistant", b"toolResult", b"system", b"custom"})


class _Anything(msgspec.Struct):
    """Decoding into a struct with no fields checks that the bytes are JSON and builds no
    object for what they hold."""


_CHECK = msgspec.json.Decoder(_Anything)


def may_be_turn_at(buf: bytes, start: int, stop: int) -> bool:
    """Whether the line ``buf[start:stop]`` could matter; lines that cannot are never parsed.

    Skipped: a ``message`` entry (its type is its first key) whose message, the first object
    in the head, is the model's (``assistant``), a tool's (``toolResult``), the system
    prompt or an extension's (``custom``): most of a session's bytes, and never a turn, a
    compaction or drift. An unescaped quote cannot
    occur inside a JSON string, so these matches are JSON structure. Pi stops at an invalid
    line, so a line is skipped only once it is known to be JSON (checked without building
    its objects); any other line is parsed, and one that is not JSON stops the link as
    before."""
    if not buf.startswith(_MESSAGE_FIRST, start):
        return True
    head = min(stop, start + HEAD)
    at = buf.find(_ROLE, start, head)
    if at < 0:
        return True
    at += len(_ROLE)  # the role's value
    end = buf.find(b'"', at, head)
    if end < 0 or buf[at:end] not in _QUIET_ROLES:
        return True
    try:
        _CHECK.decode(memoryview(buf)[start:stop])
    except msgspec.DecodeError:
        return True
    return False


def pi_native_id(record: dict[str, Any]) -> str | None:
    entry_id = record.get("id")
    return as_text(entry_id)


def pi_prompt_text(record: dict[str, Any]) -> str:
    """The text of a record the classifier counted as a turn (the catalog's title)."""
    message = record.get("message")
    if not isinstance(message, dict):
        return ""
    if message.get("role") == "bashExecution":
        return f"!{message.get('command', '')}"
    return content_text(message.get("content"), TEXT_BLOCKS)


_WIRE_KEYS = (
    "type",
    "id",
    "parentId",
    "timestamp",
    "version",
    "formatVersion",
    "parentSession",
    "kind",
)


def pi_wire(record: dict[str, Any]) -> dict[str, Any]:
    """What a paired node sends of an entry: what :func:`classify_pi_record` and the
    scanner read (its type, id and time; a header's version and parent; a message's role, a
    user message's text blocks and the types of its other blocks, a shell escape's
    command). An assistant's text, a tool's result, an image's data never cross the wire."""
    out = {k: record[k] for k in _WIRE_KEYS if k in record}
    message = record.get("message")
    if "message" in record:
        out["message"] = _wire_message(message) if isinstance(message, dict) else None
    return out


def _wire_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message's role; a shell escape's command; a user message's content, its blocks
    as :func:`_block` keeps them."""
    role = message.get("role")
    sent: dict[str, Any] = {"role": role}
    if role == "bashExecution" and "command" in message:
        sent["command"] = message["command"]
    elif role == "user" and "content" in message:
        content = message["content"]
        sent["content"] = [_block(b) for b in content] if isinstance(content, list) else content
    return sent


def _block(block: Any) -> Any:
    if not isinstance(block, dict):
        return block
    if block.get("type") == "text":
        return {"type": "text", "text": block.get("text")}
    return {"type": block.get("type")}


def pi_thread_id(stem: str) -> str:
    """``<timestamp>_<session id>``: the part after the last underscore."""
    return stem.rsplit("_", 1)[1] if "_" in stem else stem


def describe_pi_file(
    first: dict[str, Any], head: list[dict[str, Any]]
) -> tuple[str | None, str | None] | None:
    if first.get("type") != "session":
        raise ValueError("no Pi session header")
    cwd = first.get("cwd")
    return str(first.get("id") or "") or None, as_text(cwd)


# an assistant message's stopReason, as Pi 1.6.0 writes them (tests/fixtures/states)
_PI_STOPS = {"stop": WAITING, "aborted": WAITING, "toolUse": WORKING}


def pi_state(record: dict[str, Any]) -> str | None:
    """A prompt or a tool's result: working; an assistant message, by its stopReason."""
    if record.get("type") != "message":
        return None
    message = record.get("message")
    role = member(message, "role")
    if role in ("user", "toolResult"):
        return WORKING
    stop = member(message, "stopReason")
    return _PI_STOPS.get(stop) if role == "assistant" and isinstance(stop, str) else None


def pi_state_wire(record: dict[str, Any]) -> dict[str, Any]:
    """What :func:`pi_state` reads of an entry: its type and time, its message's role and
    stop reason (never its text)."""
    message = record.get("message")
    kept = (
        {k: message[k] for k in ("role", "stopReason") if k in message}
        if isinstance(message, dict)
        else message
    )
    return {"type": record.get("type"), "timestamp": record.get("timestamp"), "message": kept}


FORMAT = JsonlFormat[PiState](
    kind="pi",
    classify=classify_pi_record,
    native_id=pi_native_id,
    state_from_marker=PiState.from_marker,
    state_from_first=state_from_header,
    prefilter=may_be_turn_at,
    strict=True,
    tested_version=TESTED_VERSION,
    prompt_text=pi_prompt_text,
    thread_id=pi_thread_id,
    wire=pi_wire,
    describe=describe_pi_file,
    catalog_lines=(b"session_info",),  # its session name; the header names the directory
    state_of=pi_state,
    state_wire=pi_state_wire,
    boundaries=(
        (WORKING, (b'"role":"user"', b'"role":"toolResult"', b'"stopReason":"toolUse"')),
        (WAITING, (b'"stopReason":"stop"', b'"stopReason":"aborted"')),
    ),
)


def build(settings: Settings) -> Adapter:
    from adapters.jsonl_adapter import JsonlAdapter

    return JsonlAdapter(FORMAT, settings)
