"""The paired node (``sessionwatch node``) and the claude-node adapter, over real HTTP."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from adapters.base import NodeAddress as Node
from adapters.base import Probe
from adapters.claude_node import ClaudeNodeAdapter
from monitor.errors import Declined
from monitor.web.node import build_node_app
from tests.helpers import served_address

THREAD = "0b9c-41f2"


def user(text: str, uuid: str) -> bytes:
    return (
        orjson.dumps({"type": "user", "uuid": uuid, "message": {"role": "user", "content": text}})
        + b"\n"
    )


def tool_result(uuid: str) -> bytes:
    return (
        orjson.dumps(
            {
                "type": "user",
                "uuid": uuid,
                "toolUseResult": {"stdout": "SECRET"},
                "message": {
                    "role": "user",
                    "content": [{"type": "tool_result", "content": "SECRET"}],
                },
            }
        )
        + b"\n"
    )


def enqueue(text: str) -> bytes:
    return (
        orjson.dumps({"type": "queue-operation", "operation": "enqueue", "content": text}) + b"\n"
    )


@pytest.fixture
def transcript(tmp_path: Path) -> Path:
    path = tmp_path / "claude" / "proj" / f"{THREAD}.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(user("old", "u0"))
    return path


@pytest.fixture
async def node(tmp_path: Path, transcript: Path) -> AsyncIterator[str]:
    (tmp_path / "node.token").write_text("node-secret\n")
    runner = web.AppRunner(build_node_app({"claude": str(tmp_path / "claude")}, "node-secret"))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    yield f"http://{host}:{port}"
    await runner.cleanup()


def adapter(tmp_path: Path, url: str, pages: int = 4) -> ClaudeNodeAdapter:
    return ClaudeNodeAdapter(
        {"laptop": Node(url=url, token_file=str(tmp_path / "node.token"))}, pages=pages
    )


REF = {"nodeId": "laptop", "threadId": THREAD}


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


async def get(url: str, token: str = "node-secret") -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, headers={"Authorization": f"Bearer {token}"}) as r,
    ):
        return r.status, await r.json()


async def test_node_pages_newest_first_and_hides_tool_output(node: str, transcript: Path) -> None:
    append(transcript, tool_result("t1") + user("latest", "u2") + b'{"type":"user","uuid":"par')
    status, page = await get(f"{node}/v1/threads/{THREAD}/items?limit=2")
    assert 200 == status
    assert ["u2", "t1"] == [i["uuid"] for i in page["items"]]
    assert {"uuid": "t1", "type": "user"} == page["items"][1]
    assert "SECRET" not in orjson.dumps(page).decode()
    status, older = await get(f"{node}/v1/threads/{THREAD}/items?limit=2&before={page['before']}")
    assert (["u0"], None) == ([i["uuid"] for i in older["items"]], older["before"])


@pytest.mark.parametrize(
    ("path", "token", "status"),
    [
        (f"/v1/threads/{THREAD}/items", "wrong", 401),
        ("/v1/threads/nope/items", "node-secret", 404),
        ("/v1/threads/..%2F..%2Fetc/items", "node-secret", 400),
        (f"/v1/threads/{THREAD}/items?limit=500", "node-secret", 400),
    ],
)
async def test_node_refuses_what_it_must(node: str, path: str, token: str, status: int) -> None:
    got, body = await get(node + path, token)
    assert status == got
    assert body["error"]["message"]


async def test_adapter_reports_new_turns_after_the_marker(
    node: str, transcript: Path, tmp_path: Path
) -> None:
    a = adapter(tmp_path, node)
    marker = await a.baseline(REF)
    assert {"uuid": "u0", "tail": 0, "pending": []} == marker
    append(transcript, tool_result("t1") + user("typed on the laptop", "u1") + enqueue("queued"))
    [out] = await a.check([Probe(session_key="k", ref=REF, marker=marker)])
    assert ["u1", None] == [t.native_id for t in out.turns]
    assert out.marker is not None and (out.marker["uuid"], out.marker["tail"]) == ("u1", 1)
    [again] = await a.check([Probe(session_key="k", ref=REF, marker=out.marker)])
    assert [] == again.turns  # the uuid-less enqueue is not counted twice


async def test_a_burst_larger_than_a_page_pages_back(
    node: str, transcript: Path, tmp_path: Path
) -> None:
    a = adapter(tmp_path, node)
    marker = await a.baseline(REF)
    burst = b"".join(
        user(f"prompt {i}", f"b{i}") if i % 10 == 0 else tool_result(f"r{i}") for i in range(130)
    )
    append(transcript, burst)
    [out] = await a.check([Probe(session_key="k", ref=REF, marker=marker)])
    assert [f"b{i}" for i in range(0, 130, 10)] == [t.native_id for t in out.turns]


async def test_a_burst_of_any_size_is_read_whole_over_several_ticks(
    node: str, transcript: Path, tmp_path: Path
) -> None:
    """120 prompts and 120 replies, one page per tick: every prompt once, in order."""
    a = adapter(tmp_path, node, pages=1)
    marker = await a.baseline(REF)
    burst = b"".join(user(f"p{i}", f"b{i}") + tool_result(f"r{i}") for i in range(120))
    append(transcript, burst)
    seen: list[str | None] = []
    for _ in range(6):
        [out] = await a.check([Probe(session_key="k", ref=REF, marker=marker)])
        assert out.marker is not None
        seen += [t.native_id for t in out.turns]
        marker = out.marker
    assert [f"b{i}" for i in range(120)] == seen


async def test_a_thread_deleted_on_the_node_is_missing(
    node: str, transcript: Path, tmp_path: Path
) -> None:
    a = adapter(tmp_path, node)
    marker = await a.baseline(REF)
    transcript.unlink()
    [out] = await a.check([Probe(session_key="k", ref=REF, marker=marker)])
    assert ("missing", "the node has no such thread") == (out.status, out.reason)


async def test_a_rewritten_thread_is_reread_for_what_is_new(
    node: str, transcript: Path, tmp_path: Path
) -> None:
    """The marker item is gone (the transcript was rewritten): only newer records count."""
    a = adapter(tmp_path, node)
    marker = await a.baseline(REF)
    stamped = {
        "type": "user",
        "uuid": "n1",
        "timestamp": "2999-01-01T00:00:00Z",
        "message": {"role": "user", "content": "after the rewrite"},
    }
    old = {
        "type": "user",
        "uuid": "o1",
        "timestamp": "2000-01-01T00:00:00Z",
        "message": {"role": "user", "content": "history"},
    }
    transcript.write_bytes(orjson.dumps(old) + b"\n" + orjson.dumps(stamped) + b"\n")
    probe = Probe(session_key="k", ref=REF, marker=marker, last_scanned_at=1_700_000_000_000)
    [out] = await a.check([probe])
    assert ["n1"] == [t.native_id for t in out.turns]


def spaced(record: dict[str, Any]) -> bytes:
    """A record as JSON with a space after each colon and comma (``json.dumps``'s default)."""
    import json

    return json.dumps(record).encode() + b"\n"


async def test_a_transcript_in_spaced_json_is_read_by_parsing_records(
    node: str, transcript: Path, tmp_path: Path
) -> None:
    """The node finds the marker item by parsing, not by a byte pattern, so a transcript
    written with spaces after the colons is followed turn by turn."""
    record = {"type": "user", "uuid": "s0", "message": {"role": "user", "content": "spaced"}}
    transcript.write_bytes(spaced(record))
    a = adapter(tmp_path, node)
    marker = await a.baseline(REF)
    assert "s0" == marker["uuid"]
    for i in (1, 2):
        turn = {"type": "user", "uuid": f"s{i}", "message": {"role": "user", "content": f"p{i}"}}
        with transcript.open("ab") as f:
            f.write(spaced(turn))
        [out] = await a.check([Probe(session_key="k", ref=REF, marker=marker)])
        assert ("activity", [f"s{i}"]) == (out.status, [t.native_id for t in out.turns])
        assert out.marker is not None and "lost" not in out.marker
        marker = out.marker


async def test_a_marker_the_node_cannot_find_twice_in_a_row_is_inconclusive(
    node: str, transcript: Path, tmp_path: Path
) -> None:
    """Never a silent quiet: the first loss re-reads (and is remembered), a second loss in a
    row says so; a check that finds its anchor again forgets the loss."""
    a = adapter(tmp_path, node)
    [first] = await a.check([Probe(session_key="k", ref=REF, marker={"uuid": "gone", "tail": 0})])
    assert first.marker is not None and first.marker["lost"] is True
    assert "u0" == first.marker["uuid"]
    lost_again = {**first.marker, "uuid": "gone-too"}
    [second] = await a.check([Probe(session_key="k", ref=REF, marker=lost_again)])
    assert "inconclusive" == second.status
    assert "cannot find the marker item 'gone-too' twice in a row" in (second.reason or "")
    append(transcript, user("found again", "u1"))
    [third] = await a.check([Probe(session_key="k", ref=REF, marker=first.marker)])
    assert third.marker is not None and "lost" not in third.marker


async def test_a_node_that_is_down_is_inconclusive_never_missing(tmp_path: Path) -> None:
    (tmp_path / "node.token").write_text("x")
    a = adapter(tmp_path, "http://127.0.0.1:9")
    [out] = await a.check([Probe(session_key="k", ref=REF, marker={"uuid": "u0"})])
    assert "inconclusive" == out.status
    with pytest.raises(Declined):
        await a.baseline(REF)


async def test_uuid_less_records_at_the_end_start_from_the_newest_uuid(
    node: str, transcript: Path, tmp_path: Path
) -> None:
    """Claude Code ends every turn with uuid-less records (``last-prompt``, queue
    operations): the baseline anchors on the newest item that has one and counts the rest."""
    last = {"type": "last-prompt", "lastPrompt": "old", "leafUuid": "u0", "sessionId": "S"}
    append(transcript, orjson.dumps(last) + b"\n" + enqueue("x"))
    paired = adapter(tmp_path, node)
    marker = await paired.baseline(REF)
    assert ("u0", 2) == (marker["uuid"], marker["tail"])
    append(transcript, user("typed after the adoption", "u1"))
    (found,) = await paired.check([Probe(session_key="k", ref=REF, marker=marker)])
    assert 1 == len(found.turns)


async def test_a_page_of_items_none_with_a_uuid_declines(
    node: str, transcript: Path, tmp_path: Path
) -> None:
    append(transcript, b"".join(enqueue(f"x{i}") for i in range(60)))
    with pytest.raises(Declined, match="has a uuid"):
        await adapter(tmp_path, node).baseline(REF)


def test_two_sidecars_end_to_end(tmp_path: Path, transcript: Path) -> None:
    """A real ``sessionwatch node`` process and a gateway-side sidecar driven by its CLI."""
    (tmp_path / "node.token").write_text("pairing-token\n")
    (tmp_path / "node.token").chmod(0o600)  # a token others can read is refused
    node_cfg = tmp_path / "node.toml"
    node_cfg.write_text(f'[roots]\nclaude = "{tmp_path / "claude"}"\n')
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "monitor",
            "--config",
            str(node_cfg),
            "node",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            str(tmp_path / "node.token"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = served_address(proc)
        gw_cfg = tmp_path / "gateway.toml"
        gw_cfg.write_text(
            f'[nodes.laptop]\nurl = "{url}"\ntoken_file = "{tmp_path / "node.token"}"\n'
        )

        def sw(*args: str) -> Any:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "monitor",
                    "--db",
                    str(tmp_path / "gw.db"),
                    "--config",
                    str(gw_cfg),
                    *args,
                ],
                capture_output=True,
                text=True,
            )
            assert 0 == out.returncode, out.stderr
            return orjson.loads(out.stdout)

        key = "agent:main:adopted:laptop"
        adopted = sw(
            "adopt",
            "--kind",
            "claude-node",
            "--node",
            "laptop",
            "--thread",
            THREAD,
            "--session-key",
            key,
            "--session-id",
            "s1",
        )
        assert adopted["declined"] is None
        sw("watch", "--watcher", "agent:main:main", "--target", key)
        append(transcript, user("typed on the paired laptop", "u9"))
        assert [{"sessionKey": key, "outcome": "activity", "turns": 1, "reason": None}] == sw(
            "tick"
        )["outcomes"]
        assert 1 == len(sw("notices", "--watcher", "agent:main:main")["notices"])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    assert 0 == proc.returncode


async def test_an_unknown_node_says_how_to_make_it_known(tmp_path: Path) -> None:
    from monitor.errors import NotFound

    a = adapter(tmp_path, "http://127.0.0.1:9")
    with pytest.raises(NotFound, match=r"\[nodes.desk\] section added after serve started"):
        a.resolve("desk", THREAD)
    [out] = await a.check(
        [Probe(session_key="k", ref={"nodeId": "desk", "threadId": THREAD}, marker={})]
    )
    assert "add [nodes.desk] to the configuration and reload serve (SIGHUP)" in (out.reason or "")


async def test_a_node_token_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "fifo-token"
    os.mkfifo(fifo)
    a = ClaudeNodeAdapter({"laptop": Node(url="http://127.0.0.1:9", token_file=str(fifo))})
    [out] = await a.check([Probe(session_key="k", ref=REF, marker={"uuid": "u0"})])
    assert "inconclusive" == out.status
    assert "not a regular file (a FIFO)" in (out.reason or "")
