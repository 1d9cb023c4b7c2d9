"""The README's one-minute walkthrough, run exactly as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson

from tests.helpers import REPO

README = REPO / "README.md"


def test_the_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    """In a temporary directory of its own (``TMPDIR``, which ``mktemp`` takes): two runs on
    one machine never meet, and nothing outside it is written."""
    text = README.read_text()
    block = re.search(r"<!-- walkthrough -->\n```sh\n(.*?)```\n<!-- /walkthrough -->", text, re.S)
    assert block is not None
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "TMPDIR": str(tmp_path),
    }
    env.pop("SESSIONWATCH_DB", None)
    env.pop("SESSIONWATCH_CONFIG", None)
    proc = subprocess.run(
        ["bash", "-e", "-c", block.group(1) + '\necho "db=${SESSIONWATCH_DB:-}"'],
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
