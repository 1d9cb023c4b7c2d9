"""``sessionwatch replay``: a file read from offset 0, tick by tick, through the same tailer,
classifier and self-echo filter as the monitor, writing nothing anywhere."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

from adapters.base import Declined, text_hash
from adapters.jsonl import FORMATS, first_record, scan
from adapters.opencode import (
    classify_user_messages,
    export_user_messages,
    open_readonly,
    session_signals,
)
from adapters.tailer import read_tail
from monitor.errors import BadInput

MAX_TICKS = 10_000_000


def replay(
    kind: str, path: str, *, own_texts: list[str], scan_cap: int
) -> Iterator[dict[str, Any]]:
    """Yield one ``turn`` object per detected turn, then the ``summary``."""
    fmt = FORMATS.get(kind)
    if fmt is None:
        raise BadInput(f'unknown adapter "{kind}" (known: {", ".join(FORMATS)})')
    if scan_cap < 1:
        raise BadInput("--scan-cap must be positive")
    own = frozenset(text_hash(t) for t in own_texts)
    try:
        state = fmt.state_from_first(first_record(path, scan_cap))
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    except Declined as exc:
        raise BadInput(str(exc)) from None
    offset, ticks, turns = 0, 0, 0
    blocked: dict[str, Any] | None = None
    while ticks < MAX_TICKS:
        ticks += 1
        read = read_tail(path, offset, scan_cap, None)
        if read.status == "blocked":
            blocked = {
                "offset": offset,
                "reason": f"a line longer than the scan cap ({scan_cap} bytes)",
            }
            break
        if read.status != "lines":
            break
        result = scan(fmt, read.lines, state, own)
        for turn in result.turns:
            turns += 1
            yield {"type": "turn", "offset": turn.offset, "id": turn.native_id}
        if result.stopped_at is not None:
            offset = result.stopped_at
            if result.stopped_at == read.lines[0][0]:
                blocked = {"offset": offset, "reason": "invalid row"}
                break
            continue
        offset = read.end
    marker = {"offset": offset, **{k: v for k, v in state.to_marker().items() if k != "pending"}}
    yield {
        "type": "summary",
        "humanTurns": turns,
        "ticks": ticks,
        "blocked": blocked,
        "marker": marker,
    }


def replay_opencode(
    db_path: str, session_id: str, *, own_texts: list[str], lookback: int
) -> list[dict[str, Any]]:
    """The OpenCode replay: every user message of one session through the classifier."""
    own = frozenset(text_hash(t) for t in own_texts)
    try:
        conn = open_readonly(db_path)
        try:
            signals = session_signals(conn, [session_id])
            messages = export_user_messages(conn, session_id)
        finally:
            conn.close()
    except (OSError, sqlite3.Error) as exc:
        raise BadInput(f"cannot read the OpenCode database {db_path}: {exc}") from None
    if session_id not in signals:
        raise BadInput(f"no OpenCode session {session_id} in {db_path}")
    result = classify_user_messages(messages, None, own, lookback)
    out: list[dict[str, Any]] = [
        {"type": "turn", "offset": None, "id": t.native_id} for t in result.turns
    ]
    out.append(
        {
            "type": "summary",
            "humanTurns": len(result.turns),
            "ticks": 1,
            "blocked": None,
            "marker": {"seq": signals[session_id][1], "lastHumanMessageId": result.consumed_to},
        }
    )
    return out
