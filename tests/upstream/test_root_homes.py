"""With no ``[roots]`` entry, each default root follows its harness's own variables, as the
harness reads them; ``config`` and ``doctor`` say where each root came from, and ``[roots]``
wins over them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from adapters.registry import roots_with_origin
from tests.helpers import REPO

HOMES = {
    "CODEX_HOME": "codex-home",
    "CLAUDE_CONFIG_DIR": "claude-config",
    "PI_CODING_AGENT_DIR": "pi-agent",
    "XDG_DATA_HOME": "xdg-data",
}


def run(tmp_path: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path / "home")}
    return subprocess.run(
        [sys.executable, "-m", "monitor", "--db", str(tmp_path / "state.db"), *argv],
        cwd=REPO,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_config_shows_each_root_and_where_it_came_from(tmp_path: Path) -> None:
    env = {var: str(tmp_path / name) for var, name in HOMES.items()}
    done = run(tmp_path, env, "config")
    assert done.returncode == 0, done.stderr
    shown = orjson.loads(done.stdout)
    assert shown["roots"] == {
        "claude": str(tmp_path / "claude-config" / "projects"),
        "codex": str(tmp_path / "codex-home" / "sessions"),
        "pi": str(tmp_path / "pi-agent" / "sessions"),
        "opencode_db": str(tmp_path / "xdg-data" / "opencode" / "opencode.db"),
    }
    assert shown["rootsFrom"] == {
        "claude": "$CLAUDE_CONFIG_DIR",
        "codex": "$CODEX_HOME",
        "pi": "$PI_CODING_AGENT_DIR",
        "opencode_db": "$XDG_DATA_HOME",
    }
    plain = orjson.loads(run(tmp_path, {}, "config").stdout)
    assert set(plain["rootsFrom"].values()) == {"default"}
    # expanded, as serve and doctor read them
    assert plain["roots"]["codex"] == str(tmp_path / "home" / ".codex" / "sessions")


def test_the_session_dir_wins_over_the_agent_dir_and_roots_win_over_both() -> None:
    env = {"PI_CODING_AGENT_DIR": "/a", "PI_CODING_AGENT_SESSION_DIR": "/s", "CODEX_HOME": ""}
    found = roots_with_origin({"claude": "/mine"}, env)
    assert found["pi"] == ("/s", "$PI_CODING_AGENT_SESSION_DIR")
    assert found["claude"] == ("/mine", "[roots] claude")
    assert found["codex"] == ("~/.codex/sessions", "default")  # set but empty: not set


def test_the_catalog_and_doctor_follow_codex_home(tmp_path: Path) -> None:
    sessions = tmp_path / "codex-home" / "sessions" / "2026" / "03" / "01"
    sessions.mkdir(parents=True)
    sample = (REPO / "sample_transcripts" / "codex_rollout.jsonl").read_bytes()
    (sessions / "rollout-2026-03-01T10-00-00-019c.jsonl").write_bytes(sample)
    env = {"CODEX_HOME": str(tmp_path / "codex-home")}
    done = run(tmp_path, env, "catalog", "--json")
    assert done.returncode == 0, done.stderr
    kinds = [s["kind"] for s in orjson.loads(done.stdout)["sessions"]]
    assert kinds == ["codex"]
    doctor = run(tmp_path, env, "doctor").stdout
    assert f"the codex root {tmp_path / 'codex-home' / 'sessions'} ($CODEX_HOME) exists" in doctor


@pytest.mark.parametrize("var", sorted(HOMES))
def test_each_variable_moves_only_its_own_root(var: str) -> None:
    found = roots_with_origin({}, {var: "/moved"})
    moved = [kind for kind, (_, origin) in found.items() if origin != "default"]
    assert len(moved) == 1
    assert found[moved[0]][0].startswith("/moved")
