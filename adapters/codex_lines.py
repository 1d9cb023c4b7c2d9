"""Codex's rollout records as the classifier meets them: the types and subtypes each
release declares (what is known, what is drift), and the byte test of whether a line may be
a person's turn at all, run before a line is parsed (:func:`may_be_turn_at`)."""

from __future__ import annotations

import functools
import re

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
