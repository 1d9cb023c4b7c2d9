"""A new upstream format is one module and one registry line: the scripted fake, registered
as a new format would be, runs through the real monitor (adoption, the tick, missing,
blocked, drift in ``links`` and the metrics, the catalog, and an adapter that raises) with
no other file touched."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest

from adapters import registry
from adapters.base import Settings
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
    wire.adopted(await monitor.adopt(kind="fake", path=str(path), session_key=KEY, session_id="s1"))
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
    assert [("activity", 1)] == [(r.outcome, r.turns) for r in await fake_monitor.tick()]
    assert [("quiet", 0)] == [(r.outcome, r.turns) for r in await fake_monitor.tick()]
    status = wire.status(await fake_monitor.kernel.status(KEY, changes_since=0))
    kinds = [e["kind"] for e in status["stateChanges"]["events"]]
    assert ["adopted", "human_direct_message"] == kinds
    assert 1 == len(await fake_monitor.kernel.notices(watcher=MAIN))
    (entry,) = (await fake_monitor.catalog("fake")).entries
    assert (KEY, "before adoption") == (entry.session_key, entry.title)


async def test_drift_and_a_block_show_in_links_and_metrics(
    fake_monitor: UpstreamMonitor, fake_root: Path
) -> None:
    path = fake_root / "one.fake"
    path.write_text("< hello\n")
    await adopt(fake_monitor, path)
    append(path, "hologram 3d\n")
    await fake_monitor.tick()
    (link,) = wire.links(await fake_monitor.links())
    assert {"hologram": 1} == link["drift"]["unknownTypes"]
    metrics = fake_monitor.ticker.metrics
    assert metrics is not None
    assert 1 == metrics.drift_unknown.labels("fake", "hologram")._value.get()
    append(path, "!\n> after\n")
    assert ["blocked"] == [r.outcome for r in await fake_monitor.tick()]
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
    seen = [[r.outcome for r in await fake_monitor.tick()] for _ in range(3)]
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
    (result,) = await fake_monitor.tick()
    assert ("inconclusive", "adapter failed: a bug in the adapter") == (
        result.outcome,
        result.reason,
    )
    assert [("activity", 1)] == [(r.outcome, r.turns) for r in await fake_monitor.tick()]


async def test_an_unregistered_kind_is_refused_by_name(
    fake_monitor: UpstreamMonitor, fake_root: Path
) -> None:
    with pytest.raises(BadInput, match='unknown upstream kind "faux"'):
        wire.adopted(await fake_monitor.adopt(kind="faux", path=str(fake_root), session_key=KEY))


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
