"""The README's one-minute walkthrough, run exactly as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

from tests.doc_blocks import doc_block
from tests.helpers import REPO

README = REPO / "README.md"


def test_the_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    """In a temporary directory of its own (``TMPDIR``, which ``mktemp`` takes): two runs on
    one machine never meet, and nothing outside it is written."""
    block = doc_block("walkthrough")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "TMPDIR": str(tmp_path),
    }
    env.pop("SESSIONWATCH_DB", None)
    env.pop("SESSIONWATCH_CONFIG", None)
    proc = subprocess.run(
        ["bash", "-e", "-c", block + '\necho "db=${SESSIONWATCH_DB:-}"'],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    logs = list(tmp_path.glob("*/serve.log"))
    served = logs[0].read_text() if logs else "(no serve.log)"
    assert 0 == proc.returncode, proc.stderr + proc.stdout + "\nserve.log:\n" + served
    assert proc.stdout.endswith("db=\n")  # its exports ended with it
    lines = proc.stdout.splitlines()
    assert any("Fix the failing billing tests" in line for line in lines)  # the table
    objects = [orjson.loads(line) for line in lines if line.startswith("{")]
    adopted, watched, pushed, status = objects
    assert "agent:main:demo" == adopted["link"]["sessionKey"]
    assert {"watched": True} == watched
    assert "agent:main:demo" == pushed["target"]
    events = status["stateChanges"]["events"]
    assert ["human_direct_message"] == [e["kind"] for e in events]


def test_the_readmes_commands_run_as_written(tmp_path: Path) -> None:
    """The CLI section's block, on a database and configuration of its own (the variables
    every command reads): each command answers, and the last, ``notices --follow``, prints
    the next notice that opens (a second event, recorded by another process)."""
    sessions = tmp_path / "claude" / "billing"
    sessions.mkdir(parents=True)
    prompt = {"role": "user", "content": "Fix the failing billing tests"}
    line = {"type": "user", "uuid": "u1", "cwd": "/w", "message": prompt}
    (sessions / "s1.jsonl").write_bytes(orjson.dumps(line) + b"\n")
    config = tmp_path / "sessionwatch.toml"
    config.write_text(f'[roots]\nclaude = "{tmp_path / "claude"}"\n')
    db = tmp_path / "state.db"
    env = {**os.environ, "SESSIONWATCH_DB": str(db), "SESSIONWATCH_CONFIG": str(config)}
    env["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    proc = subprocess.Popen(
        ["bash", "-e", "-c", doc_block("commands")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        said = [proc.stdout.readline() for _ in range(4)]  # spawn, record, drain, status
        spawned, recorded, drained, status = (orjson.loads(s) for s in said)
        assert "child_spawned" == spawned["kind"]
        assert "human_direct_message" == recorded["kind"]
        assert ["agent:main:subagent:c1"] == [n["target"] for n in drained["notices"]]
        assert [2] == [e["sequence"] for e in status["stateChanges"]["events"]]
        table = [proc.stdout.readline() for _ in range(3)]  # header, the session, the count
        assert "Fix the failing billing tests" in table[1]
        assert "1 session" == table[2].strip()
        record = ["record", "--session", "agent:main:subagent:c1", "--kind", "goal_changed"]
        subprocess.run(
            [sys.executable, "-m", "monitor", *record, "--actor", "agent"],
            env=env, check=True, capture_output=True,
        )  # fmt: skip
        followed = orjson.loads(proc.stdout.readline())
        assert "agent:main:subagent:c1" == followed["target"]
        assert "changesSince 2." in followed["text"]
    finally:
        proc.kill()
        proc.wait(timeout=10)
