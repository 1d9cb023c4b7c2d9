"""Node watching: a write on a paired node is recorded at once, not at the next tick; a node
that goes away is said once, and its first answer after it comes back checks its links.
Real node apps on loopback, a real ``serve`` in process whose ticks are an hour apart."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from monitor.config import NodeConfig
from monitor.serve.root import running
from monitor.web.node import build_node_app
from tests.helpers import make_config, until

MAIN = "agent:main:main"
KEY = "agent:main:node:codex"
CODEX_ID = "019c0000-0000-7000-8000-000000000001"
TOKEN = "node-secret"


def typed(text: str) -> bytes:
    payload = {"type": "user_message", "message": text, "images": []}
    record = {"timestamp": "2026-03-01T10:00:01.000Z", "type": "event_msg", "payload": payload}
    return orjson.dumps(record) + b"\n"


async def start_node(root: Path, port: int = 0) -> web.AppRunner:
    runner = web.AppRunner(build_node_app({"codex": str(root)}, TOKEN))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def test_a_write_on_the_node_is_recorded_before_any_tick(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "laptop" / "sessions"
    rollout = root / "2026" / "03" / "01" / f"rollout-2026-03-01T10-00-00-{CODEX_ID}.jsonl"
    rollout.parent.mkdir(parents=True)
    meta = {"id": CODEX_ID, "cwd": "/w", "cli_version": "0.98.0"}
    rollout.write_bytes(orjson.dumps({"type": "session_meta", "payload": meta}) + b"\n")
    node = await start_node(root)
    port = node.addresses[0][1]
    (tmp_path / "node.token").write_text(TOKEN + "\n")
    (tmp_path / "node.token").chmod(0o600)
    paired = NodeConfig(url=f"http://127.0.0.1:{port}", token_file=str(tmp_path / "node.token"))
    config = make_config(tmp_path, nodes={"laptop": paired})
    try:
        async with running(config, tmp_path / "state.db") as sidecar:
            assert sidecar is not None
            adopted = await sidecar.monitor.adoption.adopt(
                kind="codex-node", path="laptop", thread=CODEX_ID, session_key=KEY
            )
            assert adopted.link is not None, adopted
            await sidecar.kernel.watch(watcher=MAIN, target=KEY)

            async def turns(n: int) -> bool:
                events = await sidecar.kernel.recent_events(KEY)
                return n == sum(e.kind == "human_direct_message" for e in events)

            with rollout.open("ab") as f:
                f.write(typed("typed on the laptop"))
            await until("the write recorded without a tick", lambda: turns(1))
            await node.cleanup()  # the laptop sleeps
            with caplog.at_level(logging.INFO, logger="monitor.serve.node_watch"):
                await until(
                    "the outage said",
                    lambda: any("does not answer" in r.getMessage() for r in caplog.records),
                )
                with rollout.open("ab") as f:
                    f.write(typed("typed while it slept"))
                node = await start_node(root, port)
                await until("caught up when it answers", lambda: turns(2), timeout=60)
            said = [r.getMessage() for r in caplog.records]
            assert 1 == sum("does not answer" in m for m in said), said
            assert 1 == sum("answers again" in m for m in said), said
    finally:
        await node.cleanup()


async def test_a_node_without_a_change_feed_is_said_once_and_left_to_the_ticks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An older node has no ``/v1/changes``: said once, never as a node that is down."""
    from types import SimpleNamespace

    from adapters.base import NodeAddress
    from monitor.kernel.bus import Bus, SourcesMoved
    from monitor.serve.node_watch import NodeWatch
    from monitor.web.common import make_guard

    key = web.AppKey("token", str)
    older = web.Application(middlewares=[make_guard(key)])
    older[key] = TOKEN
    runner = web.AppRunner(older)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    (tmp_path / "node.token").write_text(TOKEN + "\n")
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    node = NodeAddress(url=url, token_file=str(tmp_path / "node.token"))
    ticked: list[frozenset[str]] = []
    bus = Bus()
    bus.subscribe(SourcesMoved, lambda c: ticked.append(c.keys))
    monitor = SimpleNamespace(kernel=SimpleNamespace(bus=bus))
    watch = NodeWatch(monitor, nodes={"old": node})  # type: ignore[arg-type]
    watch.bus = bus  # what start hands it
    watch.keys["old"] = {KEY}
    try:
        with caplog.at_level(logging.INFO, logger="monitor.serve.node_watch"):
            await asyncio.wait_for(watch.poll("old"), 10)  # returns: nothing to wait on
        said = [r.getMessage() for r in caplog.records]
        assert 1 == len(said) and "has no change feed" in said[0], said
        assert [] == ticked
    finally:
        await runner.cleanup()


async def test_a_reload_that_changes_a_node_starts_its_poll_again_at_once(tmp_path: Path) -> None:
    """A node that does not answer is polled with a growing backoff (up to 30 s); a reload
    that changes its address (a pin fixed, a new URL) starts its poll again at once, with
    a fresh backoff, instead of leaving the change feed down for the backoff's length."""
    from monitor.kernel import Kernel
    from monitor.kernel.bus import ConfigReloaded
    from monitor.serve.node_watch import NodeWatch
    from monitor.upstream import UpstreamMonitor
    from monitor.upstream.configured import nodes_of

    (tmp_path / "node.token").write_text(TOKEN + "\n")
    (tmp_path / "node.token").chmod(0o600)
    down = NodeConfig(url="http://127.0.0.1:9", token_file=str(tmp_path / "node.token"))
    config = make_config(tmp_path, nodes={"laptop": down})
    kernel = await Kernel.open(tmp_path / "state.db")
    try:
        monitor = UpstreamMonitor.from_config(kernel, config)
        watch = NodeWatch(monitor, nodes=nodes_of(config))
        watch.keys["laptop"] = {KEY}
        first = asyncio.ensure_future(watch.poll("laptop"))
        watch._polls["laptop"] = first
        await asyncio.sleep(0)  # it asks, and fails: its backoff starts
        moved = config._replace(nodes={"laptop": down._replace(url="http://127.0.0.1:10")})
        watch._reloaded(ConfigReloaded(config, moved))
        assert first.cancelled() or first.cancelling()
        assert "laptop" not in watch._polls  # the run loop starts it again at once
        assert watch._links_changed.is_set()
        same = ConfigReloaded(moved, moved)
        watch._polls["laptop"] = again = asyncio.ensure_future(asyncio.sleep(3600))
        watch._reloaded(same)  # nothing changed: the poll is left as it is
        assert watch._polls["laptop"] is again and not again.cancelled()
        again.cancel()
    finally:
        await kernel.close()
