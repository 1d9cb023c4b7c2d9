"""What a gateway sharing the state database relies on: OpenClaw's link table and vocabulary,
store paths as OpenClaw resolves them, runId in deltas, wakes, and re-registration.

The check against OpenClaw's real package is in ``tests/interop``; these hold without it.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from monitor.config import Config, NodeConfig, RootsConfig
from monitor.kernel import Kernel, KernelSettings
from monitor.kernel.watcher_stores import StorePathRule
from monitor.upstream import UpstreamMonitor
from monitor.web import wire
from tests.helpers import ManualClock, WakeLog, human, notice
from tests.opencode_db import OpenCodeDB

MAIN = "agent:main:main"
KEY = "agent:main:adopted:x"
T = 1_790_000_000_000

# OpenClaw's links table, as a gateway that created the database first has it.
GATEWAY_LINKS_DDL = """
CREATE TABLE session_upstream_links (
  session_key TEXT NOT NULL,
  agent_id TEXT NOT NULL,
  catalog_id TEXT NOT NULL,
  host_id TEXT NOT NULL,
  thread_id TEXT NOT NULL,
  upstream_kind TEXT NOT NULL,
  upstream_ref_json TEXT,
  last_marker_json TEXT,
  last_scanned_at INTEGER,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  -- composite identity: agents share bare keys under session.scope = "global"
  PRIMARY KEY (session_key, agent_id)
) STRICT;
CREATE INDEX idx_session_upstream_links_catalog_id ON session_upstream_links(catalog_id);
"""

# The links table sessionwatch schema 1 created.
SCHEMA1_LINKS_DDL = """
CREATE TABLE sessionwatch_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
INSERT INTO sessionwatch_meta VALUES ('schema_version', '1');
CREATE TABLE session_upstream_links (
  session_key TEXT NOT NULL, agent_id TEXT NOT NULL, catalog_id TEXT, host_id TEXT,
  thread_id TEXT, upstream_kind TEXT NOT NULL, upstream_ref_json TEXT NOT NULL,
  last_marker_json TEXT, last_scanned_at INTEGER, created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL, PRIMARY KEY (session_key, agent_id)
) STRICT;
CREATE TABLE session_watch_cursors (
  watcher_session_key TEXT NOT NULL, watcher_store_path TEXT,
  target_session_key TEXT NOT NULL, last_seen_sequence INTEGER NOT NULL DEFAULT 0,
  notified_sequence INTEGER NOT NULL DEFAULT 0, material_sequence INTEGER NOT NULL DEFAULT 0,
  provenance TEXT NOT NULL DEFAULT 'explicit'
    CHECK (provenance IN ('explicit', 'ambient-group')),
  updated_at INTEGER NOT NULL, PRIMARY KEY (watcher_session_key, target_session_key)
) STRICT;
"""


def user_line(text: str) -> bytes:
    return orjson.dumps({"type": "user", "message": {"role": "user", "content": text}}) + b"\n"


def columns(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return [tuple(r[1:]) for r in conn.execute("PRAGMA table_info(session_upstream_links)")]


def link_rows(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT session_key, catalog_id, host_id, thread_id, upstream_kind,"
            " upstream_ref_json, last_marker_json FROM session_upstream_links ORDER BY 1"
        ).fetchall()


def insert_gateway_link(db: Path, key: str, kind: str, ref: Any, marker: Any, **kw: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO session_upstream_links VALUES (?, 'main', ?, ?, ?, ?, ?, ?, NULL, ?, ?)",
            (
                key,
                kw.get("catalog", "claude"),
                kw.get("host", "gateway:local"),
                kw.get("thread", "t1"),
                kind,
                orjson.dumps(ref).decode(),
                orjson.dumps(marker).decode(),
                T,
                T,
            ),
        )


@pytest.fixture
def roots(tmp_path: Path) -> RootsConfig:
    for name in ("claude", "codex", "pi"):
        (tmp_path / name).mkdir()
    return RootsConfig(
        claude=str(tmp_path / "claude"),
        codex=str(tmp_path / "codex"),
        pi=str(tmp_path / "pi"),
        opencode_db=str(tmp_path / "opencode.db"),
    )


async def open_monitor(db: Path, roots: RootsConfig, clock: ManualClock) -> UpstreamMonitor:
    kernel = await Kernel.open(db, clock=clock)
    return UpstreamMonitor.from_config(kernel, Config(roots=roots))


async def test_links_table_has_openclaws_exact_shape(db_path: Path, kernel: Kernel) -> None:
    """catalog, host and thread are NOT NULL, ref and marker nullable, with the catalog index."""
    gateway = db_path.with_name("gateway.db")
    with sqlite3.connect(gateway) as conn:
        conn.executescript(GATEWAY_LINKS_DDL)
    assert columns(gateway) == columns(db_path)
    with sqlite3.connect(db_path) as conn:
        sql = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'session_upstream_links'"
        ).fetchone()[0]
        index = conn.execute(
            "SELECT tbl_name FROM sqlite_master"
            " WHERE name = 'idx_session_upstream_links_catalog_id'"
        ).fetchone()
    assert sql.rstrip().endswith("STRICT")
    assert ("session_upstream_links",) == index


async def test_a_schema1_database_keeps_its_links_in_openclaws_vocabulary(
    db_path: Path, clock: ManualClock
) -> None:
    """An earlier sessionwatch's links and markers survive the rebuild, renamed, and its
    "default" store paths become the real ones."""
    with sqlite3.connect(db_path) as conn:
        conn.executescript(SCHEMA1_LINKS_DDL)
        rows = [
            ("agent:main:a", "claude", {"filePath": "/c/a.jsonl"}, {"offset": 10}),
            ("agent:main:b", "codex", {"filePath": "/x/b.jsonl", "threadId": "tb"}, {"offset": 5}),
            ("agent:main:c", "pi", {"filePath": "/p/c.jsonl"}, {"offset": 7}),
            ("agent:main:d", "opencode", {"dbPath": "/o.db", "threadId": "ses_d"}, {"seq": 3}),
            ("agent:main:e", "claude-node", {"nodeId": "ws", "threadId": "te"}, {"uuid": "u9"}),
        ]
        for key, kind, ref, marker in rows:
            conn.execute(
                "INSERT INTO session_upstream_links VALUES (?, 'main', ?, NULL, ?, ?, ?, ?, NULL,"
                " 1, 2)",
                (
                    key,
                    kind,
                    ref.get("threadId", "f"),
                    kind,
                    orjson.dumps(ref).decode(),
                    orjson.dumps(marker).decode(),
                ),
            )
        conn.execute(
            "INSERT INTO session_watch_cursors VALUES (?, 'default', 'agent:main:a', 0, 0, 0,"
            " 'explicit', 1)",
            (MAIN,),
        )
    kernel = await Kernel.open(db_path, KernelSettings(store_path_template="/s/{agentId}.db"))
    await kernel.close()
    assert [
        (
            "agent:main:a",
            "claude",
            "gateway:local",
            "f",
            "claude-cli",
            '{"filePath":"/c/a.jsonl"}',
            '{"offset":10}',
        ),
        (
            "agent:main:b",
            "codex",
            "gateway:local",
            "tb",
            "codex-rollout",
            '{"filePath":"/x/b.jsonl","threadId":"tb"}',
            '{"offset":5}',
        ),
        (
            "agent:main:c",
            "pi",
            "gateway:local",
            "f",
            "pi-cli",
            '{"filePath":"/p/c.jsonl"}',
            '{"offset":7}',
        ),
        (
            "agent:main:d",
            "opencode",
            "gateway:local",
            "ses_d",
            "opencode-cli",
            '{"dbPath":"/o.db","threadId":"ses_d"}',
            '{"seq":3}',
        ),
        (
            "agent:main:e",
            "claude",
            "node:ws",
            "te",
            "claude-cli",
            '{"nodeId":"ws","threadId":"te"}',
            '{"uuid":"u9"}',
        ),
    ] == link_rows(db_path)
    gateway = db_path.with_name("gateway.db")
    with sqlite3.connect(gateway) as conn:
        conn.executescript(GATEWAY_LINKS_DDL)
    assert columns(gateway) == columns(db_path)
    with sqlite3.connect(db_path) as conn:
        paths = conn.execute("SELECT watcher_store_path FROM session_watch_cursors").fetchall()
    assert [(os.path.realpath("/s/main.db"),)] == paths


@pytest.mark.parametrize(
    ("kind", "upstream_kind", "catalog", "host"),
    [
        ("claude", "claude-cli", "claude", "gateway:local"),
        ("codex", "codex-rollout", "codex", "gateway:local"),
        ("pi", "pi-cli", "pi", "gateway:local"),
    ],
)
async def test_adopted_file_links_use_openclaws_vocabulary(
    db_path: Path,
    roots: RootsConfig,
    clock: ManualClock,
    kind: str,
    upstream_kind: str,
    catalog: str,
    host: str,
) -> None:
    names = {
        "claude": "1c2d.jsonl",
        "codex": "rollout-2026-01-01T00-00-00-th9.jsonl",
        "pi": "x_p7.jsonl",
    }
    path = Path(getattr(roots, kind)) / names[kind]
    first = {"pi": {"type": "session", "version": 3, "id": "p7"}}.get(kind)
    path.write_bytes(orjson.dumps(first) + b"\n" if first else b"")
    monitor = await open_monitor(db_path, roots, clock)
    try:
        result = wire.adopted(
            await monitor.adoption.adopt(kind=kind, path=str(path), session_key=KEY)
        )
    finally:
        await monitor.kernel.close()
    assert result["declined"] is None
    ((_, cat, host_id, thread, upstream, ref, _),) = link_rows(db_path)
    assert (catalog, host, upstream) == (cat, host_id, upstream)
    assert orjson.loads(ref)["filePath"] == os.path.realpath(path)
    assert thread == {"claude": "1c2d", "codex": "th9", "pi": "p7"}[kind]


async def test_a_node_link_is_claude_cli_on_its_node(
    db_path: Path, roots: RootsConfig, clock: ManualClock
) -> None:
    """Adopting on a paired node writes claude-cli with host node:<nodeId> (a baseline that
    the unreachable node declines leaves no link, so the row is written directly here)."""
    kernel = await Kernel.open(db_path, clock=clock)
    monitor = UpstreamMonitor.from_config(
        kernel,
        Config(roots=roots, nodes={"ws": NodeConfig(url="http://127.0.0.1:9", token_file="/x")}),
    )
    try:
        from monitor.upstream.links import upsert_link

        link = await kernel.store.write(
            lambda c: upsert_link(
                c,
                key=KEY,
                agent_id="main",
                kind="claude-node",
                ref={"nodeId": "ws", "threadId": "t"},
                marker={"uuid": "u1"},
                thread_id="t",
                now=T,
            )
        )
        assert ("claude-cli", "claude", "node:ws", "claude-node") == (
            link.upstream_kind,
            link.catalog_id,
            link.host_id,
            link.kind,
        )
        assert [("claude-node", False)] == [
            (x["kind"], x["foreign"]) for x in wire.links(await monitor.links())
        ]
    finally:
        await kernel.close()


async def test_an_opencode_link_openclaw_wrote_reads_the_configured_database(
    db_path: Path, roots: RootsConfig, clock: ManualClock
) -> None:
    """OpenClaw's opencode-cli ref is {threadId} alone: the configured database is read."""
    oc = OpenCodeDB(Path(roots.opencode_db))
    oc.session("ses_1")
    first = oc.prompt("ses_1", "first")
    with oc.connect() as conn:
        seq = conn.execute(
            "SELECT seq FROM event_sequence WHERE aggregate_id = 'ses_1'"
        ).fetchone()[0]
    monitor = await open_monitor(db_path, roots, clock)
    await monitor.kernel.close()
    insert_gateway_link(
        db_path,
        KEY,
        "opencode-cli",
        {"threadId": "ses_1"},
        {"seq": seq, "lastHumanMessageId": first},
        catalog="opencode",
        thread="ses_1",
    )
    monitor = await open_monitor(db_path, roots, clock)
    try:
        assert await monitor.kernel.watch(watcher=MAIN, target=KEY)
        oc.prompt("ses_1", "typed in opencode")
        assert [("activity", 1)] == [(r.outcome, r.turns) for r in await monitor.ticker.tick()]
    finally:
        await monitor.kernel.close()


async def test_links_openclaw_wrote_continue_and_foreign_ones_are_left_alone(
    db_path: Path, roots: RootsConfig, clock: ManualClock
) -> None:
    """On a gateway-created table: a claude-cli link with the legacy {size} marker is ticked
    from there (not re-baselined); a codex-app-server link whose rollout is not on this
    machine is left to the gateway (inconclusive, its marker untouched, never missing); one
    on a paired node is foreign, never ticked or deleted, and listed as such."""
    with sqlite3.connect(db_path) as conn:
        conn.executescript(GATEWAY_LINKS_DDL)
    path = Path(roots.claude) / "t1.jsonl"
    path.write_bytes(user_line("before"))
    size = path.stat().st_size
    path.write_bytes(user_line("before") + user_line("typed while the gateway was away"))
    insert_gateway_link(db_path, KEY, "claude-cli", {"filePath": str(path)}, {"size": size})
    codex, remote = "agent:main:adopted:codex", "agent:main:adopted:codex-node"
    for key, host in ((codex, "gateway:local"), (remote, "node:mac")):
        insert_gateway_link(
            db_path,
            key,
            "codex-app-server",
            {"connectionFingerprint": "fp", "threadId": "thr"},
            {"turnId": None},
            catalog="codex",
            thread="thr",
            host=host,
        )
    monitor = await open_monitor(db_path, roots, clock)
    try:
        for key in (KEY, codex, remote):
            assert await monitor.kernel.watch(watcher=MAIN, target=key)
        results = {r.session_key: r for r in await monitor.ticker.tick()}
        assert ("activity", 1) == (results[KEY].outcome, results[KEY].turns)
        assert "inconclusive" == results[codex].outcome
        assert "left to the gateway" in (results[codex].reason or "")
        foreign = results[remote]
        assert "skipped" == foreign.outcome
        assert foreign.reason is not None and "foreign" in foreign.reason
        for _ in range(3):
            await monitor.ticker.tick()
        listed = {x["sessionKey"]: x for x in wire.links(await monitor.links())}
        assert (listed[remote]["foreign"], listed[codex]["foreign"]) == (True, False)
        assert listed[KEY]["foreign"] is False
        assert path.stat().st_size == listed[KEY]["marker"]["offset"]
    finally:
        await monitor.kernel.close()
    rows = {r[0]: r for r in link_rows(db_path)}
    assert '{"turnId":null}' == rows[codex][6] == rows[remote][6]


async def test_the_dedupe_key_uses_openclaws_source_key(
    db_path: Path, roots: RootsConfig, clock: ManualClock
) -> None:
    """sha256(host NUL thread NUL ref-json)[:16]: the same key OpenClaw's monitor writes."""
    import hashlib

    path = Path(roots.claude) / "t1.jsonl"
    path.write_bytes(b"")
    monitor = await open_monitor(db_path, roots, clock)
    try:
        wire.adopted(
            await monitor.adoption.adopt(
                kind="claude", path=str(path), session_key=KEY, session_id="s1"
            )
        )
        assert await monitor.kernel.watch(watcher=MAIN, target=KEY)
        path.write_bytes(user_line("hello"))
        await monitor.ticker.tick()
    finally:
        await monitor.kernel.close()
    ref = orjson.dumps({"filePath": os.path.realpath(path)}).decode()
    source = hashlib.sha256(f"gateway:local\0t1\0{ref}".encode()).hexdigest()[:16]
    with sqlite3.connect(db_path) as conn:
        keys = [r[0] for r in conn.execute("SELECT dedupe_key FROM session_state_events")]
    assert f"upstream:{KEY}:{source}:{path.stat().st_size}" in keys


def test_store_paths_resolve_as_openclaw_does(tmp_path: Path) -> None:
    """OpenClaw's layout first, then the template, else OpenClaw's default state dir."""
    state = tmp_path / "oc"
    in_layout = StorePathRule.for_database(state / "state" / "openclaw.sqlite", "/t/{agentId}")
    assert str(state / "agents" / "ops" / "agent" / "openclaw-agent.sqlite") == in_layout.resolve(
        "ops"
    )
    templated = StorePathRule.for_database(tmp_path / "state.db", str(tmp_path / "{agentId}.db"))
    assert str(tmp_path / "ops.db") == templated.resolve("ops")
    fallback = StorePathRule.for_database(
        tmp_path / "state.db", env={"OPENCLAW_STATE_DIR": str(state)}
    )
    assert in_layout.resolve("main") == fallback.resolve("main")


async def test_a_watch_without_a_store_path_gets_openclaws_and_the_notice_shows(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A cursor OpenClaw registered (its own store path) is seen by a plain notices call;
    the gateway's explicit store path still wins."""
    db = tmp_path / "state" / "openclaw.sqlite"
    kernel = await Kernel.open(db, clock=clock)
    try:
        store = str(tmp_path / "agents" / "main" / "agent" / "openclaw-agent.sqlite")
        assert store == kernel.default_store_path(MAIN)
        with sqlite3.connect(db) as conn:
            conn.execute(
                "INSERT INTO session_watch_cursors VALUES (?, ?, ?, 0, 0, 0, 'explicit', ?)",
                (MAIN, store, KEY, T),
            )
        await human(kernel, KEY)
        assert [notice(KEY, 0)] == [n.text for n in await kernel.notices(watcher=MAIN)]
        assert [] == await kernel.notices(watcher=MAIN, store_path="/elsewhere.sqlite")
    finally:
        await kernel.close()


async def test_state_changes_carry_run_id_and_openclaws_payload(kernel: Kernel) -> None:
    """runId is present when the event has one; payloads are outcome/channel/turns only."""
    child = "agent:main:subagent:c"
    await kernel.spawn(parent=MAIN, child=child, run_id="r1")
    await human(kernel, child)
    status = wire.status(await kernel.status(child, changes_since=0))
    events = status["stateChanges"]["events"]
    assert ["r1", None] == [e.get("runId") for e in events]
    assert "runId" not in events[1]


async def test_explicit_coordinator_watchers_are_woken_ambient_and_subagent_ones_not(
    open_kernel: Any,
) -> None:
    wakes = WakeLog()
    kernel: Kernel = await open_kernel(wake=wakes)
    coordinator = "agent:main:dashboard:coord"
    peer = "agent:main:telegram:group:room"
    assert await kernel.watch(watcher=coordinator, target=KEY)
    assert await kernel.watch(watcher="agent:main:subagent:s", target=KEY)
    assert await kernel.watch(watcher=MAIN, target=peer, ambient=True)
    await human(kernel, KEY)
    await human(kernel, peer)
    await wakes.settled()
    assert [coordinator] == wakes.woken


async def test_re_registering_a_watch_leaves_the_cursor_untouched(
    kernel: Kernel, db_path: Path, clock: ManualClock
) -> None:
    def cursor() -> tuple[Any, ...]:
        with sqlite3.connect(db_path) as conn:
            row: tuple[Any, ...] = conn.execute("SELECT * FROM session_watch_cursors").fetchone()
            return row

    group = "agent:main:telegram:group:room"
    assert await kernel.watch(watcher=MAIN, target=group, ambient=True)
    first = cursor()
    clock.advance(60_000)
    assert await kernel.watch(watcher=MAIN, target=group, ambient=True)
    assert first == cursor()
    clock.advance(60_000)
    assert await kernel.watch(watcher=MAIN, target=group)  # promoted: the state changed
    promoted = cursor()
    assert ("explicit", T + 120_000) == (promoted[6], promoted[7])
    clock.advance(60_000)
    assert await kernel.watch(watcher=MAIN, target=group)
    assert promoted == cursor()
