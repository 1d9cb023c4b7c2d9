"""inotify on the event loop, and the two watchers built on it: file watching, and the
change hub's watch of the SQLite database (another process's commit is told, not polled)."""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from monitor import inotify
from monitor.kernel import Kernel, NewEvent
from monitor.kernel.bus import SourcesWatched, StoreMoved
from monitor.kernel.events import ActorType, EventKind
from monitor.serve.root import running
from tests.helpers import make_config, until, user_line

pytestmark = pytest.mark.skipif(not inotify.available(), reason="inotify is Linux's")

MAIN = "agent:main:main"
KEY = "agent:main:watched"


async def test_a_write_in_a_watched_directory_is_told_with_its_path(tmp_path: Path) -> None:
    watch = inotify.Inotify()
    try:
        watch.watch_dir(str(tmp_path))
        waiting = asyncio.ensure_future(watch.changed())
        await asyncio.sleep(0)
        assert not waiting.done()  # nothing written: it sleeps
        (tmp_path / "a.jsonl").write_bytes(b"{}\n")
        assert {str(tmp_path / "a.jsonl")} == await asyncio.wait_for(waiting, 10)
        with (tmp_path / "a.jsonl").open("ab") as f:
            f.write(b"{}\n")
        (tmp_path / "b.jsonl").write_bytes(b"{}\n")
        got = await asyncio.wait_for(watch.changed(), 10)
        assert str(tmp_path / "a.jsonl") in got or str(tmp_path / "b.jsonl") in got
    finally:
        watch.close()


async def test_a_watched_directory_removed_ends_the_watch(tmp_path: Path) -> None:
    where = tmp_path / "d"
    where.mkdir()
    watch = inotify.Inotify()
    try:
        watch.watch_dir(str(where))
        where.rmdir()
        with pytest.raises(inotify.DirectoryGone):
            while True:
                await asyncio.wait_for(watch.changed(), 10)
    finally:
        watch.close()


async def reused_number_is_heard(number: int) -> None:
    """A new socket given the closed descriptor's number is told readable by the loop (a
    registration left behind made the loop's selector refuse it, or drop it: a request
    that hung for its whole timeout)."""
    loop = asyncio.get_running_loop()
    left, right = socket.socketpair()  # the lowest free numbers: likely the closed one's
    own = left.fileno() == number
    try:
        if not own:
            os.dup2(left.fileno(), number)
        readable: asyncio.Future[None] = loop.create_future()
        loop.add_reader(number, lambda: readable.done() or readable.set_result(None))
        try:
            right.send(b"x")
            await asyncio.wait_for(readable, 10)
        finally:
            loop.remove_reader(number)
    finally:
        if not own:
            os.close(number)
        left.close()
        right.close()


async def test_closing_a_watch_that_is_waited_on_ends_the_wait_and_frees_its_number(
    tmp_path: Path,
) -> None:
    watch = inotify.Inotify()
    number = watch.fd
    watch.watch_dir(str(tmp_path))
    waiting = asyncio.ensure_future(watch.changed())
    await asyncio.sleep(0)
    watch.close()
    with pytest.raises(inotify.Closed):
        await asyncio.wait_for(waiting, 10)
    watch.close()  # once
    await reused_number_is_heard(number)


async def test_a_watch_of_directories_cancelled_mid_wait_frees_its_number(tmp_path: Path) -> None:
    """As when ``serve`` stops: the task reading ``watch_dirs`` is cancelled, not told."""
    numbers: list[int] = []
    real = inotify.Inotify

    def kept() -> inotify.Inotify:
        made = real()
        numbers.append(made.fd)
        return made

    async def run() -> None:
        async for _ in inotify.watch_dirs([str(tmp_path)], asyncio.Event(), armed=None):
            pass

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inotify, "Inotify", kept)
        task = asyncio.ensure_future(run())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await asyncio.sleep(0)  # the inner wait's cancellation runs
    await reused_number_is_heard(numbers[0])


def test_a_path_that_is_no_directory_is_refused_by_name(tmp_path: Path) -> None:
    watch = inotify.Inotify()
    try:
        with pytest.raises(OSError, match="missing"):
            watch.watch_dir(str(tmp_path / "missing"))
    finally:
        watch.close()


async def test_watch_dirs_stops_when_told(tmp_path: Path) -> None:
    stop = asyncio.Event()
    seen: list[set[str]] = []

    async def run() -> None:
        async for paths in inotify.watch_dirs([str(tmp_path)], stop):
            seen.append(paths)
            stop.set()

    task = asyncio.ensure_future(run())
    await asyncio.sleep(0.05)
    (tmp_path / "x").write_bytes(b"1")
    await asyncio.wait_for(task, 10)
    assert [{str(tmp_path / "x")}] == seen[:1]


async def test_the_hub_looks_at_the_database_only_when_another_process_wrote_it(
    tmp_path: Path,
) -> None:
    """With nothing written, the hub's task sleeps (it used to look five times a second);
    another process's commit is heard at once."""
    db = tmp_path / "state.db"
    kernel = await Kernel.open(db)
    try:
        assert kernel.store.watches_changes
        hub = kernel.changes
        heard = kernel.bus.listen((StoreMoved,))  # the hub's watch starts
        await asyncio.sleep(0.1)
        looks = hub.looks
        await asyncio.sleep(1.0)  # five polls' worth, before
        assert looks == hub.looks
        subprocess.run(
            [
                sys.executable,
                "-m",
                "monitor",
                "--db",
                str(db),
                "record",
                "--session",
                "agent:main:x",
                "--kind",
                "goal_changed",
                "--actor",
                "human",
            ],
            check=True,
            capture_output=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        )
        assert isinstance(await heard.next(20), StoreMoved)
        assert hub.looks > looks
        heard.close()
    finally:
        await kernel.close()


async def test_this_processes_own_commit_is_heard_too_and_a_read_is_not(tmp_path: Path) -> None:
    """A read only (another process's ``status``) writes nothing: no look. (This process's
    own commit reaches the WAL too, and the hub looks once for it.)"""
    db = tmp_path / "state.db"
    kernel = await Kernel.open(db)
    try:
        await kernel.record(
            NewEvent(
                session_key="agent:main:x", kind=EventKind.GOAL_CHANGED, actor_type=ActorType.HUMAN
            )
        )
        hub = kernel.changes
        heard = kernel.bus.listen((StoreMoved,))  # the hub's watch starts
        await asyncio.sleep(0.2)
        looks = hub.looks
        conn = sqlite3.connect(db)
        conn.execute("SELECT count(*) FROM session_state_events").fetchone()
        conn.close()
        await asyncio.sleep(0.5)
        assert looks == hub.looks
        heard.close()
    finally:
        await kernel.close()


@pytest.mark.parametrize("watcher", ["inotify", "watchfiles"])
async def test_a_prompt_is_recorded_by_the_early_check_of_either_watcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watcher: str
) -> None:
    """``serve`` with ticks an hour apart: only file watching can see the prompt, with
    inotify or, where there is none, watchfiles."""
    if watcher == "watchfiles":
        monkeypatch.setattr(inotify, "available", lambda: False)
    config = make_config(tmp_path)
    async with running(config, tmp_path / "state.db") as sidecar:
        assert sidecar is not None
        path = Path(config.roots.claude) / "s.jsonl"
        path.write_bytes(user_line("first", "u0"))
        async with sidecar.kernel.bus.listen((SourcesWatched,)) as heard:
            await sidecar.monitor.adoption.adopt(
                kind="claude", path=str(path), session_key=KEY, session_id="s"
            )
            await sidecar.kernel.watch(watcher=MAIN, target=KEY)
            while watcher == "inotify":  # until its watch hears the file; watchfiles' says
                change = await heard.next(timeout=30)  # nothing: a write before its watch
                assert isinstance(change, SourcesWatched)  # is caught up once it arms
                if KEY in change.keys:
                    break
        with path.open("ab") as f:
            f.write(user_line("typed", "u1"))

        async def recorded() -> bool:
            return bool(await sidecar.kernel.notices(watcher=MAIN))

        await until("the prompt's notice", recorded, timeout=30)
