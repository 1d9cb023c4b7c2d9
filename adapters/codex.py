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

import functools
import os
import re
from dataclasses import dataclass, field
from typing import Any

from adapters.base import (
    UNCLASSIFIED,
    Adapter,
    Settings,
    Verdict,
    content_text,
    normalize_text,
    normalized_hash,
    text_hash,
)
from adapters.jsonl_format import JsonlFormat

CONTEXTUAL_MARKERS = (
    "# AGENTS.md instructions for ",
    "<user_instructions>",
    "<environment_context>",
    "<skill",
    "<user_shell_command>",
    "<turn_aborted>",
    "<subagent_notification>",
    "<extension_context>",
    "<goal_context>",
    "<hook_prompt",
    "<recommended_plugins>",
    "<heartbeat",
    "<collaboration_mode>",
    "<permissions instructions>",
    "<model_switch>",
)
SHELL_ESCAPE = "<user_shell_command>"
SHELL_KIND = "shell.user_command"
TYPED_KINDS = frozenset({"user.text", "user.image", "user.audio"})
KNOWN_TYPES = frozenset(
    {
        "session_meta",
        "response_item",
        "event_msg",
        "turn_context",
        "compacted",
        "world_state",
        "inter_agent_communication",
        "inter_agent_communication_metadata",
        "token_usage_record",  # 0.171: token accounting, never a turn
    }
)
HUMAN_THREAD_SOURCES = (None, "user", "cli")
TESTED_VERSION = "0.171.0"  # tests/harnesses drives this release of the real CLI
# The subtypes Codex defines, across its versions: ``EventMsg`` (an ``event_msg``'s
# ``type``), ``ResponseItem`` (a ``response_item``'s) and ``TurnItem`` (an
# ``item_completed`` item's), as its protocol crate declares them. Each was also found in
# the 0.171.0 binary but for the older ones marked below; the items the 0.171.0 binary lists
# beside ``UserMessage`` (a sub-agent's ``CollabAgentToolCall``, ...) are here too. Any
# other subtype is drift.
KNOWN_EVENTS = frozenset(
    {
        *("user_message", "agent_message", "agent_reasoning", "agent_reasoning_raw_content"),
        *("agent_reasoning_section_break", "agent_message_content_delta", "plan_delta"),
        *("reasoning_content_delta", "reasoning_raw_content_delta", "token_count"),
        *("task_started", "task_complete", "turn_aborted", "turn_diff", "context_compacted"),
        *("thread_rolled_back", "thread_goal_updated", "thread_settings_applied"),
        *("entered_review_mode", "exited_review_mode", "session_configured", "error"),
        *("warning", "stream_error", "deprecation_notice", "shutdown_complete", "plan_update"),
        *("item_started", "item_completed", "raw_response_item", "sub_agent_activity"),
        *("exec_command_begin", "exec_command_output_delta", "exec_command_end"),
        *("terminal_interaction", "exec_approval_request", "apply_patch_approval_request"),
        *("request_permissions", "request_user_input", "elicitation_request"),
        *("dynamic_tool_call_request", "dynamic_tool_call_response", "view_image_tool_call"),
        *("patch_apply_begin", "patch_apply_updated", "patch_apply_end"),
        *("mcp_startup_update", "mcp_startup_complete", "mcp_tool_call_begin"),
        *("mcp_tool_call_end", "web_search_begin", "web_search_end"),
        *("image_generation_begin", "image_generation_end", "hook_started", "hook_completed"),
        *("collab_agent_spawn_begin", "collab_agent_spawn_end", "collab_waiting_begin"),
        *("collab_agent_interaction_begin", "collab_agent_interaction_end"),
        *("collab_waiting_end", "collab_close_begin", "collab_close_end"),
        *("collab_resume_begin", "collab_resume_end", "guardian_assessment"),
        *("guardian_warning", "safety_buffering", "model_reroute", "model_verification"),
        *("turn_moderation_metadata", "realtime_conversation_started"),
        *("realtime_conversation_sdp", "realtime_conversation_realtime"),
        *("realtime_conversation_closed", "realtime_conversation_list_voices_response"),
        # older versions only
        *("agent_message_delta", "agent_reasoning_delta", "agent_reasoning_raw_content_delta"),
        *("thread_name_updated", "tool_call_pre_execute_request", "background_event"),
        *("undo_started", "undo_completed", "get_history_entry_response"),
        *("mcp_list_tools_response", "list_custom_prompts_response", "list_skills_response"),
        "skills_update_available",
    }
)
KNOWN_RESPONSE_ITEMS = frozenset(
    {
        *("message", "agent_message", "reasoning", "local_shell_call", "function_call"),
        *("function_call_output", "custom_tool_call", "custom_tool_call_output"),
        *("tool_search_call", "tool_search_output", "web_search_call", "image_generation_call"),
        *("compaction", "compaction_summary", "compaction_trigger", "context_compaction"),
        *("additional_tools", "configuration_update", "ghost_snapshot", "other"),
    }
)
KNOWN_ITEMS = frozenset(
    {
        *("UserMessage", "HookPrompt", "AgentMessage", "Plan", "Reasoning", "WebSearch"),
        *("ImageView", "ImageGeneration", "FileChange", "McpToolCall", "ContextCompaction"),
        *("Sleep", "FunctionCallOutput", "CollabAgentToolCall", "EnteredReviewMode"),
        *("ExitedReviewMode", "SubAgentActivity", "CommandExecution", "DynamicToolCall"),
        # newer than 0.171.0 in Codex's source
        *("InjectedContext", "EventDrivenTool", "EventCommandEvent", "CollabAgentMessage"),
        "ConversationArtifact",
    }
)
SUBTYPES = {"event_msg": KNOWN_EVENTS, "response_item": KNOWN_RESPONSE_ITEMS}
ECHO_LIMIT = 16
INPUT_BLOCKS = frozenset({"input_text", "text"})


_ROLE = b'"role":"'
_SUBTYPE = re.compile(rb'"payload":\s*\{\s*"type":\s*"([^"\\]{1,64})"')
# A record as Codex writes it, read from its first byte: its time (and, in 0.171.0, its
# ordinal), its type, and the first member of its payload when that is the payload's type
# (for a message, its role too, after its status and its id where it has them: 0.171.0
# writes an assistant's ``"type":"message","status":"completed","id":…,"role":"assistant"``).
# Matched from the line's start, each part is a whole JSON token, so what it reads is the
# record's own, never text in a string.
_ENVELOPE = re.compile(
    rb'\{"timestamp":"[^"\\]{0,64}",(?:"ordinal":\d{1,20},)?"type":"([a-z_]{1,64})"'
    rb'(?:,"payload":\{"type":"([^"\\]{1,64})"'
    rb'(?:(?:,"status":"[^"\\]{0,64}")?(?:,"id":"[^"\\]{0,128}")?,"role":"([^"\\]{0,64})")?)?'
)
_ENVELOPE_REACH = 256
# the events after which a prompt seen only as a role-user item is reported (_turn_goes_on)
TURN_GOES_ON = frozenset({"task_started", "task_complete", "agent_message", "token_count"})
_GOES_ON = frozenset(n.encode() for n in TURN_GOES_ON)
_EVENTS = frozenset(n.encode() for n in KNOWN_EVENTS)
_RESPONSES = frozenset(n.encode() for n in KNOWN_RESPONSE_ITEMS)
# an item_completed event's members before its item, as 0.171.0 writes them (its ids)
_ITEM = re.compile(
    rb'(?:,"thread_id":"[^"\\]{0,128}")?(?:,"turn_id":"[^"\\]{0,128}")?'
    rb',"item":\{"type":"([^"\\]{1,64})"'
)
# what a completed item never is: a person's turn (``UserMessage``, or a misspelling of it
# that is reported as unclassified, is parsed)
_QUIET_ITEMS = frozenset(n.encode() for n in KNOWN_ITEMS if n.lower() != "usermessage")


def may_be_turn_at(buf: bytes, start: int, stop: int) -> bool:
    """Whether the line ``buf[start:stop]`` could matter: a turn, a state change, a
    compaction, or a record of a type or subtype we may not know. Only lines that positively
    are model traffic of a known subtype are skipped: ``reasoning``, function calls and their
    outputs, assistant messages as response items, completed items of a declared type that
    is not a person's, token accounting; never an event that says the turn went on (see
    :data:`TURN_GOES_ON`), which :func:`idle` leaves unparsed while no prompt waits for
    it."""
    reach = start + _ENVELOPE_REACH
    envelope = _ENVELOPE.match(buf, start, reach if reach < stop else stop)
    if envelope is not None:
        decided = _decided(*envelope.groups())
        if decided is not None:
            return decided
        return _bytes_may_matter(envelope, buf, stop)
    head = min(stop, start + 160)
    find = buf.find
    response = find(b'"type":"response_item"', start, head) >= 0
    if not response and find(b'"type":"event_msg"', start, head) < 0:
        return True
    found = _SUBTYPE.search(buf, start, head)
    subtype = found.group(1).decode("utf-8", "replace") if found else None
    if subtype not in SUBTYPES["response_item" if response else "event_msg"]:
        return True
    if subtype == "item_completed":
        return _item_may_be_user(buf, found.end() if found else start, stop)
    if subtype in TURN_GOES_ON:
        return True  # it reports a prompt seen only as a role-user item (_turn_goes_on)
    if response:
        return _role_may_be_user(buf, start, stop)
    return (
        find(b'"user', start, stop) >= 0
        or find(b"UserMessage", start, stop) >= 0
        or find(b"user_message", start, stop) >= 0
    )


# Cached, so a line's decision is one lookup (the branches cost the pre-filter half its
# time); bounded, since the groups come from the files.
@functools.lru_cache(maxsize=4096)
def _decided(kind: bytes, subtype: bytes | None, role: bytes | None) -> bool | None:
    """:func:`may_be_turn_at` of a record whose type, payload type and (for a message) role
    are read for sure (:data:`_ENVELOPE`), as far as they decide it: most of what 0.171.0
    writes. None: the rest of the line decides (:func:`_bytes_may_matter`)."""
    if kind == b"token_usage_record":
        return False  # 0.171.0's token accounting, never a turn
    if subtype is None:
        return True
    if kind == b"response_item":
        if subtype not in _RESPONSES:
            return True
        if subtype != b"message":
            return False  # only a message is ever a person's
        return None if role is None else role == b"user"
    if kind != b"event_msg" or subtype not in _EVENTS:
        return True
    if subtype == b"item_completed":
        return None
    return subtype == b"user_message" or subtype in _GOES_ON


def _bytes_may_matter(envelope: re.Match[bytes], buf: bytes, stop: int) -> bool:
    """What the envelope leaves to the line's bytes: a completed item's type, or a message's
    roles when its own was not read."""
    if envelope[2] == b"item_completed":
        return _item_may_be_user(buf, envelope.end(), stop)
    return _role_may_be_user(buf, envelope.start(), stop)


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


def _item_may_be_user(buf: bytes, start: int, stop: int) -> bool:
    """Whether a completed item may be a person's. 0.171.0 writes one for every item of a
    turn, a command's whole output among them (most of a rollout's bytes). The item's type,
    its first key, is read right after the event's own type and ids (``start``: where the
    event's type ends): a type Codex declared, other than ``UserMessage``, is skipped; any
    other, or an item not found there, is parsed."""
    found = _ITEM.match(buf, start, stop)
    return found is None or found.group(1) not in _QUIET_ITEMS


def _role_may_be_user(buf: bytes, start: int, stop: int) -> bool:
    """Whether a role in the line may be ``user``: written so, or with an escape in it."""
    at = buf.find(_ROLE, start, stop)
    while at >= 0:
        at += len(_ROLE)
        end = buf.find(b'"', at, stop)
        if end < 0 or buf[at:end] == b"user" or b"\\" in buf[at:end]:
            return True
        at = buf.find(_ROLE, end, stop)
    return False


def may_be_turn(line: bytes) -> bool:
    """:func:`may_be_turn_at` of a whole line."""
    return may_be_turn_at(line, 0, len(line))


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
        echo = marker.get("echo")
        unmatched = marker.get("unmatched")
        pairs = (
            [list(e) for e in echo if isinstance(e, list) and len(e) == 2]
            if isinstance(echo, list)
            else []
        )
        return cls(
            legacy=marker.get("legacy") is True,
            subagent=marker.get("subagent") is True,
            paginated=marker.get("paginated") is True,
            history_start=start if isinstance(start, int) else None,
            fork_cutoff=cutoff if isinstance(cutoff, str) else None,
            echo=[[str(a), str(b)] for a, b in pairs],
            unmatched=[str(u) for u in unmatched] if isinstance(unmatched, list) else [],
        )

    def apply_meta(self, payload: dict[str, Any], timestamp: Any) -> None:
        self.legacy = False
        self.subagent = is_subagent_meta(payload)
        self.paginated = payload.get("history_mode") == "paginated"
        start = payload.get("subagent_history_start_ordinal")
        self.history_start = start if isinstance(start, int) else None
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
        return version if isinstance(version, str) else None
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


def _suppress(state: CodexState, digest: str) -> None:
    """A contextual twin: the same text in another form is not a prompt either."""
    state.echo.append(["context", digest])
    del state.echo[:-ECHO_LIMIT]


def _inherited(record: dict[str, Any], payload: dict[str, Any], state: CodexState) -> bool:
    ordinal = record.get("ordinal")
    start = state.history_start
    if start is not None and isinstance(ordinal, int) and ordinal < start:
        return True
    for holder in (record, payload):
        metadata = holder.get("metadata")
        if isinstance(metadata, dict) and metadata.get("inherited_user_message") is True:
            return True
    at = record.get("timestamp")
    return state.fork_cutoff is not None and isinstance(at, str) and at < state.fork_cutoff


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
        return UNCLASSIFIED if isinstance(kind, str) and kind.lower() == "usermessage" else None
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
    kinds = passthrough.get("content_item_kinds") if isinstance(passthrough, dict) else None
    if text.lstrip().startswith(SHELL_ESCAPE) or kinds == [SHELL_KIND]:
        return Verdict(turn=text_hash(text))  # the !cmd shell escape has no other form
    if not state.paginated:
        # it duplicates the user_message event, which is what counts; until that is seen,
        # the prompt waits as unmatched (see _turn_goes_on)
        digest = _typed(text)
        if digest and not any(seen == digest for _, seen in state.echo):
            state.unmatched = [*state.unmatched, digest][-ECHO_LIMIT:]
        return None
    if isinstance(kinds, list):
        typed = bool(kinds) and set(kinds) <= TYPED_KINDS and "user.text" in kinds
        if not typed:
            normalized = normalize_text(text)
            if normalized:
                _suppress(state, normalized_hash(normalized))
            return None
    return _once(state, "response", _typed(text))


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
    name = item.get("type") if isinstance(item, dict) else None
    if isinstance(name, str) and name not in KNOWN_ITEMS and name.lower() != "usermessage":
        return f"item_completed:{name}"  # a misspelt UserMessage is unclassified instead
    return None


def classify_codex_record(record: dict[str, Any], state: CodexState) -> Verdict | None:
    """What one rollout line is (see the module docstring). Updates ``state``."""
    kind = record.get("type")
    payload = record.get("payload")
    if kind == "session_meta" and isinstance(payload, dict):
        state.apply_meta(payload, record.get("timestamp"))
        version = declared_version(record)
        return Verdict(version=version) if version else None
    if kind is None and "payload" not in record and "id" in record:
        state.legacy = True  # a legacy rollout's bare meta line
        return None
    if state.legacy:
        return None if state.subagent else _legacy(record)
    if kind not in KNOWN_TYPES:
        return Verdict(unknown_type=str(kind))
    unknown = unknown_subtype(str(kind), payload)
    if unknown is not None:
        return Verdict(unknown_type=unknown)
    if state.subagent or not isinstance(payload, dict):
        return None
    if _inherited(record, payload, state):
        return None
    if kind == "compacted":
        at = record.get("timestamp")
        ordinal = record.get("ordinal")
        native = ordinal if isinstance(ordinal, int) else at
        return Verdict(compaction=f"codex:{native}") if native is not None else None
    if kind == "turn_context" or (kind == "event_msg" and payload.get("type") in TURN_GOES_ON):
        return _turn_goes_on(state)
    if kind == "event_msg":
        event = payload.get("type")
        if event == "user_message":
            return _user_message_event(payload, state)
        if event == "item_completed":
            return _completed_item(payload, state)
        return None
    if kind == "response_item":
        return _response_item(payload, state)
    return None


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
    return str(payload.get("id") or "") or None, cwd if isinstance(cwd, str) else None


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
)


def build(settings: Settings) -> Adapter:
    from adapters.jsonl_adapter import JsonlAdapter

    return JsonlAdapter(FORMAT, settings)
