"""Claude Code JSONL transcripts: which record is a direct human turn.

:func:`classify_claude_record` is pure: a parsed record and the link's pending-queue state in,
a :class:`Verdict` (a human turn's text hash, a compaction, drift) or None out. The rules,
and the versions they were checked against, are in docs/formats.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from adapters.base import (
    UNCLASSIFIED,
    Adapter,
    Settings,
    Verdict,
    as_list,
    as_text,
    member,
    normalize_text,
    normalized_hash,
    unknown_blocks,
)
from adapters.jsonl_format import JsonlFormat
from adapters.states import ASKING, WAITING, WORKING

NOT_PROMPT_PREFIXES = (
    "<local-command-caveat>",
    "<local-command-stdout>",
    "<local-command-stderr>",
    "<bash-stdout>",
    "<bash-stderr>",
    "<task-notification>",
    "<system-reminder>",
    "Caveat:",
    "This session is being continued from a previous conversation",
    "[Inter-session message]",
    "[Request interrupted by user",
    "Continue this conversation using the OpenClaw transcript below",
)
ACTION_PREFIXES = ("<command-name>", "<command-message>", "<bash-input>")
IDE_BLOCKS = (("<ide_opened_file>", "</ide_opened_file>"), ("<ide_selection>", "</ide_selection>"))
_IDE_OPENINGS = tuple(opening for opening, _ in IDE_BLOCKS)
_NOT_ENQUEUED = ("/", *ACTION_PREFIXES, *NOT_PROMPT_PREFIXES)
PENDING_LIMIT = 20
COMPACTING_COMMANDS = frozenset({"/compact"})  # the harness's own compaction
TESTED_VERSION = "2.1.332"  # tests/harnesses drives this release of the real CLI
KNOWN_TYPES = frozenset(
    {
        "user",
        "assistant",
        "system",
        "attachment",
        "progress",
        "summary",
        "file-history-snapshot",
        "file-history-delta",
        "queue-operation",
        "last-prompt",
        "custom-title",
        "ai-title",
        "agent-name",
        "agent-setting",
        "mode",
        "permission-mode",
        "atis-latch",
        "bridge-session",
        "tag",
        "ended",
        "pr-link",
        "worktree-state",
        "content-replacement",
        "marble-origami-commit",
        "marble-origami-snapshot",
        "speculation-accept",
        # 2.1.332: request bookkeeping, never a turn
        "api-request",
        "api-request-shape",
        "api-request-blob",
        "cost-state",
        "tools-used",  # 2.1.332, after a tool call: the tools' names, never a turn
    }
)
# Attachment kinds Claude Code writes (read off the 2.1.332 binary's attachment handling and
# off real transcripts). Only a human ``queued_command`` is a turn; an unknown kind is drift.
KNOWN_ATTACHMENTS = frozenset(
    {
        *("account_memory_recall", "advisor_stripped", "advisor_tool", "agent_ask_notice"),
        *("agent_listing_delta", "agent_mention", "already_read_file"),
        *("artifact_opening_prefetch", "async_hook_response", "async_hook_response_batch"),
        *("at_mention_reference", "attention_budget", "auto_mode", "auto_mode_exit"),
        *("batching_reminder", "batching_reminder_sent", "claude_app_notice"),
        *("command_permissions", "compact_file_reference", "context_efficiency"),
        *("context_sections", "coordinator_context", "cowork_memory_context"),
        *("critical_system_reminder", "date", "deferred_tools_delta", "deferred_tools_record"),
        *("diagnostics", "dir_sync_notice", "directory", "dynamic_skill", "edited_text_file"),
        *("edited_image_file", "environment", "file", "first_week", "fork_briefing"),
        *("goal_status", "hook_additional_context", "hook_blocking_error", "hook_cancelled"),
        *("hook_deferred_tool", "hook_error_during_execution", "hook_non_blocking_error"),
        *("hook_permission_decision", "hook_stopped_continuation", "hook_success"),
        *("hook_system_message", "image", "inlined_image_paths", "instructions"),
        *("invoked_skills", "language", "max_turns_reached", "mcp_dropped_tools_delta"),
        *("mcp_instructions_delta", "mcp_resource", "memory_update", "message_pdf_reads"),
        *("model", "nested_memory", "notebook", "output_limit_note"),
        *("output_style_instructions", "pdf", "pdf_reference", "peer_mention"),
        *("plan_file_reference", "plan_mode", "plan_mode_exit", "plan_mode_reentry"),
        *("plugin_note", "progress_reminder_sent", "project_doc_reads"),
        *("projects_thread_ask", "prompt_as_file", "prompt_render_point", "prompt_snapshot"),
        *("queued_command", "read_truncation_notice", "relevant_memories"),
        *("remote_session_change", "repl_mcp_needs_auth", "sandbox_instructions"),
        *("secondary_reminder", "secondary_reminder_sent", "selected_lines_in_diff"),
        *("selected_lines_in_ide", "session_context", "session_cron_carry"),
        *("silent_turn_reminder", "skill_listing", "structured_output", "task_reminder"),
        *("task_status", "team_context", "teammate", "teammate_mailbox"),
        *("teammate_shutdown_batch", "thinking_stripped", "todo", "todo_reminder"),
        *("token_usage", "tool_host_result_lines", "tool_hosts_correction"),
        *("tool_hosts_notice", "tool_offer_record", "tool_results_cut"),
        *("tool_search_usage_reminder", "total_tokens_reminder", "ultra_effort_enter"),
        *("ultra_effort_exit", "upgrade", "withheld_memory", "workflow_size_guideline_change"),
    }
)
# Content blocks a user message carries; any other makes the record unclassified.
KNOWN_USER_BLOCKS = frozenset({"text", "tool_result", "image", "document"})
_EXCLUDING_FLAGS = (
    "isSidechain",
    "isMeta",
    "isCompactSummary",
    "isVisibleInTranscriptOnly",
    "turnCompanion",
    "isVirtual",
)


# What the pre-filter reads of a line first: its head, where the record's own type sits when
# it precedes the message (older releases, and records that start with their type); 2.1.x
# writes it after the message or attachment object, and then the rest of the line is read.
HEAD = 1024
_ASSISTANT = b'"type":"assistant"'
_ATTACHMENT = b'"type":"attachment"'
_ROLE_ASSISTANT = b'"role":"assistant"'
_TOOL_RESULT = b'"type":"tool_result"'
_TOOL_USE_RESULT = b'"toolUseResult":'
# The first in the head of: a type (the record's, when it is its first key or when older
# releases write it before the message), or the start of a message (as 2.1.x writes an
# assistant record's, before its type) or of an attachment (its kind read).
_HEAD = re.compile(rb'"(?:type":"([^"]*)"|message":\{|attachment":\{"type":"([^"]*)")')
_head_search = _HEAD.search
_OPERATION = b',"operation":"'
_QUIET_IN_HEAD = frozenset({b"assistant", b"progress", b"file-history-snapshot"})
# Record types whose every record classifies as nothing, whatever it holds (see
# classify_claude_record: the known types but user, attachment, queue-operation and system).
_QUIET_TYPES = frozenset(
    t.encode() for t in KNOWN_TYPES - {"user", "attachment", "queue-operation", "system"}
)
_QUIET_ATTACHMENTS = frozenset(
    t.encode() for t in KNOWN_ATTACHMENTS - {"queued_command", "poll_events"}
)


def may_be_turn_at(buf: bytes, start: int, stop: int) -> bool:
    """Whether the line ``buf[start:stop]`` could matter; lines that cannot are never parsed.

    An unescaped quote cannot occur inside a JSON string, so a match of ``"type":"…"`` in
    the raw bytes is JSON structure, never text someone typed. Skipped, as they classify as
    nothing whatever they hold:

    - a record whose first key is its type, of a type that is never a turn, a compaction or
      drift (request bookkeeping, snapshots, titles: most of a 2.1.x transcript's bytes), or
      a queue operation whose operation, its next key, is written plainly and is not an
      enqueue;
    - an assistant, progress or snapshot record whose type is the first in the head (older
      releases write it after metadata, before the message);
    - a user record carrying a tool result;
    - an assistant record as 2.1.x writes it: its message (``"message":{`` …
      ``"role":"assistant"``) first in the head, its own type after the message;
    - an attachment of a kind that is never a turn or drift, its kind first in the head and
      the record's type after the attachment (2.1.332 writes the attachment's text again
      after it, ``rendered``, often KiBs of it).

    Everything else is parsed. What bytes cannot show is taken on the writers' word
    (docs/formats.md): the first type, message or attachment in a record's head is the
    record's own, as is the last ``"type":"assistant"`` or ``"type":"attachment"`` after
    such a payload, and a tool result in a user record; a line shaped as a record is
    one whole record.
    """
    head = start + HEAD if start + HEAD < stop else stop
    found = _head_search(buf, start, head)
    if found is None:
        return True
    kind = found[1]
    if kind is not None:  # a type
        if kind == b"user":  # only a tool result is skipped
            return buf.find(_TOOL_RESULT, start, stop) < 0 and (
                buf.find(_TOOL_USE_RESULT, start, stop) < 0
            )
        if found.start() != start + 1:  # after other keys, as older releases write it
            return kind not in _QUIET_IN_HEAD
        if kind == b"queue-operation":
            return _may_be_enqueue(buf, found.end(), head)
        return kind not in _QUIET_TYPES
    # its payload first, its own type after it (2.1.x): the last one, read from the line's end
    at = found.end()
    attachment = found[2]
    if attachment is None:  # a message
        return buf.find(_ROLE_ASSISTANT, at, head) < 0 or buf.rfind(_ASSISTANT, at, stop) < 0
    return attachment not in _QUIET_ATTACHMENTS or buf.rfind(_ATTACHMENT, at, stop) < 0


def _may_be_enqueue(buf: bytes, at: int, head: int) -> bool:
    """Whether a queue operation, its type ending at ``at``, may be an enqueue: it is not
    when its operation is the next key and reads as another, unescaped."""
    if not buf.startswith(_OPERATION, at):
        return True
    at += len(_OPERATION)
    end = buf.find(b'"', at, head)
    return end < 0 or buf[at:end] == b"enqueue" or b"\\" in buf[at:end]


@dataclass
class ClaudeState:
    """Hashes of prompts enqueued while Claude was busy and not yet seen again."""

    pending: list[str] = field(default_factory=list)

    def to_marker(self) -> dict[str, Any]:
        return {"pending": list(self.pending)}

    @classmethod
    def from_marker(cls, marker: dict[str, Any]) -> ClaudeState:
        pending = marker.get("pending")
        ok = isinstance(pending, list) and all(isinstance(p, str) for p in pending)
        return cls(pending=list(pending) if ok else [])  # type: ignore[arg-type]


def block_text(content: Any) -> tuple[str, bool]:
    """The text of a message's content, and whether it holds a tool result."""
    if isinstance(content, str):
        return content, False
    if not isinstance(content, list):
        return "", False
    texts = [text for b in content if (text := _block_text(b)) is not None]
    return "\n".join(texts), any(member(b, "type") == "tool_result" for b in content)


def _block_text(block: Any) -> str | None:
    """The text of a text block; None for any other block."""
    return as_text(block.get("text")) if member(block, "type") == "text" else None


def strip_ide_blocks(text: str) -> str:
    """Drop leading ``<ide_opened_file>``/``<ide_selection>`` blocks an IDE injects."""
    rest = text.lstrip()
    if not rest.startswith(_IDE_OPENINGS):
        return rest
    while (stripped := _strip_ide_block(rest)) is not None:
        rest = stripped
    return rest


def _strip_ide_block(text: str) -> str | None:
    """``text`` after the IDE block it starts with; None when it starts with none."""
    for opening, closing in IDE_BLOCKS:
        if text.startswith(opening):
            end = text.find(closing)
            return "" if end < 0 else text[end + len(closing) :].lstrip()
    return None


def _command_name(body: str) -> str | None:
    """The name of a slash command row (``<command-name>/compact</command-name>``)."""
    start = body.find("<command-name>")
    end = body.find("</command-name>", start)
    if start < 0 or end < 0:
        return None
    return body[start + len("<command-name>") : end].strip()


def _prompt_hash(text: str, state: ClaudeState, *, slash_allowed: bool) -> str | None:
    """Hash of a typed prompt, or None for non-prompts; a pending enqueue is the same turn."""
    body = strip_ide_blocks(text)
    normalized = normalize_text(body)
    if not normalized:
        return None
    if body.startswith(ACTION_PREFIXES):
        return _action_hash(body, normalized) if slash_allowed else None
    if body.startswith(NOT_PROMPT_PREFIXES):
        return None
    digest = normalized_hash(normalized)
    if digest in state.pending:
        state.pending.remove(digest)
        return None
    return digest


def _action_hash(body: str, normalized: str) -> str | None:
    """Hash of a slash command a person typed; None for one that compacts (recorded as
    ``compacted`` through its boundary, not as a turn)."""
    if _command_name(body) in COMPACTING_COMMANDS:
        return None
    return normalized_hash(normalized)


def _enqueue(content: Any, state: ClaudeState) -> str | None:
    text, _ = block_text(content)
    body = strip_ide_blocks(text)
    normalized = normalize_text(body)
    if not normalized or body.startswith(_NOT_ENQUEUED):
        return None  # a queued slash command counts as its <command-name> row
    digest = normalized_hash(normalized)
    state.pending.append(digest)
    del state.pending[:-PENDING_LIMIT]
    return digest


def _queued_command(attachment: dict[str, Any], state: ClaudeState) -> str | None:
    origin = attachment.get("origin")
    if isinstance(origin, dict):
        if origin.get("kind") != "human":
            return None
    elif attachment.get("commandMode") != "prompt":
        return None
    text, _ = block_text(attachment.get("prompt"))
    return _prompt_hash(text, state, slash_allowed=False)


def _turn(digest: str | None) -> Verdict | None:
    return Verdict(turn=digest) if digest else None


def compaction_id(record: dict[str, Any]) -> str | None:
    """A compaction Claude wrote itself: its boundary, or (older versions) its summary row,
    both named by the boundary's uuid."""
    kind = record.get("type")
    if kind == "system" and record.get("subtype") == "compact_boundary":
        uuid = record.get("uuid")
    elif kind == "user" and record.get("isCompactSummary") is True:
        uuid = _boundary_uuid(record)
    else:
        return None
    return f"claude:{uuid}" if isinstance(uuid, str) and uuid else None


def _boundary_uuid(summary: dict[str, Any]) -> Any:
    """The uuid of the boundary a compaction summary row follows (older versions)."""
    return summary.get("logicalParentUuid") or summary.get("parentUuid") or summary.get("uuid")


def classify_claude_record(record: dict[str, Any], state: ClaudeState) -> Verdict | None:
    """What one transcript record is. Updates ``state.pending``."""
    kind = record.get("type")
    if kind == "queue-operation":
        return _queue_operation(record, state)
    if kind == "attachment":
        return _attachment(record.get("attachment"), state)
    compaction = compaction_id(record)
    if compaction is not None:
        return Verdict(compaction=compaction)
    if kind != "user":
        return Verdict(unknown_type=str(kind)) if kind not in KNOWN_TYPES else None
    return _user_record(record, state)


def _queue_operation(record: dict[str, Any], state: ClaudeState) -> Verdict | None:
    """An enqueue is a person's turn (once: the row it becomes is then the same turn)."""
    if record.get("operation") != "enqueue":
        return None
    return _turn(_enqueue(record.get("content"), state))


def _user_record(record: dict[str, Any], state: ClaudeState) -> Verdict | None:
    """A ``user`` record that is no compaction summary: a tool result, a person's turn, or
    unclassified; with the version it names, which drift reads."""
    message = record.get("message")
    if "toolUseResult" in record or _holds_tool_result(message):
        return None  # a tool result, whatever else its message holds (as the pre-filter)
    version = record.get("version")
    if not isinstance(message, dict) or message.get("role") != "user":
        return UNCLASSIFIED
    if not isinstance(message.get("content"), (str, list)):  # a tuple: a union is built per call
        return UNCLASSIFIED
    verdict = _user_turn(record, message, state)
    return _versioned(verdict, version) if isinstance(version, str) else verdict


def _versioned(verdict: Verdict | None, version: str) -> Verdict:
    """A user record's verdict (a turn or unclassified, never more) with its version."""
    if verdict is None:
        return Verdict(version=version)
    return Verdict(turn=verdict.turn, unclassified=verdict.unclassified, version=version)


def _attachment(attachment: Any, state: ClaudeState) -> Verdict | None:
    if not isinstance(attachment, dict):
        return None
    kind = attachment.get("type")
    if kind == "queued_command":
        return _turn(_queued_command(attachment, state))
    if kind == "poll_events" and _from_a_person(attachment.get("provenance")):
        return UNCLASSIFIED  # a person's words delivered by polling: no rule for them yet
    if kind not in KNOWN_ATTACHMENTS:
        return Verdict(unknown_type=f"attachment:{kind}")
    return None


def _from_a_person(provenance: Any) -> bool:
    entries = provenance if isinstance(provenance, list) else [provenance]
    return any(isinstance(e, dict) and e.get("kind") == "principal" for e in entries)


def _holds_tool_result(message: Any) -> bool:
    content = member(message, "content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def _user_turn(
    record: dict[str, Any], message: dict[str, Any], state: ClaudeState
) -> Verdict | None:
    if _not_typed(record):
        return None
    text, tool_result = block_text(message.get("content"))
    if tool_result:
        return None
    if unknown_blocks(message.get("content"), KNOWN_USER_BLOCKS):
        return UNCLASSIFIED  # a block nobody knows: reported, never guessed
    return _turn(_prompt_hash(text, state, slash_allowed=True))


def _not_typed(record: dict[str, Any]) -> bool:
    """A user record that is not what a person typed: flagged as meta (and the like), a
    plan, of an origin that is not human, or sent by the system."""
    for flag in _EXCLUDING_FLAGS:
        if record.get(flag) is True:
            return True
    if "planContent" in record or record.get("promptSource") == "system":
        return True
    origin = record.get("origin")
    return origin is not None and (not isinstance(origin, dict) or origin.get("kind") != "human")


def claude_native_id(record: dict[str, Any]) -> str | None:
    uuid = record.get("uuid")
    return as_text(uuid)


def claude_prompt_text(record: dict[str, Any]) -> str:
    """The text of a record the classifier counted as a turn (the catalog's title)."""
    if record.get("type") == "queue-operation":
        text, _ = block_text(record.get("content"))
    elif record.get("type") == "attachment":
        attachment = record.get("attachment")
        text, _ = block_text(member(attachment, "prompt"))
    else:
        message = record.get("message")
        text, _ = block_text(member(message, "content"))
    return strip_ide_blocks(text)


def claude_candidate(folder: str, name: str) -> bool:
    """Sub-agent transcripts (``subagents/``, ``agent-*.jsonl``) are not adoptable."""
    return not (folder == "subagents" or name.startswith("agent-"))


def describe_claude_file(
    first: dict[str, Any], head: list[dict[str, Any]]
) -> tuple[str | None, str | None] | None:
    """A transcript's working directory (its first record that names one); a sidechain
    transcript is not adoptable."""
    if head[:1] and head[0].get("isSidechain") is True:
        return None
    cwd = next((r["cwd"] for r in head if isinstance(r.get("cwd"), str)), None)
    return None, cwd


def _first(_: Any) -> ClaudeState:
    return ClaudeState()


# an assistant message's stop_reason, as Claude Code 2.1.332 writes them (a message written
# in several lines says its stop_reason on the last only: null before); tests/fixtures/states
_CLAUDE_STOPS = {"end_turn": WAITING, "tool_use": WORKING}
INTERRUPTED = "[Request interrupted by user"
# the tool through which Claude Code's TUI asks a person a question and waits for the
# answer (``-p`` disables it); tests/fixtures/states/asks
ASKS = "AskUserQuestion"


def claude_state(record: dict[str, Any]) -> str | None:
    """In the main thread: an assistant message, by its stop_reason (a call of the tool
    that asks a person: asking); a tool's result or a prompt: working, and the row Claude
    writes for an interrupt: waiting. Rows of its own (meta, a compaction's summary, a
    sub-agent's) are no boundary, nor is the TUI's ``turn_duration``: it follows the
    message whose ``end_turn`` said so already."""
    kind = record.get("type")
    if kind not in ("assistant", "user") or any(record.get(k) is True for k in _NOT_A_TURNS_ROW):
        return None
    message = record.get("message")
    if kind == "assistant":
        stop = member(message, "stop_reason")
        state = _CLAUDE_STOPS.get(stop) if isinstance(stop, str) else None
        return ASKING if state == WORKING and _asks(member(message, "content")) else state
    text, tool_result = block_text(member(message, "content"))
    if tool_result or "toolUseResult" in record:
        return WORKING
    if text.startswith(INTERRUPTED):
        return WAITING
    return WORKING if text.strip() else None


def _asks(content: Any) -> bool:
    return any(
        member(b, "type") == "tool_use" and member(b, "name") == ASKS for b in as_list(content)
    )


_NOT_A_TURNS_ROW = ("isSidechain", "isMeta", "isCompactSummary", "isVisibleInTranscriptOnly")


FORMAT = JsonlFormat[ClaudeState](
    kind="claude",
    classify=classify_claude_record,
    native_id=claude_native_id,
    state_from_marker=ClaudeState.from_marker,
    state_from_first=_first,
    prefilter=may_be_turn_at,
    strict=False,
    tested_version=TESTED_VERSION,
    prompt_text=claude_prompt_text,
    thread_id=lambda stem: stem,
    describe=describe_claude_file,
    candidate=claude_candidate,
    # its titles and the recap it writes; and its records name their working directory,
    # the first that does is the one read
    catalog_lines=(b"custom-title", b"ai-title", b"away_summary"),
    catalog_first=((b'"cwd"', "cwd"),),
    state_of=claude_state,
    boundaries=(
        (WORKING, (b'"stop_reason":"tool_use"', b'"type":"user"')),
        (WAITING, (b'"stop_reason":"end_turn"', INTERRUPTED.encode())),
        (ASKING, (f'"name":"{ASKS}"'.encode(),)),
    ),
)


def build(settings: Settings) -> Adapter:
    from adapters.jsonl_adapter import JsonlAdapter

    return JsonlAdapter(FORMAT, settings)
