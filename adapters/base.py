"""The seam every upstream format implements, and the values that cross it.

An adapter has two entry points:

- ``baseline(ref) -> marker``: where monitoring of a newly adopted source starts (the current
  end). Raises :class:`Declined` with a reason when the baseline cannot be trusted.
- ``check(probes) -> outcomes``: one outcome per probe, in order. It must not raise for one
  link's failure (that link's outcome is ``inconclusive``); an exception escaping ``check``
  makes every link of the batch inconclusive.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from monitor.errors import SessionwatchError

Marker = dict[str, Any]
Status = Literal["activity", "quiet", "missing", "blocked", "inconclusive"]


class Declined(SessionwatchError):
    """The source cannot be linked (its baseline cannot be trusted); says why."""


def normalize_text(text: str) -> str:
    """Trimmed, whitespace collapsed: how prompts are compared for self-echo and dedupe."""
    return " ".join(text.split())


def content_text(content: Any, block_types: frozenset[str]) -> str:
    """The text of a message's content: a string, or its text blocks joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        b["text"]
        for b in content
        if isinstance(b, dict) and b.get("type") in block_types and isinstance(b.get("text"), str)
    )


def text_hash(text: str) -> str:
    """Prompts are compared by the hash of their normalized text, never stored as text."""
    return hashlib.sha256(normalize_text(text).encode()).hexdigest()[:32]


@dataclass(frozen=True, kw_only=True, slots=True)
class Turn:
    """One direct human turn found upstream."""

    offset: int | None
    native_id: str | None
    text_hash: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Probe:
    """One link to check: its ref and marker, and the session's own recent messages."""

    session_key: str
    ref: dict[str, Any]
    marker: Marker
    own_hashes: frozenset[str] = frozenset()


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    status: Status
    marker: Marker | None = None
    turns: list[Turn] = field(default_factory=list)
    dedupe_id: str | None = None
    latest_at: int | None = None
    reason: str | None = None
    blocked_offset: int | None = None
    invalid_lines: int = 0


class Adapter(Protocol):
    """One upstream format. See the module docstring for the contract."""

    kind: str

    async def baseline(self, ref: dict[str, Any]) -> Marker: ...

    async def check(self, probes: list[Probe]) -> list[Outcome]: ...
