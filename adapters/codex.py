"""Codex CLI rollout JSONL: which record is a direct human turn.

Pure: a parsed record and the rollout's state (legacy envelope? sub-agent?) in, the hash of
a human turn's text (or None) out. See ``reference/native-formats.md`` section 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapters.base import content_text, normalize_text, text_hash

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
)
SHELL_ESCAPE = "<user_shell_command>"


def may_be_turn(line: bytes) -> bool:
    """Whether a raw line could be a turn or change the rollout's state (a legacy rollout's
    bare meta line has no ``"type"`` key)."""
    return b'"user' in line or b"session_meta" in line or b'"type"' not in line


@dataclass
class CodexState:
    legacy: bool = False
    subagent: bool = False

    def to_marker(self) -> dict[str, Any]:
        return {"legacy": self.legacy, "subagent": self.subagent}

    @classmethod
    def from_marker(cls, marker: dict[str, Any]) -> CodexState:
        return cls(legacy=marker.get("legacy") is True, subagent=marker.get("subagent") is True)


def is_subagent_meta(payload: dict[str, Any]) -> bool:
    source = payload.get("source")
    if isinstance(source, dict) and "subagent" in source:
        return True
    return bool(payload.get("parent_thread_id"))


def state_from_first_record(record: dict[str, Any]) -> CodexState:
    """A rollout's first line tells its shape: an envelope ``session_meta`` or legacy."""
    if record.get("type") == "session_meta" and isinstance(record.get("payload"), dict):
        return CodexState(subagent=is_subagent_meta(record["payload"]))
    legacy = "payload" not in record and "id" in record and "type" not in record
    return CodexState(legacy=legacy)


INPUT_BLOCKS = frozenset({"input_text", "text"})


def _typed(text: str) -> str | None:
    body = text.lstrip()
    if not normalize_text(body) or body.startswith(CONTEXTUAL_MARKERS):
        return None
    return text_hash(body)


def _user_message_item(item: dict[str, Any]) -> str:
    if item.get("type") != "message" or item.get("role") != "user":
        return ""
    return content_text(item.get("content"), INPUT_BLOCKS)


def classify_codex_record(record: dict[str, Any], state: CodexState) -> str | None:
    """The text hash of a direct human turn, or None. A ``session_meta`` updates ``state``."""
    kind = record.get("type")
    payload = record.get("payload")
    if kind == "session_meta" and isinstance(payload, dict):
        state.subagent = is_subagent_meta(payload)
        state.legacy = False
        return None
    if kind is None and "payload" not in record and "id" in record:
        state.legacy = True  # a legacy rollout's bare meta line
        return None
    if state.subagent:
        return None
    if state.legacy:
        text = _user_message_item(record)
        if text.lstrip().startswith(SHELL_ESCAPE):
            return text_hash(text)
        return _typed(text)
    if not isinstance(payload, dict):
        return None
    if kind == "event_msg" and payload.get("type") == "user_message":
        if payload.get("kind") not in (None, "plain"):
            return None
        message = payload.get("message")
        return _typed(message) if isinstance(message, str) else None
    if kind == "response_item":
        text = _user_message_item(payload)
        if text.lstrip().startswith(SHELL_ESCAPE):
            return text_hash(text)
    return None
