"""The byte pre-filters classify exactly as a full parse does.

A format's pre-filter skips, unparsed, lines whose bytes show they can never be a person's
turn (an assistant record, a tool result, model traffic of a known subtype). The property:
over any sequence of records of the format's real shapes, whose texts hold every key and
marker the pre-filters look for (inside strings, so escaped), in unicode, with backslashes,
in compact and in spaced or ASCII-escaped JSON, the pre-filtered scan finds the same turns,
compactions and drift, and leaves the same classifier state, as a scan that parses every
line.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters import claude, codex
from adapters.base import OwnPool
from adapters.jsonl_format import JsonlFormat
from adapters.jsonl_scan import scan

TOKENS = [
    '"type":"assistant"',
    '"type":"progress"',
    '"type":"file-history-snapshot"',
    '"type":"tool_result"',
    '"toolUseResult":',
    '"type":"user"',
    '"type":"response_item"',
    '"type":"event_msg"',
    '"payload":{"type":"reasoning"',
    '"payload":{"type":"agent_message"',
    '"role":"user"',
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
            {"type": text[:20] or "odd", "message": {"content": text}},
        ]
    )


def codex_records(text: str) -> st.SearchStrategy[dict[str, Any]]:
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
            {
                "type": "response_item",
                "payload": {
                    "type": "reasoning",
                    "summary": [{"type": "summary_text", "text": text}],
                },
            },
            {"type": "response_item", "payload": {"type": "function_call_output", "output": text}},
            {"type": "event_msg", "payload": {"type": "token_count", "info": text}},
            {"type": "compacted", "payload": {"message": text}},
            {"type": "event_msg", "payload": {"type": text[:20] or "odd", "message": text}},
        ]
    )


def dumped(record: dict[str, Any], style: int) -> bytes:
    """Compact as the harnesses write it, spaced, or with every non-ASCII escaped."""
    if style == 0:
        return orjson.dumps(record)
    if style == 1:
        return json.dumps(record, ensure_ascii=False).encode()
    return json.dumps(record, separators=(",", ":")).encode()


def sequences(records: Any, first: dict[str, Any] | None) -> st.SearchStrategy[list[bytes]]:
    line = st.tuples(texts.flatmap(records), st.integers(0, 2)).map(lambda x: dumped(*x))
    head = [orjson.dumps(first)] if first else []
    return st.lists(line, min_size=1, max_size=12).map(lambda lines: head + lines)


CODEX_META = {"type": "session_meta", "payload": {"id": "t", "cli_version": "0.171.0"}}


def same_as_a_full_parse(fmt: JsonlFormat[Any], lines: list[bytes]) -> None:
    full = dataclasses.replace(fmt, prefilter=None)
    numbered = []
    offset = 0
    for line in lines:
        numbered.append((offset, line))
        offset += len(line) + 1
    results = []
    for each in (fmt, full):
        state = each.state_from_first(orjson.loads(lines[0]))
        result = scan(each, numbered, state, OwnPool())
        results.append(
            (
                [(t.offset, t.native_id, t.text_hash) for t in result.turns],
                result.compactions,
                result.drift.to_json(),
                state.to_marker(),
            )
        )
    assert results[0] == results[1]


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(sequences(claude_records, None))
def test_claudes_prefilter_classifies_as_a_full_parse(lines: list[bytes]) -> None:
    same_as_a_full_parse(claude.FORMAT, lines)


@SETTINGS
@given(sequences(codex_records, CODEX_META))
def test_codexs_prefilter_classifies_as_a_full_parse(lines: list[bytes]) -> None:
    same_as_a_full_parse(codex.FORMAT, lines)
