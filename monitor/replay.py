"""``sessionwatch replay``: a file read from offset 0, tick by tick, through the same
check as the monitor (tailer, long lines, tolerant parsing, classifier, self-echo), writing
nothing anywhere. The summary says what the monitor would show: turns, compactions, where it
would block, and the format drift it met."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

from adapters.base import Drift, OwnPool, Probe, text_hash
from adapters.jsonl import FORMATS
from adapters.jsonl_check import DEFAULT_MAX_LINE, TailSettings, check_file, first_record
from monitor.errors import BadInput, Declined

MAX_TICKS = 10_000_000
_BOOKKEEPING = ("pending", "head", "ino", "recent", "drift", "echo", "seenAt", "changes")


def replay(
    kind: str,
    path: str,
    *,
    own_texts: list[str],
    scan_cap: int,
    max_line: int = DEFAULT_MAX_LINE,
) -> Iterator[dict[str, Any]]:
    """Yield one ``turn`` object per detected turn, then the ``summary``."""
    fmt = FORMATS.get(kind)
    if fmt is None:
        raise BadInput(f'unknown adapter "{kind}" (known: {", ".join([*FORMATS, "opencode"])})')
    if scan_cap < 1 or max_line < 1:
        raise BadInput("--scan-cap and --max-line-bytes must be positive")
    try:
        fmt.state_from_first(first_record(path, scan_cap))
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    except Declined as exc:
        raise BadInput(str(exc)) from None
    settings = TailSettings(cap=scan_cap, max_line=max_line)
    own = list(enumerate(text_hash(t) for t in own_texts))
    held: dict[Any, bytearray] = {}
    marker: dict[str, Any] = {"offset": 0}
    ticks = turns = compactions = 0
    blocked: dict[str, Any] | None = None
    while ticks < MAX_TICKS:
        ticks += 1
        probe = Probe(session_key="replay", ref={"filePath": path}, marker=marker, own=tuple(own))
        outcome = check_file(fmt, probe, settings, held)
        if outcome.status in ("missing", "inconclusive"):
            raise BadInput(f"cannot read {path}: {outcome.reason}")
        if outcome.status == "blocked":
            blocked = {"offset": outcome.blocked_offset, "reason": _short(outcome.reason)}
            break
        own = [o for o in own if o[0] not in outcome.consumed_own]
        compactions += len(outcome.compactions)
        for turn in outcome.turns:
            turns += 1
            yield {"type": "turn", "offset": turn.offset, "id": turn.native_id}
        if outcome.marker is None or outcome.marker == marker:
            break
        marker = outcome.marker
    yield {
        "type": "summary",
        "humanTurns": turns,
        "compactions": compactions,
        "ticks": ticks,
        "blocked": blocked,
        "drift": Drift.from_json(marker.get("drift")).to_json(),
        "marker": {k: v for k, v in marker.items() if k not in _BOOKKEEPING},
    }


def _short(reason: str | None) -> str:
    """The blocking reason without its offset (the summary gives the offset)."""
    text = reason or "blocked"
    return text.split(" at offset ")[0].split(" starts at ")[0]


def replay_opencode(
    db_path: str, session_id: str, *, own_texts: list[str], lookback: int
) -> list[dict[str, Any]]:
    """The OpenCode replay: every user message of one session through the classifier."""
    from adapters.opencode import (
        CHILD_SESSION,
        classify_user_messages,
        export_user_messages,
        newest_message,
        open_readonly,
        session_signals,
    )  # only this replay reads OpenCode

    own = OwnPool.of_texts(own_texts)
    try:
        conn = open_readonly(db_path)
        try:
            signals = session_signals(conn, [session_id])
            messages = export_user_messages(conn, session_id)
            newest = newest_message(conn, session_id)
        finally:
            conn.close()
    except (OSError, sqlite3.Error) as exc:
        raise BadInput(f"cannot read the OpenCode database {db_path}: {exc}") from None
    if session_id not in signals:
        raise BadInput(f"no OpenCode session {session_id} in {db_path}")
    if signals[session_id][0]:
        raise BadInput(CHILD_SESSION)
    result = classify_user_messages(messages, None, own, lookback, newest)
    out: list[dict[str, Any]] = [
        {"type": "turn", "offset": None, "id": t.native_id} for t in result.turns
    ]
    out.append(
        {
            "type": "summary",
            "humanTurns": len(result.turns),
            "compactions": len(result.compactions),
            "ticks": 1,
            "blocked": None,
            "marker": {"seq": signals[session_id][1], "lastHumanMessageId": result.consumed_to},
        }
    )
    return out
