"""A release's code beside this tree's, for the benches that measure against it in the same
run: :func:`source_of` extracts its ``monitor`` and ``adapters`` (enough to run ``serve``
from them with ``PYTHONPATH``); :func:`worktree` checks the whole tree out (its benches and
test helpers too), and removes it afterwards."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def source_of(commit: str, into: Path) -> Path:
    """The release's ``monitor`` and ``adapters`` as they were at ``commit``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "monitor", "adapters"],
        capture_output=True,
        check=True,
    ).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """The whole tree at ``ref``, as a detached git worktree, while the block runs."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), ref],
            check=True,
        )
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False
            )
