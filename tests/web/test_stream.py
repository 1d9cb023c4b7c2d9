"""Notices pushed: the SSE route and ``notices --follow``, fed by the API, the monitor and
another process writing the same database."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from monitor.web import api
from tests.doc_blocks import doc_block
from tests.helpers import Client, notice
from tests.test_cli import sw
from tests.web.test_api import MAIN

CHILD = "agent:main:subagent:streamed"
PROMPT = b'{"type":"user","uuid":"u1","message":{"role":"user","content":"hello"}}\n'


async def _events(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, Any]]:
    """(``"notice"``, data) per event and (``"comment"``, text) per comment."""
    event = None
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith(":"):
            yield "comment", line[1:].strip()
        elif line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            yield event or "message", orjson.loads(line.removeprefix("data: "))


async def _next_notice(events: AsyncIterator[tuple[str, Any]]) -> Any:
    async def first() -> Any:
        async for kind, data in events:
            if kind == "notice":
                return data
        raise AssertionError("the stream ended")

    return await asyncio.wait_for(first(), 20)


async def _record(client: Client) -> None:
    status, _ = await client.call(
        "POST",
        "/v1/events",
        {"sessionKey": CHILD, "kind": "human_direct_message", "actorType": "human"},
    )
    assert 200 == status


async def test_the_stream_pushes_notices_from_the_api_another_process_and_the_monitor(
    client: Client, tmp_path: Path
) -> None:
    await client.call("POST", "/v1/spawns", {"parent": MAIN, "child": CHILD, "runId": "r"})
    headers = {"Authorization": f"Bearer {client.token}"}
    url = f"{client.base}/v1/watchers/{MAIN}/notices/stream"
    async with client.http.get(url, headers=headers) as response:
        assert (200, "text/event-stream") == (response.status, response.content_type)
        events = _events(response)

        await _record(client)  # through the API
        assert {"target": CHILD, "text": notice(CHILD, 1)} == await _next_notice(events)
        await client.call("POST", f"/v1/watchers/{MAIN}/notices/drain")  # peeked, not drained

        db = client.sidecar.kernel.store.path
        await asyncio.to_thread(  # another process on the same database
            sw, db, "record", "--session", CHILD, "--kind", "goal_changed", "--actor", "agent"
        )
        assert {"target": CHILD, "text": notice(CHILD, 2)} == await _next_notice(events)
        await client.call("POST", f"/v1/watchers/{MAIN}/notices/drain")

        # through the monitor: an adopted Claude session, a typed prompt, a tick
        transcript = tmp_path / "claude" / "p" / "s.jsonl"
        transcript.parent.mkdir(parents=True)
        transcript.write_bytes(b"")
        status, _ = await client.call(
            "POST", "/v1/links", {"kind": "claude", "path": str(transcript), "sessionKey": CHILD}
        )
        assert 200 == status
        with transcript.open("ab") as f:
            f.write(PROMPT)
        await client.sidecar.monitor.ticker.tick()
        pushed = await _next_notice(events)
        _, peeked = await client.call("GET", f"/v1/watchers/{MAIN}/notices")
        assert [pushed] == peeked["notices"]
        assert CHILD == pushed["target"]


async def test_a_notice_a_drain_reopens_is_pushed_at_once(client: Client) -> None:
    """A second turn while the first's notice is pending: the drain acknowledges the first
    and reopens one for the second, in its transaction. The stream is told then, not at
    its next keep-alive 15 s later (a drain commits through no recorded event)."""
    await client.call("POST", "/v1/spawns", {"parent": MAIN, "child": CHILD, "runId": "r"})
    headers = {"Authorization": f"Bearer {client.token}"}
    url = f"{client.base}/v1/watchers/{MAIN}/notices/stream"
    async with client.http.get(url, headers=headers) as response:
        events = _events(response)
        await _record(client)
        first = await _next_notice(events)
        await _record(client)  # while the first is pending: no notice of its own yet
        _, drained = await client.call("POST", f"/v1/watchers/{MAIN}/notices/drain")
        assert [first] == drained["notices"]

        async def reopened() -> Any:
            async for kind, data in events:
                if kind == "notice":
                    return data
            raise AssertionError("the stream ended")

        again = await asyncio.wait_for(reopened(), api.KEEPALIVE_S / 2)
        assert CHILD == again["target"] and again != first


async def test_the_stream_sends_keep_alive_comments(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api, "KEEPALIVE_S", 0.3)
    headers = {"Authorization": f"Bearer {client.token}"}
    url = f"{client.base}/v1/watchers/{MAIN}/notices/stream"
    async with client.http.get(url, headers=headers) as response:

        async def comment() -> str:
            async for kind, text in _events(response):
                if kind == "comment":
                    return str(text)
            raise AssertionError("the stream ended")

        assert "keep-alive" == await asyncio.wait_for(comment(), 20)


async def test_a_bad_watcher_is_a_400_not_a_stream(client: Client) -> None:
    status, answer = await client.call("GET", "/v1/watchers/global/notices/stream")
    assert (400, "bad_request") == (status, answer["error"]["code"])


def readline_within(pipe: Any, seconds: float = 30) -> Any:
    """A line from a child's pipe, or a failure after ``seconds``: a regression fails the
    test instead of hanging it (the caller then ends the child, which ends the read)."""
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as Late

    reader = ThreadPoolExecutor(max_workers=1)
    try:
        return reader.submit(pipe.readline).result(timeout=seconds)
    except Late:
        raise AssertionError(f"no line within {seconds:.0f} s") from None
    finally:
        reader.shutdown(wait=False)


@contextlib.contextmanager
def following_a_record(db: Path | str) -> Iterator[subprocess.Popen[bytes]]:
    """``notices --follow`` in one process, once it printed, as a JSON line, the notice a
    ``record`` in another process opened (on either store); ended on the way out."""
    sw(db, "spawn", "--parent", MAIN, "--child", CHILD, "--run-id", "r")
    command = ["notices", "--watcher", MAIN, "--follow"]
    follow = subprocess.Popen(
        [sys.executable, "-m", "monitor", "--db", str(db), *command], stdout=subprocess.PIPE
    )
    try:
        sw(db, "record", "--session", CHILD, "--kind", "human_direct_message", "--actor", "human")
        assert follow.stdout is not None
        line = readline_within(follow.stdout)
        assert {"target": CHILD, "text": notice(CHILD, 1)} == orjson.loads(line)
        yield follow
    finally:
        if follow.poll() is None:
            follow.terminate()
            follow.wait(timeout=30)


def follow_hears_a_record(db: Path | str) -> None:
    with following_a_record(db):
        pass


def test_notices_follow_prints_each_notice_as_a_json_line(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    follow_hears_a_record(db)
    sw(db, "notices", "--watcher", MAIN, "--follow", "--drain", code=2)


def _switches(pid: int) -> int:
    """Context switches of every thread of ``pid`` so far (its wakeups)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if "ctxt_switches:" in line:
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="no /proc here")
def test_notices_follow_is_told_and_ends_with_its_reader(tmp_path: Path) -> None:
    """Idle, ``--follow`` sleeps until the database is written (it looked every 0.2 s
    before: five wakeups a second); it ends once the reader of its pipe went away, as
    ``--follow | head -n 1`` does."""
    with following_a_record(tmp_path / "state.db") as follow:
        assert follow.stdout is not None
        before = _switches(follow.pid)
        time.sleep(2)  # idle: nothing is written
        assert _switches(follow.pid) - before < 4
        follow.stdout.close()  # the reader goes away, as head does after its line
        assert follow.wait(timeout=30) == 0


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_the_documented_stream_example_delivers_a_notice(client: Client) -> None:
    block = doc_block("stream")
    db = client.sidecar.kernel.store.path
    sw(db, "spawn", "--parent", MAIN, "--child", CHILD, "--run-id", "r")
    sw(db, "record", "--session", CHILD, "--kind", "goal_changed", "--actor", "agent")
    env = {**os.environ, "SW": client.base, "TOKEN": client.token}
    curl = subprocess.Popen(["bash", "-c", block], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert curl.stdout is not None
        first = await asyncio.to_thread(readline_within, curl.stdout)
        assert "event: notice\n" == first
        data = await asyncio.to_thread(readline_within, curl.stdout)
        expected = {"target": CHILD, "text": notice(CHILD, 1)}
        assert expected == orjson.loads(data.removeprefix("data: "))
    finally:
        curl.kill()
        curl.wait(timeout=30)
