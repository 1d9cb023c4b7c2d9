"""The gateway's side of a Codex thread it adopted through the app-server: its monitor's
check (:func:`gateway_check`, on its own marker ``{turnId, userMessageCount}``), and its
Codex plugin's binding of a session to the thread it probes (:func:`probed_ref`,
:func:`busy`)."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
from typing import Any, NamedTuple

from adapters.base import (
    Marker,
    Outcome,
    Ref,
    Turn,
    as_dict,
    as_text,
    is_count,
    member,
)
from adapters.codex_rollout import Message, RolloutTurn

log = logging.getLogger(__name__)


TURN_LIMIT = 100  # the gateway's ``thread/turns/list`` page: the newest 100 turns


class GatewayMarker(NamedTuple):
    turn_id: str | None
    messages: int | None  # None: the marker names no count


def read_marker(marker: Marker) -> GatewayMarker | None:
    """The gateway's marker, or None when it is not one the gateway would read."""
    turn_id = marker.get("turnId")
    if "turnId" not in marker or (turn_id is not None and not isinstance(turn_id, str)):
        return None
    count = marker.get("userMessageCount", None)
    if count is not None and not is_count(count):
        return None
    return GatewayMarker(turn_id, count)


def own_echo(message: Message, own: frozenset[str]) -> bool:
    """The gateway's self-echo: the message's text is one of its own recent texts, or it has
    several blocks and each is; and a prompt its Codex plugin sent, by its provenance
    line."""
    if message.sent or message.joined in own:
        return True
    return len(message.blocks) > 1 and all(b in own for b in message.blocks)


def gateway_check(
    turns: list[RolloutTurn], marker: Marker, own: frozenset[str], now_ms: int
) -> Outcome:
    """What the gateway's monitor records for ``turns`` (oldest first) from ``marker``."""
    window = turns[-TURN_LIMIT:][::-1]  # newest first, as the app-server pages them
    read = read_marker(marker)
    if read is None or not window or window[0].id is None or _counted(read, window[0]):
        return Outcome(status="quiet", marker=marker)
    newest = window[0]
    newest_count = len(newest.messages)
    found, occurred = _found(_since(window, read.turn_id), read, own, now_ms)
    nxt = {"turnId": newest.id, "userMessageCount": newest_count}
    if not found:
        return Outcome(status="quiet", marker=nxt)
    return Outcome(
        status="activity",
        marker=nxt,
        turns=found,
        dedupe_id=f"{newest.id}:{newest_count}",
        latest_at=occurred,
    )


def _found(
    turns: list[RolloutTurn], read: GatewayMarker, own: frozenset[str], now_ms: int
) -> tuple[list[Turn], int | None]:
    """The new messages of ``turns`` (newest first), and when the newest of them happened."""
    found: list[Turn] = []
    occurred: int | None = None
    for turn in turns:
        new = _new_messages(turn, read, own)
        found += new
        occurred = occurred if occurred is not None or not new else _when(turn, now_ms)
    return found, occurred


def _since(window: list[RolloutTurn], turn_id: str | None) -> list[RolloutTurn]:
    """The turns (newest first) down to the marker's, or all of them when it is not there."""
    at = next((i for i, t in enumerate(window) if t.id == turn_id), -1)
    return window if turn_id is None or at < 0 else window[: at + 1]


def _counted(read: GatewayMarker, newest: RolloutTurn) -> bool:
    """The marker counted every message of the newest turn already."""
    return (
        read.turn_id == newest.id
        and read.messages is not None
        and len(newest.messages) <= read.messages
    )


def _when(turn: RolloutTurn, now_ms: int) -> int:
    """When a turn's prompt happened, as the gateway dates it: its end, else its start."""
    seconds = turn.completed_s if turn.completed_s is not None else turn.started_s
    return seconds * 1000 if seconds is not None else now_ms


def _new_messages(turn: RolloutTurn, read: GatewayMarker, own: frozenset[str]) -> list[Turn]:
    """A turn's messages the marker has not counted yet, but the gateway's own echoes."""
    seen = 0
    if turn.id == read.turn_id:
        seen = read.messages if read.messages is not None else len(turn.messages)
    return [
        Turn(offset=None, native_id=turn.id, text_hash=m.joined)
        for m in turn.messages[seen:]
        if not own_echo(m, own)
    ]


PROBE_KEY = "probeThreadId"  # what the tick adds to a ref: the thread the gateway probes
HINT_KEY = "rolloutPath"  # and the rollout the gateway's binding names for it, if any
# where the gateway's Codex plugin keeps a session's binding: its plugin state
PLUGIN_ID = "codex"
BINDINGS = "app-server-thread-bindings"


def binding_entry(agent_id: str, session_key: str) -> tuple[str, str, str]:
    """The plugin state entry of a session's binding: plugin, namespace and the plugin's
    key (``bindingStoreKey``: the agent and the session key's SHA-256, base64url)."""
    digest = hashlib.sha256(session_key.strip().encode()).digest()
    hashed = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    return PLUGIN_ID, BINDINGS, f"session-key:{agent_id.strip()}:{hashed}"


def probed_ref(ref: Ref, thread_id: str, stored: Any, session_id: str | None) -> Ref:
    """The ref to read for a link on ``thread_id``, given its session's stored binding
    (parsed) and the session's current id: with :data:`PROBE_KEY` naming the gateway's
    branch when the gateway probes the branch, else the link's own ref.

    The gateway adopts a thread "as a branch": while the branch is pending the binding names
    the source; once its first run made the branch (``thread/start`` with ``threadSource
    "openclaw"``, the history injected), the binding names the branch, and its monitor
    probes it: ``connectionScope == "supervision"`` and ``supervisionSourceThreadId`` equal
    to the link's thread give the binding's ``threadId``. A binding of another generation of
    the session (its ``sessionId`` is not the current one) is not the session's, and
    without a current session id the gateway probes the source too."""
    binding = _current_binding(stored, session_id)
    if binding is None:
        return ref
    bound = (as_text(binding.get("threadId")) or "").strip()
    probed = bound if bound and _supervises(binding, thread_id) else thread_id
    out = dict(ref)
    if probed != thread_id:
        out[PROBE_KEY] = probed
    rollout = _rollout_hint(binding, probed) if bound == probed else None
    if rollout is not None:
        out[HINT_KEY] = rollout  # where the gateway last saw the thread's rollout
    return out


def _rollout_hint(binding: dict[str, Any], thread_id: str) -> str | None:
    """The rollout the binding names for ``thread_id``, if it is that thread's."""
    rollout = as_text(binding.get("rolloutPath"))
    return rollout if rollout is not None and thread_id in os.path.basename(rollout) else None


def _supervises(binding: dict[str, Any], thread_id: str) -> bool:
    """The binding names the gateway's branch of ``thread_id``, which its monitor probes."""
    supervised = binding.get("supervisionSourceThreadId") == thread_id
    return supervised and binding.get("connectionScope") == "supervision"


def _current_binding(stored: Any, session_id: str | None) -> dict[str, Any] | None:
    """The binding of an active stored state of the session's current generation."""
    if not session_id or member(stored, "state") != "active":
        return None
    owner = (as_text(stored.get("sessionId")) or "").strip()
    return as_dict(stored.get("binding")) if owner in ("", session_id) else None


def thread_of(ref: Ref) -> str:
    """The thread the gateway probes: the tick's :data:`PROBE_KEY`, else the ref's own."""
    probe = ref.get(PROBE_KEY)
    if isinstance(probe, str) and probe:
        return probe
    thread = ref.get("threadId")
    return thread if isinstance(thread, str) else ""


def hint(ref: Ref) -> str | None:
    hint = ref.get(HINT_KEY)
    return as_text(hint) or None


def busy(stored: Any, now_ms: int) -> str | None:
    """The gateway holds the binding's lease while it changes the session's thread (it makes
    its branch, compacts, sets a goal), renewed while it lasts; its own monitor checks only
    idle sessions. So the link waits meanwhile, as for any run in progress. (The prompt of
    a run is written after the lease is released: its provenance line tells it.)"""
    lease = member(stored, "lease")
    expires = member(lease, "expiresAt")
    if isinstance(expires, (int, float)) and not isinstance(expires, bool) and expires > now_ms:
        return "run active: the gateway holds its Codex binding's lease"
    return None
