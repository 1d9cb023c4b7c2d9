"""The log grows with changes, not with time: a link that stays unreadable, or stays outside
the roots, is said once when its state changes, and once when it is readable again; ticks
that find nothing new write nothing."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from monitor.serve.root import running
from tests.helpers import make_config, user_line

MAIN = "agent:main:main"


def told(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the log said of the links' states: not file watching's own news of a session it
    starts watching (once each, as the adoptions above arrive, whenever they do)."""
    return [r.getMessage() for r in caplog.records if r.name != "monitor.serve.file_watch"]


async def test_a_link_that_stays_unreadable_is_said_once_per_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(tmp_path)
    async with running(config, tmp_path / "state.db") as sidecar:
        assert sidecar is not None
        root = Path(config.roots.claude)
        files = []
        for n in range(4):
            path = root / f"s{n}.jsonl"
            path.write_bytes(user_line("first"))
            await sidecar.monitor.adopt(
                kind="claude", path=str(path), session_key=f"agent:main:x{n}", session_id=f"s{n}"
            )
            await sidecar.kernel.watch(watcher=MAIN, target=f"agent:main:x{n}")
            files.append(path)
        files[0].chmod(0)  # unreadable
        # Each file is swapped in one rename: the chmod wakes the file watcher, and an early
        # check that ran between an unlink and what replaced it would find the file missing
        # (seen in CI: a miss said, then the state after it).
        elsewhere = tmp_path / "elsewhere.jsonl"
        elsewhere.write_bytes(user_line("first"))
        link = tmp_path / "s1-link"
        link.symlink_to(elsewhere)
        os.replace(link, files[1])  # now leads outside the root
        caplog.clear()
        with caplog.at_level(logging.INFO):
            for _ in range(30):
                await sidecar.ticks.run_tick()
            said = told(caplog)
            if os.geteuid() != 0:  # root reads a mode-000 file; the state is said either way
                assert sum("agent:main:x0" in m for m in said) == 1, said
            assert sum("agent:main:x1" in m for m in said) == 1, said
            assert len(said) <= 2, said
            files[0].chmod(0o600)
            fresh = tmp_path / "s1-fresh"
            fresh.write_bytes(user_line("first"))
            os.replace(fresh, files[1])
            caplog.clear()
            for _ in range(5):
                await sidecar.ticks.run_tick()
            again = told(caplog)
        assert sum("readable again" in m for m in again) == len(said), again
        assert len(again) == len(said), again
