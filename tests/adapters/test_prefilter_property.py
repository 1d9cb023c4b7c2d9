"""The byte pre-filters classify exactly as a full parse does.

A format's pre-filter skips, unparsed, lines whose bytes show they can never be a person's
turn (an assistant record, a tool result, request bookkeeping, model traffic of a known
subtype). The property: over any sequence of records of the format's real shapes (for
Claude, in the key order of older releases and of 2.1.x, which writes an assistant's or an
attachment's type after its payload), whose texts hold every key and marker the pre-filters
look for (inside strings, so escaped), in unicode, with backslashes, in compact and in
spaced or ASCII-escaped JSON or with letters of its values escaped (``"\\u0065nqueue"``),
padded so that the markers fall on either side of the head windows the pre-filters read,
the pre-filtered reading finds the same turns, compactions and drift, leaves the same
classifier state, and stops where a strict format stops (Pi: at a line that is not JSON,
torn, or torn with a record written after it), as one that parses every line. It holds
whole (:func:`select` over the file) and read a scan cap at a time through the monitor's
own check, the cap splitting lines anywhere.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters import claude, codex, pi
from adapters.base import Probe
from adapters.jsonl_check import TailSettings, check_file
from adapters.jsonl_format import JsonlFormat
from tests.adapters.full_parse import both_ways, every_line

TOKENS = [
    '"type":"assistant"',
    '"type":"progress"',
    '"type":"file-history-snapshot"',
    '"type":"tool_result"',
    '"toolUseResult":',
    '"type":"user"',
    '{"type":"api-request-blob"',
    '"operation":"enqueue"',
    ',"operation":"dequeue"',
    '"type":"attachment"',
    '"attachment":{"type":"date"',
    '"message":{"id":"m","type":"message","role":"assistant"',
    '"role":"assistant"',
    '"role":"toolResult"',
    '{"type":"message",',
    '"message":{"role":"assistant"',
    '"type":"response_item"',
    '"type":"event_msg"',
    '"payload":{"type":"reasoning"',
    '"payload":{"type":"agent_message"',
    '"payload":{"type":"item_completed"',
    '"type":"turn_context"',
    '"type":"token_usage_record"',
    '"payload":{"type":"token_count"',
    '"item":{"type":"AgentMessage"',
    '"item":{"type":"UserMessage"',
    '"role":"user"',
    '"status":"completed"',
    "UserMessage",
    "user_message",
    '"user',
    "<environment_context>",
    "<user_shell_command>",
    "é ü 漢字 🙂",
    "\u2028",
    "\\",
    '\\"',
    '"',
]

texts = st.lists(
    st.one_of(st.sampled_from(TOKENS), st.text(max_size=12)), min_size=1, max_size=5
).map("".join)


def claude_records(text: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.sampled_from(
        [
            {"type": "user", "message": {"role": "user", "content": text}},
            {
                "type": "user",
                "message": {"role": "user", "content": [{"type": "text", "text": text}]},
            },
            {
                "type": "assistant",
                "message": {"role": "assistant", "content": [{"type": "text", "text": text}]},
            },
            {
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": text}],
                },
                "toolUseResult": {"stdout": text},
            },
            {"type": "progress", "data": {"message": text}},
            {"type": "system", "subtype": "compact_boundary", "content": text},
            {"type": "queue-operation", "operation": "enqueue", "content": text},
            {"type": "queue-operation", "operation": "dequeue", "content": text},
            {"type": "queue-operation", "operation": text[:10], "content": "typed"},
            {"type": "queue-operation", "content": text, "operation": "enqueue"},
            {"type": text[:20] or "odd", "message": {"content": text}},
            # 2.1.x: the record's type after its payload, or first
            {
                "parentUuid": "p",
                "message": {
                    "id": "m",
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "text", "text": text}],
                },
                "type": "assistant",
                "uuid": "a",
            },
            {
                "parentUuid": "p",
                "message": {"id": "m", "type": "message", "role": "assistant", "content": text},
                "type": text[:20] or "odd",
            },
            {
                "parentUuid": "p",
                "message": {"role": "assistant", "content": [{"type": "text", "text": text}]},
                "type": "assistant",
            },
            {"parentUuid": "p", "message": {"role": "user", "content": text}, "type": "user"},
            {
                "parentUuid": "p",
                "message": {"role": "user", "content": [{"type": "text", "text": text}]},
                "type": "assistant",
            },
            {
                "parentUuid": "p",
                "promptId": "q",
                "type": "user",
                "message": {"role": "user", "content": text},
                "uuid": "u",
            },
            {
                "parentUuid": "p",
                "attachment": {"type": "date", "date": text},
                "type": "attachment",
                "uuid": "t",
            },
            {
                "parentUuid": "p",
                "attachment": {"type": "queued_command", "prompt": text, "commandMode": "prompt"},
                "type": "attachment",
            },
            {"parentUuid": "p", "attachment": {"type": text[:20] or "odd"}, "type": "attachment"},
            # 2.1.332 writes an attachment's text again after its type, often KiBs of it
            {
                "parentUuid": "p",
                "attachment": {"type": "date", "date": text},
                "type": "attachment",
                "rendered": [{"content": text + "r" * 2100}],
            },
            {
                "parentUuid": "p",
                "attachment": {"type": "queued_command", "prompt": text, "commandMode": "prompt"},
                "type": "attachment",
                "rendered": [{"content": "r" * 2100 + text}],
            },
            {
                "parentUuid": "p",
                "attachment": {"type": "date", "date": text},
                "type": text[:20] or "odd",
                "rendered": [{"content": "r" * 2100 + text}],
            },
            {"parentUuid": "p", "attachment": {"type": "date", "date": text}, "type": "oddity"},
            {"type": "api-request-blob", "message": {"role": "user", "content": text}},
            {"type": "cost-state", "content": text},
            {"type": "last-prompt", "lastPrompt": text},
        ]
    )


def completed(item: dict[str, Any], turn: str = "t") -> dict[str, Any]:
    """Codex's ``item_completed`` event as 0.171.0 writes it (a long turn id puts the item
    beyond where the pre-filter looks for its type)."""
    payload = {"type": "item_completed", "thread_id": "th", "turn_id": turn, "item": item}
    return {"type": "event_msg", "payload": payload}


def codex_records(text: str) -> st.SearchStrategy[dict[str, Any]]:
    """Codex's records, bare or as Codex writes them: its time first (and, 0.171.0, its
    ordinal), which the pre-filter reads its type after."""
    return st.tuples(codex_bare(text), st.integers(0, 2)).map(lambda x: enveloped(*x))


def enveloped(record: dict[str, Any], how: int) -> dict[str, Any]:
    if how == 0:
        return record
    at = {"timestamp": "2026-12-02T08:52:59.326Z"}
    return {**at, **({"ordinal": 7} if how == 2 else {}), **record}


def codex_bare(text: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.sampled_from(
        [
            {"type": "event_msg", "payload": {"type": "user_message", "message": text}},
            {"type": "event_msg", "payload": {"type": "agent_message", "message": text}},
            {
                "type": "event_msg",
                "payload": {
                    "type": "item_completed",
                    "turn_id": "t",
                    "item": {"type": "UserMessage", "content": [{"type": "text", "text": text}]},
                },
            },
            {
                "type": "response_item",
                "payload": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": text}],
                },
            },
            {
                "type": "response_item",
                "payload": {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text}],
                },
            },
            *(
                {
                    "type": "response_item",
                    "payload": {
                        "type": "message",
                        "id": "msg_1",
                        "role": role,
                        "content": [{"type": "input_text", "text": text}],
                    },
                }
                for role in ("user", "assistant", "developer", text[:10])
            ),
            *(  # as 0.171.0 writes a message: its status before its id
                {
                    "type": "response_item",
                    "payload": {
                        "type": "message",
                        "status": status,
                        "id": "msg_1",
                        "role": role,
                        "content": [{"type": "output_text", "text": text}],
                    },
                }
                for role in ("user", "assistant", text[:10])
                for status in ("completed", text[:10])
            ),
            {
                "type": "response_item",
                "payload": {
                    "type": "reasoning",
                    "summary": [{"type": "summary_text", "text": text}],
                },
            },
            {"type": "response_item", "payload": {"type": "function_call_output", "output": text}},
            # 0.171.0 completes every item of a turn, a command's whole output among them
            completed(
                {"type": "CommandExecution", "id": "c", "aggregated_output": text + "o" * 2100}
            ),
            completed({"type": "AgentMessage", "content": [{"type": "Text", "text": text}]}),
            completed({"type": text[:20] or "odd", "content": [{"type": "text", "text": text}]}),
            completed({"type": "usermessage", "content": [{"type": "text", "text": text}]}),
            completed(
                {"id": "i", "type": "UserMessage", "content": [{"type": "text", "text": text}]}
            ),
            completed(
                {"type": "UserMessage", "content": [{"type": "text", "text": text}]}, "x" * 600
            ),
            {"type": "event_msg", "payload": {"type": "token_count", "info": text}},
            # the events and contexts that say a turn went on (parsed only while a prompt
            # seen only as a role-user item waits), and 0.171.0's token accounting
            {"type": "event_msg", "payload": {"type": "task_started", "turn_id": text}},
            {"type": "event_msg", "payload": {"type": "task_complete", "last": text}},
            {"type": "turn_context", "payload": {"cwd": text, "model": "m"}},
            {"type": "token_usage_record", "payload": {"turn_id": text, "total": 3}},
            {"type": text[:20] or "odd", "payload": {"type": "token_count", "info": text}},
            {"type": "compacted", "payload": {"message": text}},
            {"type": "event_msg", "payload": {"type": text[:20] or "odd", "message": text}},
        ]
    )


def pi_records(text: str) -> st.SearchStrategy[dict[str, Any]]:
    def entry(role: str, content: Any) -> dict[str, Any]:
        return {
            "type": "message",
            "id": "e1",
            "parentId": None,
            "timestamp": "2026-03-01T10:00:01.000Z",
            "message": {"role": role, "content": content},
        }

    blocks = [{"type": "text", "text": text}]
    return st.sampled_from(
        [
            entry("user", text),
            entry("user", blocks),
            entry("assistant", blocks),
            entry("assistant", [{"type": "toolCall", "id": "c", "arguments": {"a": text}}]),
            entry("toolResult", blocks),
            entry("system", text),
            entry("custom", blocks),
            entry(text[:20] or "odd", text),
            {**entry("bashExecution", None), "message": {"role": "bashExecution", "command": text}},
            {"type": "compaction", "id": "c1", "summary": text},
            {"type": "custom", "id": "x", "data": {"message": {"role": "assistant"}, "t": text}},
            {"type": text[:20] or "odd", "id": "x", "message": {"role": "assistant"}},
            {"type": "message", "id": "e2", "message": {"role": "assistant"}, "extra": text},
        ]
    )


def dumped(record: dict[str, Any], style: int, letters: frozenset[str] = frozenset()) -> bytes:
    """Compact as the harnesses write it, spaced, with every non-ASCII escaped, or with
    ``letters`` escaped (``\\u0065``) in every value but a type."""
    if style == 0:
        return orjson.dumps(record)
    if style == 1:
        return json.dumps(record, ensure_ascii=False).encode()
    if style == 2:
        return json.dumps(record, separators=(",", ":")).encode()
    return escaped(record, letters).encode()


def escaped(value: Any, letters: frozenset[str], key: str = "") -> str:
    """``value`` as compact JSON, ``letters`` escaped in its strings but keys and types."""
    if isinstance(value, dict):
        members = (f"{json.dumps(k)}:{escaped(v, letters, k)}" for k, v in value.items())
        return "{" + ",".join(members) + "}"
    if isinstance(value, list):
        return "[" + ",".join(escaped(v, letters) for v in value) + "]"
    if not isinstance(value, str) or key == "type":
        return json.dumps(value, ensure_ascii=False)
    return (
        '"'
        + "".join(
            f"\\u{ord(c):04x}" if c in letters else json.dumps(c, ensure_ascii=False)[1:-1]
            for c in value
        )
        + '"'
    )


def padded(record: dict[str, Any], pad: int) -> dict[str, Any]:
    """The record with a string of ``pad`` characters before its other keys (for Pi, after
    its type and id), moving its markers across the pre-filters' windows."""
    if pad == 0:
        return record
    if record.get("type") == "message" and "id" in record:
        return {"type": "message", "id": record["id"], "pad": "p" * pad, **record}
    return {"cwd": "p" * pad, **record}


def torn(line: bytes, cut: int, after: bytes | None) -> bytes:
    """A writer that died mid-line: the line cut at ``cut``, maybe with a whole record
    written after it on the same line."""
    return line[: cut % max(1, len(line))] + (after or b"")


def sequences(
    records: Any, first: dict[str, Any] | None, *, broken: bool = False
) -> st.SearchStrategy[list[bytes]]:
    pads = st.sampled_from([0, 0, 1, 900, 1000, 1010, 1020, 1100, 2040, 2100])
    letters = st.frozensets(st.sampled_from("acdeilmnopqrstuy"), min_size=1, max_size=3)
    line = st.tuples(texts.flatmap(records), pads, st.integers(0, 3), letters).map(
        lambda x: dumped(padded(x[0], x[1]), x[2], x[3])
    )
    if broken:  # now and then a line that is not whole
        line = st.one_of(
            line,
            st.tuples(line, st.integers(0, 5000), st.none() | line).map(lambda x: torn(*x)),
            line.map(lambda b: b[: len(b) // 2] + b"\x00" + b[len(b) // 2 :]),
        )
    head = [orjson.dumps(first)] if first else []
    return st.lists(line, min_size=1, max_size=12).map(lambda lines: head + lines)


CODEX_META = {"type": "session_meta", "payload": {"id": "t", "cli_version": "0.171.0"}}


PI_HEADER = {"type": "session", "version": 3, "id": "s", "timestamp": "2026-03-01T10:00:00Z"}


def ticked(fmt: JsonlFormat[Any], path: Path, cap: int) -> Any:
    """The file read through the monitor's check, ``cap`` bytes a tick, to its end or to
    where it blocks."""
    settings = TailSettings(cap=cap, max_line=1 << 20)
    data = path.read_bytes()
    state = fmt.state_from_first(orjson.loads(data[: data.index(b"\n")]))
    marker: dict[str, Any] = {**state.to_marker(), "offset": 0}
    turns: list[tuple[int | None, str | None, str | None]] = []
    compactions: list[str] = []
    held: dict[Any, Any] = {}
    blocked = None
    for _ in range(10_000):
        probe = Probe(session_key="k", ref={"filePath": str(path)}, marker=marker)
        out = check_file(fmt, probe, settings, held)
        turns += [(t.offset, t.native_id, t.text_hash) for t in out.turns]
        compactions += out.compactions
        if out.status == "blocked":
            blocked = out.blocked_offset
            break
        if out.marker is None or out.marker == marker:
            break
        marker = out.marker
    drift = marker.get("drift") or {}
    return turns, compactions, drift.get("invalidLines", 0), blocked


def same_as_a_full_parse(
    fmt: JsonlFormat[Any], lines: list[bytes], cap: int | None = None, tmp: Path | None = None
) -> None:
    full = every_line(fmt)
    data = b"".join(line + b"\n" for line in lines)
    with_prefilter, parsed_all = both_ways(fmt, data)
    assert with_prefilter == parsed_all
    if cap is not None and tmp is not None:
        path = tmp / "session.jsonl"
        path.write_bytes(data)
        assert ticked(fmt, path, cap) == ticked(full, path, cap)


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(sequences(claude_records, None))
def test_claudes_prefilter_classifies_as_a_full_parse(lines: list[bytes]) -> None:
    same_as_a_full_parse(claude.FORMAT, lines)


@SETTINGS
@given(sequences(codex_records, CODEX_META))
def test_codexs_prefilter_classifies_as_a_full_parse(lines: list[bytes]) -> None:
    same_as_a_full_parse(codex.FORMAT, lines)


@SETTINGS
@given(sequences(pi_records, PI_HEADER, broken=True))
def test_pis_prefilter_classifies_and_stops_as_a_full_parse(lines: list[bytes]) -> None:
    same_as_a_full_parse(pi.FORMAT, lines)


FORMATS = {
    "claude": (claude.FORMAT, claude_records, None),
    "codex": (codex.FORMAT, codex_records, CODEX_META),
    "pi": (pi.FORMAT, pi_records, PI_HEADER),
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(sorted(FORMATS)), st.integers(64, 8192))
def test_read_a_scan_cap_at_a_time_as_a_full_parse(
    data: st.DataObject, kind: str, cap: int
) -> None:
    fmt, records, first = FORMATS[kind]
    lines = data.draw(sequences(records, first, broken=kind == "pi"))
    with tempfile.TemporaryDirectory() as tmp:
        same_as_a_full_parse(fmt, lines, cap, Path(tmp))
