"""Every sample transcript replays, through ``sessionwatch replay``, to its expected result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

SAMPLES = REPO / "sample_transcripts"
CASES = sorted(p.name.removesuffix(".expected.json") for p in SAMPLES.glob("*.expected.json"))


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "monitor", "replay", *args],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("case", CASES)
def test_sample_replays_to_its_expected_turns(case: str) -> None:
    expected = json.loads((SAMPLES / f"{case}.expected.json").read_text())
    proc = replay("--adapter", expected["adapter"], str(SAMPLES / f"{case}.jsonl"))
    if "error" in expected:
        assert proc.returncode == 2
        assert expected["error"] in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    turns = [{"offset": t["offset"], "id": t["id"]} for t in lines[:-1]]
    assert expected["turns"] == turns
    summary = lines[-1]
    assert len(expected["turns"]) == summary["humanTurns"]
    assert expected.get("blocked") == summary["blocked"]
    for field in ("compactions", "drift"):
        if field in expected:
            assert expected[field] == summary[field]


def test_own_text_filters_a_self_echo() -> None:
    proc = replay(
        "--adapter",
        "claude",
        str(SAMPLES / "claude_session.jsonl"),
        "--own-text",
        "  thanks,   ship it ",
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert "u20" not in [t.get("id") for t in lines]
    assert lines[-1]["humanTurns"] == 8


def test_a_small_scan_cap_reads_long_lines_across_ticks() -> None:
    """The cap is a per-tick budget: any cap finds the same turns; only max_line blocks."""
    sample = str(SAMPLES / "claude_session.jsonl")
    whole = replay("--adapter", "claude", sample).stdout.splitlines()
    small = replay("--adapter", "claude", sample, "--scan-cap", "200").stdout.splitlines()
    assert whole[:-1] == small[:-1]
    assert json.loads(small[-1])["ticks"] > json.loads(whole[-1])["ticks"]
    capped = replay("--adapter", "claude", sample, "--scan-cap", "64", "--max-line-bytes", "200")
    summary = json.loads(capped.stdout.splitlines()[-1])
    assert summary["blocked"]["offset"] == 168  # the first line over 200 bytes
    assert summary["marker"]["offset"] == 168


def test_replay_of_a_missing_file_is_bad_input(tmp_path: Path) -> None:
    proc = replay("--adapter", "claude", str(tmp_path / "nope.jsonl"))
    assert proc.returncode == 2
    assert "cannot read" in proc.stderr
