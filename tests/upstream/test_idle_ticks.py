"""A scheduled tick with nothing to read is left out: nothing moved since the last full
tick (no write to a source, no link, watch or configuration changed, no other process's
commit), every link was then quiet, and inotify hears every one of them. One scheduled tick
in ``FULL_EVERY`` is full whatever was heard, and anything heard makes the next one full."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from monitor.config import MonitorConfig
from monitor.kernel.bus import TickRan
from monitor.serve.root import running
from monitor.serve.ticks import FULL_EVERY
from tests.helpers import make_config, until, user_line

MAIN = "agent:main:main"


async def test_ticks_with_nothing_to_read_are_left_out_until_something_moves(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path)
    config = config._replace(
        monitor=MonitorConfig(initial_delay_s=0, interval_s=0.1, watch_files=True)
    )
    root = Path(config.roots.claude)
    async with running(config, tmp_path / "state.db") as sidecar:
        assert sidecar is not None
        paths = []
        for i in range(3):
            path = root / f"s{i}.jsonl"
            path.write_bytes(user_line("before", f"b{i}"))
            key = f"agent:main:idle{i}"
            await sidecar.monitor.adoption.adopt(kind="claude", path=str(path), session_key=key)
            await sidecar.kernel.watch(watcher=MAIN, target=key)
            paths.append(path)
        ticks: list[str] = []  # "full", "early" (a check of some keys) or "left", in order
        full, early = [0], [0]  # full ticks and early checks begun
        begun: list[int] = []  # for each early check, how many ticks were told as it began
        tick = sidecar.monitor.ticker.tick

        async def counted(only: set[str] | None = None) -> Any:
            full[0] += only is None
            early[0] += only is not None
            if only is not None:
                begun.append(len(ticks))
            return await tick(only)

        sidecar.monitor.ticker.tick = counted  # type: ignore[method-assign]

        since = [0, 0]  # full ticks and early checks begun, as of the last end told

        def ended(_: TickRan) -> None:
            """Each tick's end, told as it is published (a listener's task could tell a
            tick left out before the prompt after it): full when one began since, early
            when an early check did (a prompt's), else left out."""
            if full[0] > since[0]:
                ticks.append("full")
            else:
                ticks.append("early" if early[0] > since[1] else "left")
            since[:] = [full[0], early[0]]

        following = sidecar.kernel.bus.subscribe(TickRan, ended)

        def run_of(n: int) -> bool:
            """The last ``n`` ticks were left out."""
            return len(ticks) >= n and ticks[-n:] == ["left"] * n

        await until("ticks left out", lambda: run_of(FULL_EVERY - 1), timeout=60)
        await until("a full tick after them", lambda: ticks[-1] == "full", timeout=60)
        start = len(ticks)
        await until("the next run", lambda: len(ticks) >= start + FULL_EVERY, timeout=60)
        assert ticks[start : start + FULL_EVERY] == ["left"] * (FULL_EVERY - 1) + ["full"]

        # a prompt is heard at once (its early check), and the next scheduled tick is full
        await until("a tick left out", lambda: ticks[-1] == "left", timeout=60)
        checks = len(begun)
        with paths[1].open("ab") as f:
            f.write(user_line("typed", "p1"))
        await until("the notice", lambda: sidecar.kernel.notices(watcher=MAIN))
        # from the prompt's early check on: what moved is heard before it begins, so no
        # scheduled tick after it is left out before a full one (which may end before the
        # notice is seen here)
        heard = begun[checks]

        def scheduled() -> list[str]:
            return [t for t in ticks[heard:] if t != "early"]

        await until("the next scheduled tick", lambda: scheduled(), timeout=60)
        assert "full" == scheduled()[0]
        following.unsubscribe()
