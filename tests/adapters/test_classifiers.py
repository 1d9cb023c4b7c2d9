"""The Claude, Codex and Pi classifiers tested directly against sample_transcripts/: in
process, record by record (the pure classifier) and through the adapter's own replay (the
tailer, tolerant parsing and self-echo around it). tests/adapters/test_samples.py runs the
same files through the ``sessionwatch replay`` command."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from adapters.base import Settings
from adapters.jsonl_format import format_of
from adapters.registry import entry
from monitor.errors import Declined
from tests.helpers import REPO

SAMPLES = REPO / "sample_transcripts"
CASES = sorted(p.name.removesuffix(".expected.json") for p in SAMPLES.glob("*.expected.json"))


def expected(case: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((SAMPLES / f"{case}.expected.json").read_text())
    return found


def records(case: str) -> list[tuple[int, dict[str, Any]]]:
    """``(offset, record)`` of every complete line that is a JSON object."""
    out = []
    offset = 0
    for line in (SAMPLES / f"{case}.jsonl").read_bytes().splitlines(keepends=True):
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            value = None
        if isinstance(value, dict) and line.endswith(b"\n"):
            out.append((offset, value))
        offset += len(line)
    return out


@pytest.mark.parametrize("case", CASES)
def test_the_adapter_replays_the_sample_to_its_expected_turns(case: str) -> None:
    want = expected(case)
    adapter = entry(want["adapter"]).build(Settings())
    if "error" in want:
        with pytest.raises(Exception, match=want["error"][:40].split("\n")[0]):
            list(adapter.replay(str(SAMPLES / f"{case}.jsonl"), None, []))
        return
    lines = list(adapter.replay(str(SAMPLES / f"{case}.jsonl"), None, []))
    turns = [{"offset": t["offset"], "id": t["id"]} for t in lines[:-1]]
    assert want["turns"] == turns
    assert want.get("blocked") == lines[-1]["blocked"]


@pytest.mark.parametrize(
    "case", [c for c in CASES if "error" not in expected(c) and not expected(c).get("blocked")]
)
def test_the_pure_classifier_finds_the_same_turns(case: str) -> None:
    """Record by record, with no tailer: every expected turn's record is classified as a
    turn, and no other record is (lines the tolerant parser recovers are left out here)."""
    want = expected(case)
    fmt = format_of(want["adapter"])
    found = records(case)
    try:
        state = fmt.state_from_first(found[0][1] if found else None)
    except Declined:
        pytest.skip("the format declines this file")
    turns = []
    for offset, record in found:
        verdict = fmt.classify(record, state)
        if verdict is not None and verdict.turn:
            turns.append(offset)
    wanted = [t["offset"] for t in want["turns"]]
    parsed = {offset for offset, _ in found}
    assert [o for o in wanted if o in parsed] == turns
