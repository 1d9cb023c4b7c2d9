"""Session keys: ``agent:<agentId>:<rest>``, lower-cased.

A key with the ``agent:<id>:`` prefix is *agent-qualified*; a bare key such as ``global`` is
ambiguous across agents: it gets the log and ``changesSince`` but never a cursor or notice.
"""

from __future__ import annotations

import functools

from monitor.errors import BadInput
from monitor.records import NamedTuple

MAX_KEY_LENGTH = 512
_GROUP_MARKERS = frozenset({"group", "room", "channel"})
# The same few keys come with every request: their parses are remembered (pure functions).
_remembered = functools.lru_cache(maxsize=4096)


class AgentKey(NamedTuple):
    """A parsed agent-qualified session key."""

    agent_id: str
    rest: str

    @property
    def key(self) -> str:
        return f"agent:{self.agent_id}:{self.rest}"


@_remembered
def normalize_key(raw: str) -> str:
    """Trim and lower-case a session key; reject empty, multi-line or oversized keys. A
    byte-order mark counts as space (as it does in JSON Schema's ``\\s``)."""
    stripped = raw.strip().strip("\ufeff").strip()
    key = stripped.lower()
    if not key:
        raise BadInput("session key is empty")
    if len(stripped) > MAX_KEY_LENGTH:
        raise BadInput(f"session key is longer than {MAX_KEY_LENGTH} characters")
    if any(ch in key for ch in "\r\n\t\x00"):
        raise BadInput("session key contains a control character")
    if not key.isascii():
        _refuse_invisible(key)
    return key


def _refuse_invisible(key: str) -> None:
    """A key with a character that shows nothing (a bidi override, a zero-width space or
    joiner: Unicode's format and control characters) is refused: two keys could look the
    same and name two sessions. So is one not in Unicode's composed form (NFC): ``café``
    written with a combining accent prints as the one written with ``é``."""
    import unicodedata

    for ch in key:
        if unicodedata.category(ch) in ("Cf", "Cc"):
            raise BadInput(
                f"session key contains an invisible character (U+{ord(ch):04X}): two keys"
                " could look the same"
            )
    if not unicodedata.is_normalized("NFC", key):
        raise BadInput(
            "session key is not in Unicode's composed form (NFC): it would look like"
            f" {unicodedata.normalize('NFC', key)!r} and name another session; write it so"
        )


@_remembered
def parse_agent_key(key: str) -> AgentKey | None:
    """Return the agent and rest of an agent-qualified key, or None for a bare key."""
    parts = key.split(":", 2)
    if len(parts) < 3 or parts[0] != "agent" or not parts[1] or not parts[2]:
        return None
    return AgentKey(agent_id=parts[1], rest=parts[2])


def resolve_agent(key: str, agent_id: str | None) -> str:
    """The agent id owning ``key``: taken from the key, else from ``agent_id``."""
    parsed = parse_agent_key(key)
    explicit = agent_id.strip().lower() if agent_id else None
    if parsed is None:
        if not explicit:
            raise BadInput(f'session key "{key}" is not agent-qualified: give its agent id')
        return explicit
    if explicit and explicit != parsed.agent_id:
        raise BadInput(
            f'agent id "{explicit}" does not match session key "{key}" (agent "{parsed.agent_id}")'
        )
    return parsed.agent_id


def is_main_key(key: str, main_key: str = "main") -> bool:
    """True for an agent's main session, ``agent:<id>:<main_key>``."""
    parsed = parse_agent_key(key)
    return parsed is not None and parsed.rest == main_key


def main_key_for(agent_id: str, main_key: str = "main") -> str:
    return f"agent:{agent_id}:{main_key}"


def is_subagent_key(key: str) -> bool:
    """True for a nested sub-agent session (``agent:<id>:subagent:...``)."""
    parsed = parse_agent_key(key)
    return parsed is not None and parsed.rest.split(":", 1)[0] == "subagent"


@_remembered
def is_group_key(key: str) -> bool:
    """True for an isolated group, room or channel session (``...:group:<id>`` and the like)."""
    parsed = parse_agent_key(key)
    if parsed is None:
        return False
    segments = parsed.rest.split(":")
    return any(seg in _GROUP_MARKERS for seg in segments[:-1])


def is_internal_key(key: str) -> bool:
    """Internal, cron and draft sessions never raise a "session created" notice."""
    parsed = parse_agent_key(key)
    head = (parsed.rest if parsed else key).split(":", 1)[0]
    return head in {"cron", "hook", "internal", "draft", "incognito"}


def session_scope(key: str, agent_id: str | None) -> tuple[str, tuple[str, ...]]:
    """A SQL condition and its parameters for one session: the key under its agent, or a
    bare key under every agent when no agent id is given."""
    agent = resolve_agent(key, agent_id) if agent_id or parse_agent_key(key) else None
    if agent is None:
        return "session_key = ?", (key,)
    return "session_key = ? AND agent_id = ?", (key, agent)


def shown_key(key: str, width: int) -> str:
    """``key`` in at most ``width`` characters for people, what tells it apart kept: its
    ``agent:<id>:`` head and its tail. A key the gateway's catalog made for an adoption
    (``agent:main:plugin:anthropic:catalog-adopt:claude:<64 hex>``) differs from the next
    only in its tail, which a cut at the end would drop."""
    if len(key) <= width:
        return key
    second = key.find(":", key.find(":") + 1)
    head = key[: second + 1] if 0 < second < width // 2 else key[: (width - 1) // 2]
    return head + "…" + key[len(key) - (width - 1 - len(head)) :]
