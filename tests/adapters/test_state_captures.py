"""The captures of what each real harness writes at a turn's boundaries
(tests/fixtures/states, made by ``python -m tests.harnesses.capture_states``) read as their
formats say: replayed through ``sessionwatch replay``, each session holds its three typed
prompts (a turn that ends, one that calls a tool, one interrupted), one a scene, and no
drift. OpenCode's capture is its database's rows, which replay does not read from a file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

STATES = REPO / "tests" / "fixtures" / "states"
CAPTURES = sorted(
    p for p in STATES.glob("*.json") if json.loads(p.read_text())["kind"] != "opencode"
)


def test_every_harness_was_captured_with_its_version() -> None:
    about = [json.loads(p.read_text()) for p in sorted(STATES.glob("*.json"))]
    assert {"claude", "codex", "opencode", "pi"} == {a["kind"] for a in about}
    for a in about:
        assert list(a["ends"]) == ["ends", "tool", "interrupted"]
        lines = (STATES / f"{a['kind']}-{a['version']}.jsonl").read_bytes().splitlines()
        ends = list(a["ends"].values())
        assert ends == sorted(ends) and len(lines) >= ends[-1]  # then what closing wrote
        assert all(json.loads(line) for line in lines)


@pytest.mark.parametrize("about", CAPTURES, ids=lambda p: p.stem)
def test_a_capture_replays_to_its_three_prompts_and_no_drift(about: Path) -> None:
    kind = json.loads(about.read_text())["kind"]
    proc = subprocess.run(
        [sys.executable, "-m", "monitor", "replay", "--adapter", kind,
         str(about.with_suffix(".jsonl"))],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert 3 == summary["humanTurns"], summary
    drift = summary["drift"]
    assert ({}, 0, 0) == (
        drift["unknownTypes"], drift["unclassifiedUserRecords"], drift["invalidLines"]
    ), drift  # fmt: skip
