"""The real harnesses write the test corpus: each session is adopted from the catalog and
ticked through the real monitor while the harness writes it, prompt by prompt, and every
count is exact; then the whole session is replayed, with no drift left.

What is driven here: two prompts and more in one session, and resume or continue (the next
prompt of each harness resumes the session), through each harness's print mode. Queued
prompts, interrupts, compactions, forks and sub-agents are in ``test_scenarios.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harnesses.harnesses import (
    KINDS,
    MAIN,
    Harness,
    Sidecar,
    replay_summary,
    why_not_runnable,
)
from tests.helpers import REPO
from tests.interop import skip_unless_runnable
from tests.interop.gateway_rig import MockModelProcess

PROMPTS = ("fix the failing billing tests", "and run them again", "now the integration suite")


@pytest.mark.parametrize("kind", KINDS)
def test_every_prompt_is_recorded_once_while_the_harness_writes(
    kind: str, model: MockModelProcess, tmp_path: Path
) -> None:
    skip_unless_runnable(why_not_runnable(kind))
    harness = Harness(kind, tmp_path / kind, model)
    sw = Sidecar(tmp_path, harness)
    harness.prompt(PROMPTS[0])
    (entry,) = sw("catalog", "--kind", kind, "--json")["sessions"]
    key = f"agent:main:harness:{kind}"
    adopted = sw("adopt", entry["catalogId"], "--session-key", key)
    assert adopted["link"] is not None, adopted
    assert {"watched": True} == sw("watch", "--watcher", MAIN, "--target", key)
    for n, text in enumerate(PROMPTS[1:], 1):
        harness.prompt(text)
        sw("tick")
        assert n == sw.human_turns(key), f"{kind} {harness.version}: after prompt {n + 1}"
        sw("tick")  # a quiet tick adds nothing
        assert n == sw.human_turns(key)
    pending = sw("notices", "--watcher", MAIN)["notices"]
    assert 1 == len(pending)  # one stale-state notice, however many turns
    summary = replay_summary(sw, harness, entry)
    drift = summary["drift"]
    assert len(PROMPTS) == summary["humanTurns"], summary
    assert ({}, 0, 0) == (
        drift["unknownTypes"],
        drift["unclassifiedUserRecords"],
        drift["invalidLines"],
    ), f"{kind} {harness.version} drifted: {drift}"


def test_a_prompt_typed_into_opencode_is_recorded_early_not_at_the_tick(
    model: MockModelProcess, tmp_path: Path
) -> None:
    """A change to OpenCode's database (its ``-wal``) wakes an early check, as an append to
    a transcript does: ``serve`` here ticks only hourly, and the prompt is recorded within
    seconds of the real OpenCode writing it."""

    from tests.helpers import served_address
    from tests.interop.gateway_rig import wait_for

    skip_unless_runnable(why_not_runnable("opencode"))
    harness = Harness("opencode", tmp_path / "opencode", model)
    sw = Sidecar(tmp_path, harness)
    with sw.config.open("a") as f:
        f.write(
            f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n'
            "[monitor]\ninitial_delay_s = 3600\ninterval_s = 3600\n"
        )
    harness.prompt(PROMPTS[0])
    (entry,) = sw("catalog", "--kind", "opencode", "--json")["sessions"]
    key = "agent:main:harness:opencode-early"
    sw("adopt", entry["catalogId"], "--session-key", key)
    sw("watch", "--watcher", MAIN, "--target", key)
    argv = [sys.executable, "-m", "monitor", "--db", str(sw.db), "--config", str(sw.config)]
    proc = subprocess.Popen([*argv, "serve"], cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        served_address(proc)  # no wait for the watch: a write before it is armed is caught
        harness.prompt(PROMPTS[1])  # by the check serve runs once it is

        wait_for("the early check", lambda: sw.human_turns(key) == 1, 20)
    finally:
        proc.terminate()
        proc.wait(30)


def test_claude_code_compaction_is_recorded_as_compacted_not_as_a_turn(
    model: MockModelProcess, tmp_path: Path
) -> None:
    """``/compact`` typed into the real Claude Code: its boundary is recorded as one
    ``compacted`` event; neither the command row nor the summary it writes is a turn."""
    skip_unless_runnable(why_not_runnable("claude"))
    harness = Harness("claude", tmp_path / "claude", model)
    sw = Sidecar(tmp_path, harness)
    harness.prompt(PROMPTS[0])
    (entry,) = sw("catalog", "--kind", "claude", "--json")["sessions"]
    key = "agent:main:harness:claude-compact"
    sw("adopt", entry["catalogId"], "--session-key", key)
    sw("watch", "--watcher", MAIN, "--target", key)
    harness.prompt(PROMPTS[1])
    harness.prompt("/compact")
    sw("tick")
    events = sw("status", key, "--changes-since", "0")["stateChanges"]["events"]
    kinds = [e["kind"] for e in events]
    assert 1 == kinds.count("human_direct_message"), kinds
    assert 1 == kinds.count("compacted"), kinds
    summary = replay_summary(sw, harness, entry)
    assert (2, 1) == (summary["humanTurns"], summary["compactions"])


def test_claude_code_a_fork_is_its_own_session(model: MockModelProcess, tmp_path: Path) -> None:
    """``--fork-session`` writes a new transcript with the history copied: the adopted
    parent sees nothing of it, and the fork, adopted in turn, counts only what is typed
    into it afterwards."""
    skip_unless_runnable(why_not_runnable("claude"))
    harness = Harness("claude", tmp_path / "claude", model)
    sw = Sidecar(tmp_path, harness)
    harness.prompt(PROMPTS[0])
    (parent,) = sw("catalog", "--kind", "claude", "--json")["sessions"]
    sw("adopt", parent["catalogId"], "--session-key", "agent:main:harness:parent")
    sw("watch", "--watcher", MAIN, "--target", "agent:main:harness:parent")
    fork_id = harness.prompt("a prompt in the fork", "--fork-session")
    assert fork_id != harness.session
    sw("tick")
    assert 0 == sw.human_turns("agent:main:harness:parent")
    sessions = sw("catalog", "--kind", "claude", "--json")["sessions"]
    (fork,) = [s for s in sessions if s["nativeId"] == fork_id]
    sw("adopt", fork["catalogId"], "--session-key", "agent:main:harness:fork")
    sw("watch", "--watcher", MAIN, "--target", "agent:main:harness:fork")
    harness.session = fork_id
    harness.prompt("and another in the fork")
    sw("tick")
    assert (0, 1) == (
        sw.human_turns("agent:main:harness:parent"),
        sw.human_turns("agent:main:harness:fork"),
    )
