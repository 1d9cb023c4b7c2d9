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
            await sidecar.monitor.adoption.adopt(
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


async def test_the_faults_grow_the_log_by_their_changes_not_by_their_bytes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The project's faults at once, each kept up for twenty ticks: megabytes of junk
    appended to one transcript, a line torn for good in another, the store locked by another
    process and then refusing every write (a full disk), a gateway refusing every wake, and a
    paired node cut. The log says each fault when it starts and when it ends, whatever the
    bytes and the ticks: its lines stay within a budget of a few per fault."""
    import asyncio
    import sqlite3

    import orjson

    from monitor.config import GatewayConfig, NodeConfig
    from tests.helpers import allow_event_inserts, refuse_event_inserts, refusing_gateway
    from tests.upstream.test_node_watch import CODEX_ID, TOKEN, start_node

    gateway = refusing_gateway()
    hooks_token = tmp_path / "hooks.token"
    hooks_token.write_text("wrong-" + "0" * 30 + "\n")
    hooks_token.chmod(0o600)
    node_root = tmp_path / "laptop"
    rollout = node_root / "2026" / "03" / "01" / f"rollout-2026-03-01T10-00-00-{CODEX_ID}.jsonl"
    rollout.parent.mkdir(parents=True)
    meta = {"id": CODEX_ID, "cwd": "/w", "cli_version": "0.98.0"}
    rollout.write_bytes(orjson.dumps({"type": "session_meta", "payload": meta}) + b"\n")
    node = await start_node(node_root)
    (tmp_path / "node.token").write_text(TOKEN + "\n")
    (tmp_path / "node.token").chmod(0o600)
    paired = NodeConfig(
        url=f"http://127.0.0.1:{node.addresses[0][1]}", token_file=str(tmp_path / "node.token")
    )
    gw = GatewayConfig(
        hooks_url=f"http://127.0.0.1:{gateway.server_port}/hooks",
        hooks_token_file=str(hooks_token),
    )
    config = make_config(tmp_path, gateway=gw, nodes={"laptop": paired})
    db = tmp_path / "state.db"
    root = Path(config.roots.claude)
    names = ("junk", "torn", "typed")
    try:
        async with running(config, db) as sidecar:
            assert sidecar is not None
            files = {}
            for name in names:
                path = files[name] = root / f"{name}.jsonl"
                path.write_bytes(user_line("first", uuid=f"{name}0"))
                await sidecar.monitor.adoption.adopt(
                    kind="claude", path=str(path), session_key=f"agent:main:{name}",
                    session_id=name,
                )  # fmt: skip
                await sidecar.kernel.watch(watcher=MAIN, target=f"agent:main:{name}")
            adopted = await sidecar.monitor.adoption.adopt(
                kind="codex-node", path="laptop", thread=CODEX_ID, session_key="agent:main:node"
            )
            assert adopted.link is not None, adopted
            await sidecar.kernel.watch(watcher=MAIN, target="agent:main:node")
            await node.cleanup()  # the node is cut from here on
            caplog.clear()
            with caplog.at_level(logging.INFO):
                junk = b"\x00garbage that is not JSON at all, line after line\n" * 40_000
                with files["torn"].open("ab") as f:
                    f.write(b'{"type":"user","uuid":"t1","message":{"role":"user","con')
                for n in range(20):
                    with files["junk"].open("ab") as f:
                        f.write(junk)  # 2 MB a tick: 40 MB of junk in all
                    with files["typed"].open("ab") as f:
                        f.write(user_line(f"prompt {n}", uuid=f"typed{n + 1}"))
                    if n == 5:  # another process holds the write lock for a tick
                        locker = sqlite3.connect(db, timeout=30)
                        locker.execute("BEGIN IMMEDIATE")
                    if n == 6:
                        locker.rollback()
                        locker.close()
                        conn = sqlite3.connect(db)
                        refuse_event_inserts(conn)  # every write refused: a full disk
                        conn.close()
                    if n == 14:
                        conn = sqlite3.connect(db)
                        allow_event_inserts(conn)
                        conn.close()
                    await sidecar.ticks.run_tick()
                    await asyncio.sleep(0)
                said = told(caplog)
    finally:
        gateway.shutdown()
    junk_lines = [m for m in said if "not JSON" in m]
    assert len(junk_lines) == 1, junk_lines  # 800,000 junk lines: said once, with a count
    assert sum("does not answer" in m or "laptop" in m for m in said) <= 2, said
    assert len(said) <= 30, "\n".join(said)
