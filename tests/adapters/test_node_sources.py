"""Codex, Pi and OpenCode sessions on a paired node (``sessionwatch node``), over real HTTP
and real TLS on loopback: the same guarantees as local sources, and what may cross the wire.
The contract suite (test_adapter_contract.py) runs every node kind too."""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import zstandard
from aiohttp import web

from adapters import registry
from adapters.base import Adapter, NodeAddress, Outcome, Probe, Settings, text_hash
from monitor.config import parse_config
from monitor.errors import ConfigError
from monitor.serve.node_tls import server_context
from monitor.web.node import build_node_app
from tests.opencode_db import OpenCodeDB

TOKEN = "node-secret"
CODEX_ID = "019c0000-0000-7000-8000-000000000001"
NAME = f"rollout-2026-03-01T10-00-00-{CODEX_ID}.jsonl"


def typed(text: str, n: int = 0) -> dict[str, Any]:
    ts = f"2026-03-01T10:{n // 60 % 60:02d}:{n % 60:02d}.000Z"
    payload = {"type": "user_message", "message": text, "images": []}
    return {"timestamp": ts, "type": "event_msg", "payload": payload}


def tool_output(secret: str) -> dict[str, Any]:
    payload = {"type": "function_call_output", "call_id": "c1", "output": secret}
    return {"timestamp": "2026-03-01T10:00:00.000Z", "type": "response_item", "payload": payload}


def write(path: Path, *records: dict[str, Any]) -> None:
    with path.open("ab") as f:
        for r in records:
            f.write(orjson.dumps(r) + b"\n")


@dataclass
class Node:
    url: str
    tmp: Path
    roots: dict[str, str]
    fingerprint: str | None = None

    def adapter(self, kind: str, *, scan_cap: int = 1_048_576, pin: str | None = None) -> Adapter:
        node = NodeAddress(
            url=self.url,
            token_file=str(self.tmp / "node.token"),
            fingerprint=pin or self.fingerprint,
        )
        settings = Settings(nodes={"laptop": node}, scan_cap=scan_cap, max_line=1 << 20)
        return registry.entry(kind).build(settings)


@pytest.fixture
def codex_root(tmp_path: Path) -> Path:
    folder = tmp_path / "codex-home" / "sessions" / "2026" / "03" / "01"
    folder.mkdir(parents=True)
    meta = {"id": CODEX_ID, "cwd": "/w", "cli_version": "0.98.0"}
    write(
        folder / NAME,
        {"timestamp": "2026-03-01T10:00:00.000Z", "type": "session_meta", "payload": meta},
    )
    return tmp_path / "codex-home" / "sessions"


async def _serve(
    tmp_path: Path, roots: dict[str, str], tls: ssl.SSLContext | None
) -> web.AppRunner:
    (tmp_path / "node.token").write_text(TOKEN + "\n")
    runner = web.AppRunner(build_node_app(roots, TOKEN))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls).start()
    return runner


@pytest.fixture
async def node(tmp_path: Path, codex_root: Path) -> AsyncIterator[Node]:
    roots = {"codex": str(codex_root)}
    runner = await _serve(tmp_path, roots, None)
    host, port = runner.addresses[0][:2]
    yield Node(url=f"http://{host}:{port}", tmp=tmp_path, roots=roots)
    await runner.cleanup()


@pytest.fixture
async def tls_node(tmp_path: Path, codex_root: Path) -> AsyncIterator[Node]:
    context, fingerprint = server_context(tmp_path / "node-tls.pem")
    roots = {"codex": str(codex_root)}
    runner = await _serve(tmp_path, roots, context)
    host, port = runner.addresses[0][:2]
    yield Node(url=f"https://{host}:{port}", tmp=tmp_path, roots=roots, fingerprint=fingerprint)
    await runner.cleanup()


REF = {"nodeId": "laptop", "threadId": CODEX_ID}


async def check(adapter: Adapter, marker: dict[str, Any], ref: dict[str, Any] = REF) -> Outcome:
    (outcome,) = await adapter.check([Probe(session_key="agent:main:x", ref=ref, marker=marker)])
    return outcome


def rollout(root: Path) -> Path:
    return root / "2026" / "03" / "01" / NAME


async def test_a_burst_of_any_size_is_read_whole_and_once(node: Node, codex_root: Path) -> None:
    adapter = node.adapter("codex-node", scan_cap=4096)
    marker = await adapter.baseline(REF)
    write(rollout(codex_root), *(typed(f"prompt number {i}", i) for i in range(400)))
    seen: list[str] = []
    for _ in range(200):  # a cap's worth per check, each check going on from the last
        outcome = await check(adapter, marker)
        seen += [t.text_hash for t in outcome.turns]
        if outcome.marker in (None, marker):
            break
        marker = outcome.marker
    assert [text_hash(f"prompt number {i}") for i in range(400)] == seen
    assert "quiet" == (await check(adapter, marker)).status


async def test_tool_output_never_crosses_the_wire(node: Node, codex_root: Path) -> None:
    adapter = node.adapter("codex-node")
    marker = await adapter.baseline(REF)
    write(rollout(codex_root), tool_output("SECRET-TOOL-OUTPUT"), typed("typed by a person"))
    params = {"offset": str(marker["offset"]), "file": marker["file"]}
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"{node.url}/v1/sources/codex/{CODEX_ID}/lines",
            params=params,
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as resp,
    ):
        raw = await resp.read()
    assert 200 == resp.status
    assert b"SECRET-TOOL-OUTPUT" not in raw
    assert b"typed by a person" in raw  # what the classifier needs, and no more
    outcome = await check(adapter, marker)
    assert [text_hash("typed by a person")] == [t.text_hash for t in outcome.turns]


async def test_a_rewritten_rollout_is_reread_for_what_is_new(node: Node, codex_root: Path) -> None:
    adapter = node.adapter("codex-node")
    path = rollout(codex_root)
    write(path, typed("first", 1))
    marker = await adapter.baseline(REF)
    first_line = path.read_bytes().splitlines(True)[0]
    path.write_bytes(first_line + orjson.dumps(typed("first", 1)) + b"\n")  # rewritten shorter
    write(path, typed("written after the rewrite", 5))
    outcome = await check(adapter, {**marker, "seenAt": 1772359201000})
    assert [text_hash("written after the rewrite")] == [t.text_hash for t in outcome.turns]


async def test_compressed_archived_and_deleted_rollouts(node: Node, codex_root: Path) -> None:
    adapter = node.adapter("codex-node")
    marker = await adapter.baseline(REF)
    path = rollout(codex_root)
    packed = path.with_name(path.name + ".zst")
    packed.write_bytes(zstandard.ZstdCompressor().compress(path.read_bytes()))
    path.unlink()  # Codex's compression after 7 idle days
    compressed = await check(adapter, marker)
    assert ("quiet", marker) == (compressed.status, compressed.marker)
    assert "compressed by the harness" in str(compressed.reason)
    path.write_bytes(zstandard.ZstdDecompressor().stream_reader(packed.read_bytes()).read())
    packed.unlink()  # resumed: written back, a new inode
    write(path, typed("after the resume", 9))
    resumed = await check(adapter, marker)
    assert [text_hash("after the resume")] == [t.text_hash for t in resumed.turns]
    assert resumed.marker is not None
    archive = codex_root.parent / "archived_sessions"
    archive.mkdir()
    path.rename(archive / path.name)
    archived = await check(adapter, resumed.marker)
    assert "quiet" == archived.status and "archived by Codex" in str(archived.reason)
    (archive / path.name).unlink()
    assert "missing" == (await check(adapter, resumed.marker)).status


async def test_a_node_that_is_down_or_serves_no_such_kind_is_inconclusive(
    node: Node, tmp_path: Path
) -> None:
    pi = node.adapter("pi-node")  # the node has no Pi root
    outcome = await check(pi, {"offset": 0}, {"nodeId": "laptop", "threadId": "3f2a"})
    assert "inconclusive" == outcome.status and "serves no 'pi'" in str(outcome.reason)
    down = Node(url="http://127.0.0.1:9", tmp=tmp_path, roots={})
    for kind in ("codex-node", "opencode-node"):
        outcome = await check(down.adapter(kind), {"offset": 0, "seq": 1})
        assert "inconclusive" == outcome.status
        assert "cannot connect to 127.0.0.1:9" in str(outcome.reason)


async def test_the_catalog_lists_every_served_kind(tmp_path: Path, codex_root: Path) -> None:
    db = OpenCodeDB(tmp_path / "opencode.db")
    db.session("ses_1")
    db.prompt("ses_1", "an opencode title")
    pi = tmp_path / "pi" / "proj"
    pi.mkdir(parents=True)
    header = {"type": "session", "version": 3, "id": "3f2a", "timestamp": "2026-03-01T10:00:00Z"}
    write(pi / "2026-03-01T10-00-00_3f2a.jsonl", header)
    roots = {"codex": str(codex_root), "pi": str(tmp_path / "pi"), "opencode": str(db.path)}
    runner = await _serve(tmp_path, roots, None)
    host, port = runner.addresses[0][:2]
    try:
        served = Node(url=f"http://{host}:{port}", tmp=tmp_path, roots=roots)
        for kind, native in (
            ("codex-node", CODEX_ID),
            ("pi-node", "3f2a"),
            ("opencode-node", "ses_1"),
        ):
            found = await served.adapter(kind).catalog()
            assert not found.errors
            assert [(kind, native, "laptop")] == [
                (e.kind, e.native_id, e.node) for e in found.entries
            ]
    finally:
        await runner.cleanup()


async def test_opencode_on_a_node_sends_user_parts_only(tmp_path: Path) -> None:
    db = OpenCodeDB(tmp_path / "opencode.db")
    db.session("ses_1")
    runner = await _serve(tmp_path, {"opencode": str(db.path)}, None)
    host, port = runner.addresses[0][:2]
    try:
        served = Node(url=f"http://{host}:{port}", tmp=tmp_path, roots={})
        adapter = served.adapter("opencode-node")
        ref = {"nodeId": "laptop", "threadId": "ses_1"}
        marker = await adapter.baseline(ref)
        db.prompt("ses_1", "typed into opencode")
        db.reply("ses_1")  # the agent's answer: never on the wire
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                f"http://{host}:{port}/v1/sources/opencode/ses_1/export",
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as resp,
        ):
            body = await resp.json()
        assert [["text"]] == [[p["type"] for p in m["parts"]] for m in body["messages"]]
        outcome = await check(adapter, marker, ref)
        assert [text_hash("typed into opencode")] == [t.text_hash for t in outcome.turns]
        os.unlink(db.path)
        assert "missing" == (await check(adapter, outcome.marker or {}, ref)).status
    finally:
        await runner.cleanup()


# -- TLS and the pin -------------------------------------------------------------------


async def test_a_tls_node_with_its_pin_is_read(tls_node: Node, codex_root: Path) -> None:
    adapter = tls_node.adapter("codex-node")
    marker = await adapter.baseline(REF)
    write(rollout(codex_root), typed("over tls"))
    outcome = await check(adapter, marker)
    assert [text_hash("over tls")] == [t.text_hash for t in outcome.turns]
    pem = tls_node.tmp / "node-tls.pem"
    assert 0o600 == pem.stat().st_mode & 0o777
    assert server_context(pem)[1] == tls_node.fingerprint  # made once, read again after


async def test_a_wrong_pin_fails_closed_naming_both(tls_node: Node) -> None:
    wrong = "ab" * 32
    outcome = await check(tls_node.adapter("codex-node", pin=wrong), {"offset": 0})
    assert "inconclusive" == outcome.status
    reason = str(outcome.reason)
    assert f"sha256:{wrong}" in reason and f"sha256:{tls_node.fingerprint}" in reason
    assert "\n" not in reason


async def test_plain_http_to_a_tls_node_gets_nothing(tls_node: Node) -> None:
    plain = Node(url=tls_node.url.replace("https:", "http:"), tmp=tls_node.tmp, roots={})
    outcome = await check(plain.adapter("codex-node"), {"offset": 0})
    assert "inconclusive" == outcome.status
    assert "is it https://" in str(outcome.reason)


@pytest.mark.parametrize(
    ("node", "said"),
    [
        ({"url": "http://192.168.1.20:8766"}, "plain http to another machine"),
        ({"url": "https://laptop.lan:8766"}, "no fingerprint is pinned"),
        ({"url": "https://laptop.lan:8766", "fingerprint": "sha256:12"}, "64 hex digits"),
        ({"url": "ftp://laptop:1"}, "must be http://HOST:PORT or https://HOST:PORT"),
    ],
)
def test_the_configuration_refuses_an_unprotected_node(node: dict[str, str], said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        parse_config({"nodes": {"laptop": {"token_file": "/t", **node}}})


def test_loopback_http_and_a_pinned_https_node_are_taken() -> None:
    pin = "AB:" * 31 + "AB"
    config = parse_config(
        {
            "nodes": {
                "tunnel": {"url": "http://127.0.0.1:8766", "token_file": "/t"},
                "lan": {"url": "https://10.0.0.2:8766", "token_file": "/t", "fingerprint": pin},
            }
        }
    )
    assert "sha256:" + "ab" * 32 == config.nodes["lan"].fingerprint


async def test_pi_on_a_node_sends_what_the_classifier_reads(tmp_path: Path) -> None:
    folder = tmp_path / "pi" / "proj"
    folder.mkdir(parents=True)
    path = folder / "2026-03-01T10-00-00_3f2a.jsonl"
    header = {"type": "session", "version": 3, "id": "3f2a", "timestamp": "2026-03-01T10:00:00Z"}
    write(path, header)
    runner = await _serve(tmp_path, {"pi": str(tmp_path / "pi")}, None)
    host, port = runner.addresses[0][:2]
    try:
        adapter = Node(url=f"http://{host}:{port}", tmp=tmp_path, roots={}).adapter("pi-node")
        ref = {"nodeId": "laptop", "threadId": "3f2a"}
        marker = await adapter.baseline(ref)
        image = {"type": "image", "data": "SECRET-IMAGE-DATA", "mimeType": "image/png"}
        user = {"role": "user", "content": [{"type": "text", "text": "look at this"}, image]}
        answer = {"role": "assistant", "content": [{"type": "text", "text": "SECRET-ANSWER"}]}
        tool = {"role": "toolResult", "content": [{"type": "text", "text": "SECRET-OUTPUT"}]}
        for i, message in enumerate((user, answer, tool)):
            ts = f"2026-03-01T10:00:0{i + 1}Z"
            write(path, {"type": "message", "id": f"m{i}", "timestamp": ts, "message": message})
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                f"http://{host}:{port}/v1/sources/pi/3f2a/lines",
                params={"offset": str(marker["offset"]), "file": marker["file"]},
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as resp,
        ):
            raw = await resp.read()
        assert b"look at this" in raw
        assert b"SECRET" not in raw, raw
        outcome = await check(adapter, marker, ref)
        assert [text_hash("look at this")] == [t.text_hash for t in outcome.turns]
    finally:
        await runner.cleanup()


async def test_the_system_prompt_and_files_outside_the_root_stay_on_the_node(
    tmp_path: Path,
) -> None:
    root = tmp_path / "sessions"
    folder = root / "2026" / "03" / "01"
    folder.mkdir(parents=True)
    meta = {"id": CODEX_ID, "cwd": "/w", "cli_version": "0.98.0"}
    meta["base_instructions"] = {"text": "SECRET-SYSTEM-PROMPT"}
    write(
        folder / NAME,
        {"timestamp": "2026-03-01T10:00:00.000Z", "type": "session_meta", "payload": meta},
    )
    outside = tmp_path / "elsewhere" / f"rollout-2026-03-01T10-00-00-{'f' * 8}.jsonl"
    outside.parent.mkdir()
    write(outside, {"type": "session_meta", "payload": {"id": "f" * 8}}, typed("SECRET-OUTSIDE"))
    (folder / outside.name).symlink_to(outside)  # a link inside the root that leads out
    runner = await _serve(tmp_path, {"codex": str(root)}, None)
    host, port = runner.addresses[0][:2]
    base = f"http://{host}:{port}/v1/sources/codex"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with aiohttp.ClientSession(headers=headers) as http:
            async with http.get(f"{base}/{CODEX_ID}/baseline") as resp:
                raw = await resp.read()
            assert 200 == resp.status and b"SECRET" not in raw, raw
            async with http.get(f"{base}/{CODEX_ID}/lines", params={"offset": "0"}) as resp:
                raw = await resp.read()
            assert 200 == resp.status and b"SECRET" not in raw, raw
            for params in ({"offset": "0"}, {"offset": "0", "file": f"2026/03/01/{outside.name}"}):
                async with http.get(f"{base}/{'f' * 8}/lines", params=params) as resp:
                    raw = await resp.read()
                assert 404 == resp.status and b"SECRET" not in raw, raw
    finally:
        await runner.cleanup()


async def test_a_ticks_calls_to_a_node_run_a_few_at_a_time(
    tmp_path: Path, codex_root: Path
) -> None:
    """A far node costs its round trip once per tick, not once per link: at most
    ``node_client.CONCURRENT`` calls in flight, each probe's outcome in its place."""
    import asyncio

    from adapters import node_client

    running, peak = [0], [0]

    @web.middleware
    async def slow(request: web.Request, handler: Any) -> web.StreamResponse:
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        try:
            await asyncio.sleep(0.02)  # hold the call, so overlapping calls would show
            return await handler(request)  # type: ignore[no-any-return]
        finally:
            running[0] -= 1

    app = build_node_app({"codex": str(codex_root)}, TOKEN)
    app.middlewares.append(slow)
    (tmp_path / "node.token").write_text(TOKEN + "\n")
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        served = Node(url=f"http://127.0.0.1:{runner.addresses[0][1]}", tmp=tmp_path, roots={})
        adapter = served.adapter("codex-node")
        marker = await adapter.baseline(REF)
        gone = {"nodeId": "laptop", "threadId": "no-such-thread"}
        probes = [
            Probe(session_key=f"agent:main:x{i}", ref=gone if i % 2 else REF, marker=marker)
            for i in range(20)
        ]
        outcomes = await adapter.check(probes)
        assert ["quiet", "missing"] * 10 == [o.status for o in outcomes]
        assert 2 <= peak[0] <= node_client.CONCURRENT
    finally:
        await runner.cleanup()
