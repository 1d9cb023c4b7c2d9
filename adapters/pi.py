"""Pi v3 session JSONL: which entry is a direct human turn.

Pure: a parsed entry and the file's state (the fork cut-off of a forked file) in, the hash of
a human turn (or None) out. See ``reference/native-formats.md`` section 4.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from adapters.base import Declined, content_text, normalize_text, text_hash

MIGRATE_HINT = "not a Pi v3 session: resume it once in Pi to migrate it to v3"


@dataclass
class PiState:
    fork_cutoff: str | None = None

    def to_marker(self) -> dict[str, Any]:
        return {"forkCutoff": self.fork_cutoff}

    @classmethod
    def from_marker(cls, marker: dict[str, Any]) -> PiState:
        cutoff = marker.get("forkCutoff")
        return cls(fork_cutoff=cutoff if isinstance(cutoff, str) else None)


def state_from_header(record: Any) -> PiState:
    """The header of a v3 file; anything else is declined with the migration hint."""
    if not isinstance(record, dict) or record.get("type") != "session":
        raise Declined(MIGRATE_HINT)
    if record.get("version") != 3:
        raise Declined(MIGRATE_HINT)
    cutoff = record.get("timestamp") if record.get("parentSession") else None
    return PiState(fork_cutoff=cutoff if isinstance(cutoff, str) else None)


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


TEXT_BLOCKS = frozenset({"text"})


def classify_pi_record(record: dict[str, Any], state: PiState) -> str | None:
    """The text hash of a direct human turn (a prompt or a ``!`` shell escape), or None."""
    if record.get("type") == "session":
        state.fork_cutoff = state_from_header(record).fork_cutoff
        return None
    if record.get("type") != "message":
        return None
    message = record.get("message")
    if not isinstance(message, dict):
        return None
    if state.fork_cutoff is not None:
        cutoff, at = parse_time(state.fork_cutoff), parse_time(record.get("timestamp"))
        if cutoff is not None and at is not None and at < cutoff:
            return None  # copied from the parent session by a fork
    role = message.get("role")
    if role == "bashExecution":
        command = message.get("command")
        return text_hash(f"!{command}") if isinstance(command, str) and command else None
    if role != "user":
        return None
    text = content_text(message.get("content"), TEXT_BLOCKS)
    return text_hash(text) if normalize_text(text) else None


def pi_native_id(record: dict[str, Any]) -> str | None:
    entry_id = record.get("id")
    return entry_id if isinstance(entry_id, str) else None
