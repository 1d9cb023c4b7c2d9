"""The crash loop in CI: 30 SIGKILLs of ``serve`` while prompts are typed and wakes go out
(tests/crash_loop.py)."""

from __future__ import annotations

from pathlib import Path

from tests.crash_loop import MOMENTS, run


def test_thirty_sigkills_lose_no_prompt_and_no_wake_and_repeat_none(tmp_path: Path) -> None:
    verdict = run(tmp_path, cycles=30, seed=20261130)
    assert "ok" == verdict["integrity"]
    assert verdict["written"] == verdict["recorded"]
    assert sum(verdict["written"].values()) > 30
    assert set(MOMENTS) == set(verdict["moments"])  # every kind of moment was hit
    assert verdict["opened"] > 0
    assert [] == verdict["never_woken"]
    assert {} == verdict["woken_more_than_twice"]
