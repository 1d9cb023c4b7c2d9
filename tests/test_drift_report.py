"""``python -m tests.harnesses.drift_report`` fails when it checked nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO


def test_a_drift_report_that_checked_nothing_does_not_pass(tmp_path: Path) -> None:
    env = {**os.environ, "SESSIONWATCH_INTEROP_DIR": str(tmp_path / "nothing-installed")}
    done = subprocess.run(
        [sys.executable, "-m", "tests.harnesses.drift_report"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "nothing was checked" in done.stderr
    assert done.stdout.count("skipped:") == 4
