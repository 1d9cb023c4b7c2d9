"""A database's commit is visible a moment after its WAL is written: SQLite writes the frames
(the write inotify reports), then updates the WAL index readers consult. An early check
woken by the WAL write can read before the commit, and then nothing else wakes one: seen as
an OpenCode prompt never recorded by ``bench/node_latency.py``, 1 run in 3. So file
watching marks the keys a WAL write moved as settling, and they are checked again shortly
after the last write."""

from __future__ import annotations

import asyncio
from pathlib import Path

from monitor.config import RootsConfig
from monitor.kernel.bus import SourcesMoved
from monitor.serve.root import running
from monitor.serve.ticks import SETTLE_MS
from tests.helpers import make_config, until
from tests.opencode_db import OpenCodeDB

MAIN = "agent:main:main"
KEY = "agent:main:opencode"
SID = "ses_settle"


async def test_a_wal_write_checks_its_keys_again_after_the_write_settles(tmp_path: Path) -> None:
    oc = OpenCodeDB(tmp_path / "opencode.db")
    oc.session(SID)
    oc.prompt(SID, "the first prompt")
    config = make_config(tmp_path)  # ticks an hour apart: only early checks run here
    config = config._replace(roots=RootsConfig(**config.roots.given, opencode_db=str(oc.path)))
    async with running(config, tmp_path / "state.db") as sidecar:
        assert sidecar is not None
        await sidecar.monitor.adoption.adopt(
            kind="opencode", path=str(oc.path), session_key=KEY, thread=SID
        )
        await sidecar.kernel.watch(watcher=MAIN, target=KEY)
        loop = asyncio.get_running_loop()
        moved: list[float] = []  # when each settling move of the key was heard

        def heard(change: SourcesMoved) -> None:
            if change.settling and KEY in change.keys:
                moved.append(loop.time())

        sidecar.kernel.bus.subscribe(SourcesMoved, heard)
        checked: list[tuple[float, set[str] | None]] = []  # when each check began, of what
        tick = sidecar.monitor.ticker.tick

        async def counted(only: set[str] | None = None) -> list:  # type: ignore[type-arg]
            checked.append((loop.time(), only))
            return await tick(only)

        sidecar.monitor.ticker.tick = counted  # type: ignore[method-assign]

        oc.prompt(SID, "typed before the watch was armed")  # the check after arming finds it
        await until("the first notice", lambda: sidecar.kernel.notices(watcher=MAIN))
        await sidecar.kernel.inbox(watcher=MAIN, drain=True)
        checked.clear()
        oc.prompt(SID, "typed")
        await until("a settling move", lambda: moved)

        def settled() -> bool:
            """A check of the key began once the last write's series ended (its last step
            after the write); checks that fall due while one runs are one check after it,
            so on a loaded machine the steps may share one."""
            after = moved[-1] + SETTLE_MS[-1] / 1000
            return any(at >= after and only and KEY in only for at, only in checked)

        await until("a check after the write settled", settled, timeout=30)
        assert sum(1 for _, only in checked if only and KEY in only) >= 2  # at once, and after
        assert [] != await sidecar.kernel.notices(watcher=MAIN)
