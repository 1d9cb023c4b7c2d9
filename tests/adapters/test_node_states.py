"""What a paired node's sessions are doing: the node serves records (only those that say it,
reduced to what says it), the sidecar derives the state, and it is what a local check of
the same records derives. Each real harness's capture (tests/fixtures/states), served by a
real node app over HTTP on loopback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from adapters import registry
from adapters.base import NodeAddress, Outcome, Probe, Settings
from adapters.jsonl_check import TailSettings, check_file
from adapters.jsonl_format import format_of
from monitor.web.node import build_node_app
from tests.helpers import REPO
from tests.opencode_db import OpenCodeDB

STATES = REPO / "tests" / "fixtures" / "states"
TOKEN = "node-secret"
CAPTURES = {"claude": "claude-2.1.332", "codex": "codex-0.171.0", "pi": "pi-1.6.0"}
CALLS = {"claude": b'"name":"Read"', "codex": b'"name":"exec_command"', "pi": b'"name":"read"'}


def capture(kind: str) -> tuple[list[bytes], dict[str, int]]:
    name = CAPTURES[kind]
    ends = json.loads((STATES / f"{name}.json").read_text())["ends"]
    return (STATES / f"{name}.jsonl").read_bytes().splitlines(keepends=True), ends


def placed(kind: str, root: Path, first: bytes) -> tuple[Path, str]:
    """The session's file under the node's root, as its harness names it, and its thread."""
    record = orjson.loads(first)
    if kind == "claude":
        thread = str(record.get("sessionId"))
        path = root / "proj" / f"{thread}.jsonl"
    elif kind == "codex":
        thread = str(record["payload"]["id"])
        path = root / "2026" / "12" / "06" / f"rollout-2026-12-06T10-00-00-{thread}.jsonl"
    else:
        thread = str(record["id"])
        path = root / "--w--" / f"2026-12-06T10-00-00_{thread}.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(first)
    return path, thread


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[str]:
    (tmp_path / "node.token").write_text(TOKEN + "\n")
    roots = {kind: str(tmp_path / kind) for kind in CAPTURES}
    runner = web.AppRunner(build_node_app(roots, TOKEN))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    yield f"http://{host}:{port}"
    await runner.cleanup()


@pytest.mark.parametrize("kind", sorted(CAPTURES))
async def test_a_nodes_session_reads_as_the_same_records_read_here(
    kind: str, node: str, tmp_path: Path
) -> None:
    lines, ends = capture(kind)
    path, thread = placed(kind, tmp_path / kind, lines[0])
    address = NodeAddress(url=node, token_file=str(tmp_path / "node.token"))
    adapter = registry.entry(f"{kind}-node").build(Settings(nodes={"laptop": address}))
    ref = {"nodeId": "laptop", "threadId": thread}
    marker = await adapter.baseline(ref)
    local = {"offset": len(lines[0])}
    written = 1
    tool = range(ends["ends"], ends["tool"])
    mid_tool = next(i for i in tool if CALLS[kind] in lines[i])  # the model's tool call
    for end in (ends["ends"], mid_tool + 1, ends["tool"], ends["interrupted"]):
        with path.open("ab") as f:
            f.write(b"".join(lines[written:end]))
        written = end
        (remote,) = await adapter.check([Probe(session_key="agent:main:x", ref=ref, marker=marker)])
        here = check_file(
            format_of(kind),
            Probe(session_key="agent:main:x", ref={"filePath": str(path)}, marker=local),
            TailSettings(root=str(tmp_path / kind)),
            {},
        )
        assert remote.boundary is not None and here.boundary is not None
        assert _doing(remote) == _doing(here), end
        assert ("working" if end == mid_tool + 1 else "waiting") == remote.boundary.state
        marker, local = remote.marker or marker, here.marker or local


def _doing(outcome: Outcome) -> Any:
    boundary = outcome.boundary
    assert boundary is not None
    return boundary.state, boundary.at


async def test_what_a_node_sends_for_it_holds_no_text(node: str, tmp_path: Path) -> None:
    """Pi's entries, the assistant's answer and a tool's output among them: what the node
    sends to say what the session is doing is types, roles, stop reasons and times."""
    lines, ends = capture("pi")
    path, thread = placed("pi", tmp_path / "pi", lines[0])
    address = NodeAddress(url=node, token_file=str(tmp_path / "node.token"))
    adapter = registry.entry("pi-node").build(Settings(nodes={"laptop": address}))
    ref = {"nodeId": "laptop", "threadId": thread}
    marker = await adapter.baseline(ref)
    answer = {"role": "assistant", "content": [{"type": "text", "text": "SECRET-ANSWER"}],
              "stopReason": "stop"}  # fmt: skip
    entry = {"type": "message", "id": "zz", "timestamp": "2026-12-06T10:00:09Z", "message": answer}
    with path.open("ab") as f:
        f.write(b"".join(lines[1 : ends["ends"]]) + orjson.dumps(entry) + b"\n")
    async with (
        aiohttp_session() as http,
        http.get(
            f"{node}/v1/sources/pi/{thread}/lines",
            params={"offset": str(marker["offset"]), "file": marker["file"]},
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as resp,
    ):
        sent = (await resp.json())["boundary"]
    assert sent and b"SECRET" not in orjson.dumps(sent)
    (outcome,) = await adapter.check([Probe(session_key="agent:main:x", ref=ref, marker=marker)])
    assert outcome.boundary is not None and "waiting" == outcome.boundary.state


def aiohttp_session() -> Any:
    import aiohttp

    return aiohttp.ClientSession()


async def test_an_opencode_session_on_a_node_reads_as_its_rows_read_here(tmp_path: Path) -> None:
    """OpenCode 1.18.33's rows in a database on the node: the node sends each message's
    role, times, finish and error's name (never its content); the state derived here is
    what the same rows give a local check."""
    rows = [orjson.loads(x) for x in (STATES / "opencode-1.18.33.jsonl").read_bytes().splitlines()]
    ends = json.loads((STATES / "opencode-1.18.33.json").read_text())["ends"]
    db = OpenCodeDB(tmp_path / "opencode.db")
    db.session("ses_1")
    (tmp_path / "node.token").write_text(TOKEN + "\n")
    runner = web.AppRunner(build_node_app({"opencode": str(db.path)}, TOKEN))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        address = NodeAddress(url=f"http://{host}:{port}", token_file=str(tmp_path / "node.token"))
        settings = Settings(roots={"opencode": str(db.path)}, nodes={"laptop": address})
        remote = registry.entry("opencode-node").build(settings)
        local = registry.entry("opencode").build(settings)
        ref = {"nodeId": "laptop", "threadId": "ses_1"}
        marker = await remote.baseline(ref)
        local_ref = {"dbPath": str(db.path), "threadId": "ses_1"}
        local_marker = await local.baseline(local_ref)
        written = 0
        for end in ends.values():
            for row in rows[written:end]:
                db.row("ses_1", row["table"], row["id"], row["data"])
            written = end
            (there,) = await remote.check([Probe(session_key="k", ref=ref, marker=marker)])
            (here,) = await local.check(
                [Probe(session_key="k", ref=local_ref, marker=local_marker)]
            )
            assert there.boundary is not None and there.boundary == here.boundary
            assert "waiting" == there.boundary.state
            marker, local_marker = there.marker or marker, here.marker or local_marker
    finally:
        await runner.cleanup()
