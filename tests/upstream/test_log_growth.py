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
        files[1].unlink()
        files[1].symlink_to(tmp_path / "elsewhere.jsonl")  # now leads outside the root
        (tmp_path / "elsewhere.jsonl").write_bytes(user_line("first"))
        caplog.clear()
        with caplog.at_level(logging.INFO):
            for _ in range(30):
                await sidecar.ticks.run_tick()
            said = [r.getMessage() for r in caplog.records]
            if os.geteuid() != 0:  # root reads a mode-000 file; the state is said either way
                assert sum("agent:main:x0" in m for m in said) == 1, said
            assert sum("agent:main:x1" in m for m in said) == 1, said
            assert len(said) <= 2, said
            files[0].chmod(0o600)
            files[1].unlink()
            files[1].write_bytes(user_line("first"))
            caplog.clear()
            for _ in range(5):
                await sidecar.ticks.run_tick()
            again = [r.getMessage() for r in caplog.records]
        assert sum("readable again" in m for m in again) == len(said), again
        assert len(again) == len(said), again
