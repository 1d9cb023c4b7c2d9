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


def test_the_readme_walkthrough_runs_as_written() -> None:
    text = README.read_text()
    block = re.search(r"<!-- walkthrough -->\n```sh\n(.*?)```\n<!-- /walkthrough -->", text, re.S)
    assert block is not None
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", "-e", "-c", block.group(1)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    log = Path("/tmp/sw-demo/serve.log")
    served = log.read_text() if log.exists() else "(no serve.log)"
    assert 0 == proc.returncode, proc.stderr + proc.stdout + "\nserve.log:\n" + served
    lines = proc.stdout.splitlines()
    assert any("Fix the failing billing tests" in line for line in lines)  # the table
    objects = [orjson.loads(line) for line in lines if line.startswith("{")]
    adopted, watched, pushed, status = objects
    assert "agent:main:demo" == adopted["link"]["sessionKey"]
    assert {"watched": True} == watched
    assert "agent:main:demo" == pushed["target"]
    events = status["stateChanges"]["events"]
    assert ["human_direct_message"] == [e["kind"] for e in events]
