"""A new upstream format is one module and one registry line: the scripted fake, registered
as a new format would be, runs through the real monitor (adoption, the tick, missing,
blocked, drift in ``links`` and the metrics, the catalog, and an adapter that raises) with
no other file touched."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from adapters import registry
from adapters.base import NodeAddress, Probe, Settings
from adapters.fake import FakeAdapter
from adapters.registry import Entry
from monitor.errors import BadInput
from monitor.kernel import Kernel
from monitor.metrics import Metrics
from monitor.upstream import UpstreamMonitor
from monitor.upstream.tick import TickSettings
from monitor.web import wire
from tests.helpers import REPO, run_ok, served_address
from tests.interop.gateway_rig import wait_for

KEY = "agent:main:adopted:fake"
MAIN = "agent:main:main"


@pytest.fixture
def fake_root(tmp_path: Path) -> Iterator[Path]:
    registry.register(
        Entry(name="fake", module="adapters.fake", upstream_kind="fake-cli", catalog_id="fake")
    )
    root = tmp_path / "fake"
    root.mkdir()
    yield root
    registry.unregister("fake")


@pytest.fixture
async def fake_monitor(kernel: Kernel, fake_root: Path) -> AsyncIterator[UpstreamMonitor]:
    adapters = registry.build_adapters(Settings(roots={"fake": str(fake_root)}))
    yield UpstreamMonitor(kernel, adapters, TickSettings(), metrics=Metrics())


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


async def adopt(monitor: UpstreamMonitor, path: Path) -> None:
    wire.adopted(
        await monitor.adoption.adopt(kind="fake", path=str(path), session_key=KEY, session_id="s1")
    )
    assert await monitor.kernel.watch(watcher=MAIN, target=KEY)


async def test_the_fake_format_is_adopted_ticked_and_reported(
    fake_monitor: UpstreamMonitor, fake_root: Path
) -> None:
    path = fake_root / "one.fake"
    path.write_text("> before adoption\n")
    await adopt(fake_monitor, path)
    (link,) = wire.links(await fake_monitor.links())
    assert ("fake", "fake-cli", "fake") == (link["kind"], link["upstreamKind"], link["catalogId"])
    append(path, "< working\n> fix the test\n")
    assert [("activity", 1)] == [(r.outcome, r.turns) for r in await fake_monitor.ticker.tick()]
    assert [("quiet", 0)] == [(r.outcome, r.turns) for r in await fake_monitor.ticker.tick()]
    status = wire.status(await fake_monitor.kernel.status(KEY, changes_since=0))
    kinds = [e["kind"] for e in status["stateChanges"]["events"]]
    assert ["adopted", "human_direct_message"] == kinds
    assert 1 == len(await fake_monitor.kernel.notices(watcher=MAIN))
    (entry,) = (await fake_monitor.sessions.find("fake")).entries
    assert (KEY, "before adoption") == (entry.session_key, entry.title)


async def test_drift_and_a_block_show_in_links_and_metrics(
    fake_monitor: UpstreamMonitor, fake_root: Path
) -> None:
    path = fake_root / "one.fake"
    path.write_text("< hello\n")
    await adopt(fake_monitor, path)
    append(path, "hologram 3d\n")
    await fake_monitor.ticker.tick()
    (link,) = wire.links(await fake_monitor.links())
    assert {"hologram": 1} == link["drift"]["unknownTypes"]
    metrics = fake_monitor.ticker.metrics
    assert metrics is not None
    assert 1 == metrics.drift_unknown.labels("fake", "hologram")._value.get()
    append(path, "!\n> after\n")
    assert ["blocked"] == [r.outcome for r in await fake_monitor.ticker.tick()]
    (link,) = wire.links(await fake_monitor.links())
    assert link["blocked"]["offset"] == path.stat().st_size - len("!\n> after\n")
    assert 1 == await fake_monitor.blocked_count()


async def test_a_source_gone_three_times_is_upstream_missing(
    fake_monitor: UpstreamMonitor, fake_root: Path
) -> None:
    path = fake_root / "one.fake"
    path.write_text("< hello\n")
    await adopt(fake_monitor, path)
    path.unlink()
    seen = [[r.outcome for r in await fake_monitor.ticker.tick()] for _ in range(3)]
    assert [["missing"]] * 3 == seen
    assert [] == wire.links(await fake_monitor.links())
    events = (wire.status(await fake_monitor.kernel.status(KEY, changes_since=0)))["stateChanges"][
        "events"
    ]
    assert "upstream_missing" == events[-1]["kind"]


async def test_an_adapter_that_raises_leaves_its_links_inconclusive(
    fake_monitor: UpstreamMonitor, fake_root: Path
) -> None:
    path = fake_root / "one.fake"
    path.write_text("< hello\n")
    await adopt(fake_monitor, path)
    adapter = fake_monitor.adapters["fake"]
    assert isinstance(adapter, FakeAdapter)
    adapter.fail = RuntimeError("a bug in the adapter")
    append(path, "> lost?\n")
    (result,) = await fake_monitor.ticker.tick()
    assert ("inconclusive", "adapter failed: a bug in the adapter") == (
        result.outcome,
        result.reason,
    )
    assert [("activity", 1)] == [(r.outcome, r.turns) for r in await fake_monitor.ticker.tick()]


async def test_an_unregistered_kind_is_refused_by_name(
    fake_monitor: UpstreamMonitor, fake_root: Path
) -> None:
    with pytest.raises(BadInput, match='unknown upstream kind "faux"'):
        wire.adopted(
            await fake_monitor.adoption.adopt(kind="faux", path=str(fake_root), session_key=KEY)
        )


# -- a new JSONL format through serve ----------------------------------------------------

WITH_LINES = (
    "import sys; from adapters import registry; from tests.upstream import lines_format;"
    " registry.register(lines_format.ENTRY);"  # the one registry line
    " from monitor.cli import main; sys.exit(main())"
)


def lines_argv(work: Path, *args: str) -> list[str]:
    """``sessionwatch ARGS`` on the scratch database and configuration, with the format
    registered (``-c WITH_LINES``), or as shipped (``-m monitor``) when ``args`` start
    with ``-m``."""
    config = ["--db", str(work / "state.db"), "--config", str(work / "sessionwatch.toml")]
    if args[:1] == ("-m",):
        return [sys.executable, "-m", "monitor", *config, *args[1:]]
    return [sys.executable, "-c", WITH_LINES, *config, *args]


def lines_cli(work: Path, *args: str) -> str:
    return run_ok(lines_argv(work, *args))


def test_a_new_jsonl_format_is_a_module_a_registry_line_and_a_roots_entry(
    tmp_path: Path,
) -> None:
    """``tests/upstream/lines_format.py`` declares its format; one ``registry.register``
    line and ``[roots] lines`` are all it takes to list, adopt and watch it, and ``serve``
    records a turn appended to it; without the registry line, ``[roots] lines`` is refused
    as a key no format has."""
    root = tmp_path / "lines"
    root.mkdir()
    source = root / "chat.jsonl"
    source.write_text('{"role": "person", "id": "p1", "text": "tidy the fixtures"}\n')
    (tmp_path / "sessionwatch.toml").write_text(
        f'[roots]\nlines = "{root}"\n'
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n'
        "[monitor]\ninitial_delay_s = 3600\ninterval_s = 3600\n"
    )
    (entry,) = orjson.loads(lines_cli(tmp_path, "catalog", "--kind", "lines", "--json"))["sessions"]
    assert "tidy the fixtures" == entry["title"]
    key = "agent:main:lines:chat"
    lines_cli(tmp_path, "adopt", entry["catalogId"], "--session-key", key)
    lines_cli(tmp_path, "watch", "--watcher", MAIN, "--target", key)
    serve = subprocess.Popen(
        lines_argv(tmp_path, "serve"),
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        served_address(serve)
        with source.open("a") as f:
            f.write('{"role": "model", "id": "m1", "text": "done"}\n')
            f.write('{"role": "person", "id": "p2", "text": "and the docs"}\n')

        def recorded() -> bool:
            status = orjson.loads(lines_cli(tmp_path, "status", key, "--changes-since", "0"))
            kinds = [e["kind"] for e in status["stateChanges"]["events"]]
            return "human_direct_message" in kinds

        wait_for("serve to record the appended turn", recorded, 30)
    finally:
        serve.terminate()
        serve.wait(30)
    plain = subprocess.run(
        lines_argv(tmp_path, "-m", "config"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 2 == plain.returncode
    assert "unknown key [roots] lines" in plain.stderr


# -- a new database format, locally and on a node ---------------------------------------


@pytest.fixture
def rows_db(tmp_path: Path) -> Iterator[Path]:
    """``tests/upstream/rows_format.py``'s database, with a session and a sub-agent run; its
    one registry line added for the test."""
    import sqlite3

    from tests.upstream import rows_format

    registry.register(rows_format.ENTRY)  # the one registry line
    db = tmp_path / "rows.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(rows_format.SCHEMA)
        conn.execute("INSERT INTO session VALUES ('s1', NULL, '/w', 'tidy the rows', 1)")
        conn.execute("INSERT INTO session VALUES ('s2', 's1', '/w', 'a sub-agent', 2)")
        conn.execute("INSERT INTO message (session_id, role, text) VALUES ('s1', 'person', 'go')")
    yield db
    registry.unregister("rows")


def say(db: Path, role: str, text: str) -> None:
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO message (session_id, role, text) VALUES ('s1', ?, ?)", (role, text)
        )


async def test_a_new_database_format_is_a_module_and_a_registry_line(
    tmp_path: Path, rows_db: Path
) -> None:
    """Listed, adopted by its catalog id, and a person's row recorded by ``serve``'s tick,
    with ``[roots] rows_db`` the only configuration it takes."""
    from monitor.serve.root import running

    config = sidecar_config(tmp_path, f'[roots]\nrows_db = "{rows_db}"\n', watch_files=True)
    async with running(config, tmp_path / "state.db") as sidecar:
        assert sidecar is not None
        listed = await sidecar.monitor.sessions.find("rows")
        assert (["tidy the rows"], 1) == ([e.title for e in listed.entries], listed.skipped)
        adopted = await sidecar.monitor.adoption.adopt_source(
            session_key=KEY, catalog_id=listed.entries[0].catalog_id
        )
        assert adopted.link is not None
        ref = adopted.link.ref
        assert {"dbPath": str(rows_db.resolve()), "threadId": "s1"} == ref
        assert await sidecar.kernel.watch(watcher=MAIN, target=KEY)
        assert str(rows_db.resolve()) in sidecar.monitor.adapters["rows"].watched_paths(ref)
        say(rows_db, "model", "done")
        say(rows_db, "person", "and the docs")
        await sidecar.monitor.ticker.tick()
        status = await sidecar.kernel.status(KEY, changes_since=0)
        assert status.state_changes is not None
        kinds = [e.kind for e in status.state_changes.events]
        assert 1 == kinds.count("human_direct_message"), kinds
        assert [KEY] == [n.target for n in await sidecar.kernel.notices(watcher=MAIN)]


async def test_a_node_serves_a_new_database_format_through_its_registry_entry(
    rows_db: Path,
) -> None:
    """The node's database routes dispatch through the registry: the new format's own
    reader answers, and a kind the node does not serve is refused by name."""
    from aiohttp.test_utils import TestClient, TestServer

    from monitor.web.node import build_node_app

    app = build_node_app({"rows": str(rows_db)}, "t0ken")
    headers = {"Authorization": "Bearer t0ken"}
    async with TestClient(TestServer(app)) as client:
        got = await client.post(
            "/v1/sources/rows/signals", json={"ids": ["s1", "gone"]}, headers=headers
        )
        assert (200, {"signals": {"s1": 1}}) == (got.status, await got.json())
        say(rows_db, "person", "again")
        got = await client.get("/v1/sources/rows/s1/export", headers=headers)
        answer = await got.json()
        assert 200 == got.status and [1, 2] == [m["id"] for m in answer["messages"]]
        assert "again" not in str(answer)  # hashes only: no text crosses the wire
        got = await client.post(
            "/v1/sources/opencode/signals", json={"ids": ["s1"]}, headers=headers
        )
        assert 404 == got.status and "serves no 'opencode' sessions" in await got.text()
        catalog = await (await client.get("/v1/catalog", headers=headers)).json()
        assert ["rows"] == catalog["kinds"]
        token = rows_db.parent / "node.token"
        token.write_text("t0ken\n")
        address = NodeAddress(url=str(client.make_url("")).rstrip("/"), token_file=str(token))
        adapter = registry.entry("rows-node").build(Settings(nodes={"laptop": address}))
        ref = {"nodeId": "laptop", "threadId": "s1"}
        marker = await adapter.baseline(ref)
        assert {"lastId": 2} == marker
        say(rows_db, "person", "and again")
        (outcome,) = await adapter.check([Probe("agent:main:rows", ref, marker)])
        assert ("activity", ["3"]) == (outcome.status, [t.native_id for t in outcome.turns])
        (outcome,) = await adapter.check([Probe("agent:main:rows", {**ref, "threadId": "x"}, {})])
        assert "missing" == outcome.status


# -- a format that is not JSONL, on a node and adopted from a paired sidecar -------------


@pytest.fixture
def fake_on_a_node(tmp_path: Path) -> Iterator[Path]:
    """The scripted fake (lines of text, no JSON), registered with its node protocol: the
    one entry gives the local ``fake`` and the node's ``fake-node``."""
    registry.register(
        Entry(
            name="fake",
            module="adapters.fake",
            upstream_kind="fake-cli",
            catalog_id="fake",
            node="adapters.fake",
        )
    )
    root = tmp_path / "node-fake"
    root.mkdir()
    yield root
    registry.unregister("fake")
    assert "fake-node" not in registry.names()


async def test_a_node_serves_a_format_that_is_not_jsonl_and_a_paired_sidecar_adopts_it(
    tmp_path: Path, fake_on_a_node: Path
) -> None:
    """The node's routes dispatch to the fake's own module (no web code knows the format):
    a paired sidecar lists the node's session, adopts it by node and thread, and records
    the turn appended to it on the node's machine, once; only hashes cross the wire, a read
    the format has not is refused by name, and a session deleted on the node is missing."""
    from aiohttp import web

    from monitor.serve.root import running
    from monitor.web.node import build_node_app

    session = fake_on_a_node / "one.fake"
    session.write_text("> before adoption\n< working\n")
    (tmp_path / "node.token").write_text("t0ken\n")
    (tmp_path / "node.token").chmod(0o600)
    runner = web.AppRunner(build_node_app({"fake": str(fake_on_a_node)}, "t0ken"))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    node = (
        f'[nodes.laptop]\nurl = "http://{host}:{port}"\ntoken_file = "{tmp_path / "node.token"}"\n'
    )
    # only the test's own ticks read the node (no node watch's early check between them)
    config = sidecar_config(tmp_path, node, watch_files=False)
    try:
        async with running(config, tmp_path / "state.db") as sidecar:
            assert sidecar is not None
            listed = await sidecar.monitor.sessions.find("fake-node")
            assert [("one", "laptop", "before adoption")] == [
                (e.native_id, e.node, e.title) for e in listed.entries
            ]
            adopted = await sidecar.monitor.adoption.adopt(
                kind="fake-node", path="laptop", thread="one", session_key=KEY
            )
            assert adopted.link is not None
            assert {"nodeId": "laptop", "threadId": "one"} == adopted.link.ref
            assert await sidecar.kernel.watch(watcher=MAIN, target=KEY)
            append(session, "> fix the node test\n< done\n")
            assert [("activity", 1)] == [
                (r.outcome, r.turns) for r in await sidecar.monitor.ticker.tick()
            ]
            assert [("quiet", 0)] == [
                (r.outcome, r.turns) for r in await sidecar.monitor.ticker.tick()
            ]
            status = await sidecar.kernel.status(KEY, changes_since=0)
            assert status.state_changes is not None
            kinds = [e.kind for e in status.state_changes.events]
            assert ["adopted", "human_direct_message"] == kinds
            status, text = await node_get(host, port, "/v1/sources/fake/one/records?offset=0")
            assert 200 == status
            assert "fix the node test" not in text  # hashes only
            status, text = await node_get(host, port, "/v1/sources/fake/one/lines")
            assert 404 == status
            assert "fake sessions have no 'lines' read" in text
            session.unlink()
            outcomes = [[r.outcome for r in await sidecar.monitor.ticker.tick()] for _ in range(3)]
            assert [["missing"]] * 3 == outcomes
    finally:
        await runner.cleanup()


async def node_get(host: str, port: int, path: str) -> tuple[int, str]:
    """A GET of the node with its token: the status and the body."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        url = f"http://{host}:{port}{path}"
        async with http.get(url, headers={"Authorization": "Bearer t0ken"}) as resp:
            return resp.status, await resp.text()


def sidecar_config(tmp_path: Path, section: str, *, watch_files: bool) -> Any:
    """A sidecar's configuration: ``section`` (its sources), the API on a loopback port,
    ticks an hour apart."""
    from monitor.config import MonitorConfig, load_config

    config_file = tmp_path / "sessionwatch.toml"
    config_file.write_text(
        section + f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n'
    )
    config = load_config(config_file)
    return config._replace(monitor=MonitorConfig(initial_delay_s=3600, watch_files=watch_files))
