"""A JSONL source read as the monitor reads it (its pre-filter skipping lines unparsed) and
read by parsing every line: what each finds. The pre-filter tests and the real harness
corpus compare the two."""

from __future__ import annotations

from typing import Any

import orjson

from adapters.base import OwnPool
from adapters.jsonl_format import JsonlFormat
from adapters.jsonl_scan import scan, select
from monitor.errors import Declined


def outcome(fmt: JsonlFormat[Any], data: bytes) -> Any:
    """The turns, compactions, drift, where a strict format stops, and the classifier's
    state after reading ``data`` (whole lines) from its start."""
    newline = data.find(b"\n")
    try:
        first = orjson.loads(data[:newline]) if newline > 0 else None
    except orjson.JSONDecodeError:
        first = None
    try:
        state = fmt.state_from_first(first)
    except Declined as exc:  # never read by the monitor
        return "declined", str(exc)
    pick = select(fmt, data, 0, len(data))
    result = scan(fmt, pick.lines, state, OwnPool(), prefiltered=True)
    return (
        [(t.offset, t.native_id, t.text_hash) for t in result.turns],
        result.compactions,
        result.drift.to_json(),
        result.stopped_at,
        state.to_marker(),
    )


def every_line(fmt: JsonlFormat[Any]) -> JsonlFormat[Any]:
    """``fmt`` parsing every line: no pre-filter, no line left unparsed for the state."""
    return fmt._replace(prefilter=None, idle=None)


def both_ways(fmt: JsonlFormat[Any], data: bytes) -> tuple[Any, Any]:
    """:func:`outcome` with the format's pre-filter, and parsing every line."""
    data = data if data.endswith(b"\n") else data + b"\n"
    return outcome(fmt, data), outcome(every_line(fmt), data)
