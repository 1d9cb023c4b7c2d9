"""Drift at every level, and none invented: what a format's reader does not know is reported
(an unknown record type or subtype, a record that looks like a person's but no rule
classifies), through the same replay the monitor's check runs; what it knows is not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from adapters.base import Settings
from monitor.upstream.replay import replay


def summary(kind: str, path: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    lines = list(replay(kind, str(path), thread=None, own_texts=[], settings=Settings()))
    found: dict[str, Any] = lines[-1]
    return found


def claude_user(content: Any, uuid: str = "u1") -> dict[str, Any]:
    return {"type": "user", "uuid": uuid, "message": {"role": "user", "content": content}}


def test_claude_a_user_record_of_blocks_nobody_knows_is_unclassified(tmp_path: Path) -> None:
    voice = claude_user([{"type": "voice_clip", "data": "..."}])
    mixed = claude_user([{"type": "text", "text": "hi"}, {"type": "voice_clip"}], "u2")
    found = summary("claude", tmp_path / "s.jsonl", [voice, mixed])
    assert 0 == found["humanTurns"]
    assert 2 == found["drift"]["unclassifiedUserRecords"]


def test_claude_known_blocks_are_no_drift(tmp_path: Path) -> None:
    image = claude_user([{"type": "text", "text": "look"}, {"type": "image", "source": {}}])
    found = summary("claude", tmp_path / "s.jsonl", [image])
    assert (1, 0) == (found["humanTurns"], found["drift"]["unclassifiedUserRecords"])


def test_claude_attachments_unknown_kinds_are_drift_known_ones_are_not(tmp_path: Path) -> None:
    def attachment(kind: str, **extra: Any) -> dict[str, Any]:
        return {"type": "attachment", "uuid": kind, "attachment": {"type": kind, **extra}}

    records = [
        attachment("hook_success"),
        attachment("remote_session_change"),
        attachment("deferred_tools_delta"),
        attachment("hologram_delta"),
        attachment("poll_events", provenance=[{"kind": "principal", "text": "hi"}]),
    ]
    found = summary("claude", tmp_path / "s.jsonl", records)
    assert {"attachment:hologram_delta": 1} == found["drift"]["unknownTypes"]
    assert 1 == found["drift"]["unclassifiedUserRecords"]  # a person's words by polling
    assert 0 == found["humanTurns"]


def test_claude_2_1_332_bookkeeping_records_are_known(tmp_path: Path) -> None:
    records = [
        {"type": kind, "uuid": kind}
        for kind in ("api-request", "api-request-shape", "api-request-blob", "cost-state")
    ]
    records.append({**claude_user("typed"), "version": "2.1.332"})
    found = summary("claude", tmp_path / "s.jsonl", records)
    assert {} == found["drift"]["unknownTypes"]
    assert (1, "2.1.332", False) == (
        found["humanTurns"],
        found["drift"]["version"],
        found["drift"]["newerThanTested"],
    )


def pi_file(path: Path, *records: dict[str, Any]) -> Path:
    header = {"type": "session", "version": 3, "id": "s", "timestamp": "2026-01-01T00:00:00Z"}
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in (header, *records)))
    return path


def pi_message(role: str, content: Any, entry: str = "e1") -> dict[str, Any]:
    return {"type": "message", "id": entry, "message": {"role": role, "content": content}}


def test_pi_the_persisted_system_prompt_is_no_drift(tmp_path: Path) -> None:
    path = pi_file(
        tmp_path / "p.jsonl",
        pi_message("system", "You are a helpful agent", "e0"),
        pi_message("user", "typed", "e1"),
    )
    found = list(replay("pi", str(path), thread=None, own_texts=[], settings=Settings()))[-1]
    assert (1, 0, {}) == (
        found["humanTurns"],
        found["drift"]["unclassifiedUserRecords"],
        found["drift"]["unknownTypes"],
    )


def test_pi_a_user_message_with_an_unknown_block_is_unclassified(tmp_path: Path) -> None:
    path = pi_file(tmp_path / "p.jsonl", pi_message("user", [{"type": "voice_clip"}]))
    found = list(replay("pi", str(path), thread=None, own_texts=[], settings=Settings()))[-1]
    assert (0, 1) == (found["humanTurns"], found["drift"]["unclassifiedUserRecords"])


def test_pi_a_newer_layout_is_not_supported_never_asked_to_migrate(tmp_path: Path) -> None:
    from monitor.errors import BadInput

    for header, declared in (
        ({"type": "session", "version": 4, "id": "s"}, "version 4"),
        ({"kind": "header", "version": 4, "lanes": []}, "version 4"),
        ({"kind": "header", "lanes": []}, "kind-tagged records"),
    ):
        path = tmp_path / "p.jsonl"
        path.write_bytes(orjson.dumps(header) + b"\n")
        with pytest.raises(BadInput) as caught:
            list(replay("pi", str(path), thread=None, own_texts=[], settings=Settings()))
        assert f"newer layout ({declared})" in str(caught.value)
        assert "migrate" not in str(caught.value)


def codex(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "timestamp": "2026-01-01T00:00:01Z", "payload": payload}


def codex_user_item(text: str) -> dict[str, Any]:
    content = [{"type": "input_text", "text": text}]
    return codex("response_item", {"type": "message", "role": "user", "content": content})


CODEX_META = codex("session_meta", {"id": "t", "cli_version": "0.140.0", "cwd": "/p"})


def test_codex_a_prompt_written_only_as_a_user_item_is_reported_not_lost(
    tmp_path: Path,
) -> None:
    """Outside paginated mode the role-user item only duplicates the event; a prompt with no
    event at all is reported as unclassified once its turn goes on, never a silent 0."""
    records = [
        CODEX_META,
        codex_user_item("a prompt with no event"),
        codex("turn_context", {"cwd": "/p"}),
        codex("event_msg", {"type": "task_complete"}),
    ]
    found = summary("codex", tmp_path / "r.jsonl", records)
    assert (0, 1) == (found["humanTurns"], found["drift"]["unclassifiedUserRecords"])


def test_codex_a_prompt_with_its_event_is_one_turn_and_no_drift(tmp_path: Path) -> None:
    for order in ("item first", "event first"):
        pair = [
            codex_user_item("the prompt"),
            codex("event_msg", {"type": "user_message", "message": "the prompt"}),
        ]
        if order == "event first":
            pair.reverse()
        records = [CODEX_META, *pair, codex("turn_context", {"cwd": "/p"})]
        found = summary("codex", tmp_path / "r.jsonl", records)
        assert (1, 0) == (found["humanTurns"], found["drift"]["unclassifiedUserRecords"]), order


def test_codex_subtypes_nobody_declared_are_drift_declared_ones_are_not(tmp_path: Path) -> None:
    """Unknown subtypes of ``event_msg``, ``response_item`` and ``item_completed`` items
    are counted as unknown types, even where the byte pre-filter would skip model traffic;
    the subtypes Codex declares (here some of 0.171.0's) are not."""
    known = [
        codex("event_msg", {"type": "token_count", "info": None}),
        codex("event_msg", {"type": "sub_agent_activity"}),
        codex("response_item", {"type": "reasoning", "summary": []}),
        codex("response_item", {"type": "ghost_snapshot"}),
        codex("event_msg", {"type": "item_completed", "item": {"type": "Plan", "id": "p"}}),
    ]
    unknown = [
        codex("event_msg", {"type": "hologram_delta"}),
        codex("event_msg", {"type": "hologram_delta"}),
        codex("response_item", {"type": "voice_clip", "role": "assistant"}),
        codex("event_msg", {"type": "item_completed", "item": {"type": "Hologram", "id": "h"}}),
    ]
    found = summary("codex", tmp_path / "r.jsonl", [CODEX_META, *known, *unknown])
    assert {
        "event_msg:hologram_delta": 2,
        "response_item:voice_clip": 1,
        "item_completed:Hologram": 1,
    } == found["drift"]["unknownTypes"]
    assert (0, 0) == (found["humanTurns"], found["drift"]["unclassifiedUserRecords"])


def test_codex_a_misspelt_user_message_item_stays_unclassified(tmp_path: Path) -> None:
    item = {"type": "userMessage", "id": "u", "content": [{"type": "text", "text": "hi"}]}
    found = summary(
        "codex",
        tmp_path / "r.jsonl",
        [CODEX_META, codex("event_msg", {"type": "item_completed", "item": item})],
    )
    assert ({}, 1) == (found["drift"]["unknownTypes"], found["drift"]["unclassifiedUserRecords"])
