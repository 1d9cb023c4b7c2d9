"""The harnesses' own file lifecycles, with the real binaries: Codex compresses an adopted
rollout left idle (``[features] local_thread_store_compression``, its worker run by the next
Codex start) and writes it back when the session is resumed; every harness home moved by the
harness's own variable is followed with no ``[roots]`` at all."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.harnesses.harnesses import KINDS, MAIN, Harness, Sidecar, why_not_runnable
from tests.interop import skip_unless_runnable
from tests.interop.gateway_rig import MockModelProcess

WEEK_AND_A_DAY_S = 8 * 86400


def idle_for_a_week(home: Path, rollout: Path) -> None:
    """Set the rollout's time back past Codex's 7 idle days, and its worker's lock too (the
    worker runs at most once in a while, by that lock's time)."""
    then = time.time() - WEEK_AND_A_DAY_S
    for path in (rollout, *home.glob(".tmp/rollout-*.lock")):
        os.utime(path, (then, then))


def test_codex_compresses_an_idle_adopted_rollout_and_resumes_it(
    model: MockModelProcess, tmp_path: Path
) -> None:
    skip_unless_runnable(why_not_runnable("codex"))
    codex = Harness("codex", tmp_path / "codex", model)
    home = codex.work / "codex-home"
    config = home / "config.toml"
    config.write_text(config.read_text() + "local_thread_store_compression = true\n")
    sw = Sidecar(tmp_path, codex)
    codex.prompt("fix the failing billing tests")
    key = "agent:main:harness:codex-idle"
    entry = sw.adopt("codex", key)
    (rollout,) = home.rglob("rollout-*.jsonl")
    thread = entry["nativeId"]
    idle_for_a_week(home, rollout)

    codex.run("exec", "--skip-git-repo-check", "an unrelated task")  # Codex starts, and its
    # compression worker runs
    packed = rollout.with_name(rollout.name + ".zst")
    assert packed.exists() and not rollout.exists(), sorted(p.name for p in home.rglob("*"))

    listed = {s["nativeId"]: s for s in sw("catalog", "--kind", "codex", "--json")["sessions"]}
    assert (listed[thread]["catalogId"], listed[thread]["title"]) == (
        entry["catalogId"],
        entry["title"],
    )
    for _ in range(4):  # past the three misses
        sw("tick")
    (link,) = [x for x in sw("links")["links"] if x["sessionKey"] == key]
    assert (link["missingStreak"], link["status"]["outcome"]) == (0, "quiet"), link
    assert "compressed by the harness" in link["status"]["reason"]
    assert sw.count(key, "upstream_missing") == 0
    summary = [line for line in sw.run("replay", "--adapter", "codex", str(packed)).splitlines()][
        -1
    ]
    assert b'"humanTurns":1' in summary

    codex.run("exec", "--skip-git-repo-check", "resume", thread, "and run them again")
    assert rollout.exists()
    sw.ticked_to(key, 1)
    codex.run("exec", "--skip-git-repo-check", "resume", thread, "now the invoices")
    sw.ticked_to(key, 2)
    assert 1 == len(sw("notices", "--watcher", MAIN)["notices"])


@pytest.mark.parametrize("kind", KINDS)
def test_a_harness_home_moved_by_its_own_variable_is_followed(
    kind: str, model: MockModelProcess, tmp_path: Path
) -> None:
    """The sidecar has no ``[roots]``, and only the harness's variable tells it where."""
    skip_unless_runnable(why_not_runnable(kind))
    harness = Harness(kind, tmp_path / kind, model, moved=True)
    sw = Sidecar(tmp_path, harness, env=harness.home_vars())
    shown = sw("config")
    key_name, root = harness.root()
    assert shown["roots"][key_name] == str(root)
    assert shown["rootsFrom"][key_name] == "$" + next(iter(harness.home_vars()))
    harness.prompt("fix the failing billing tests")
    key = f"agent:main:harness:{kind}-moved"
    sw.adopt(kind, key)
    harness.prompt("and run them again")
    sw.ticked_to(key, 1)


def test_codex_archive_is_followed_and_only_its_delete_is_missing(
    model: MockModelProcess, tmp_path: Path
) -> None:
    """``codex archive`` moves the rollout to ``archived_sessions/``: idle, with the reason;
    ``codex unarchive`` moves it back and the link goes on; ``codex delete`` is a deletion."""
    skip_unless_runnable(why_not_runnable("codex"))
    codex = Harness("codex", tmp_path / "codex", model)
    sw = Sidecar(tmp_path, codex)
    codex.prompt("fix the failing billing tests")
    key = "agent:main:harness:codex-archived"
    thread = sw.adopt("codex", key)["nativeId"]
    codex.run("archive", thread)
    for _ in range(4):
        sw("tick")
    (link,) = sw("links")["links"]
    assert (link["missingStreak"], link["status"]["outcome"]) == (0, "quiet"), link
    assert "archived by Codex" in link["status"]["reason"]
    codex.run("unarchive", thread)
    codex.run("exec", "--skip-git-repo-check", "resume", thread, "and run them again")
    sw.ticked_to(key, 1)
    codex.run("delete", "--force", thread)
    for _ in range(3):
        sw("tick")
    assert sw.count(key, "upstream_missing") == 1
    assert sw("links")["links"] == []
