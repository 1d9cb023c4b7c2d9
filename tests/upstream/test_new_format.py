"""A new upstream format is one module and one registry line: the scripted fake, registered
as a new format would be, runs through the real monitor (adoption, the tick, missing,
blocked, drift in ``links`` and the metrics, the catalog, and an adapter that raises) with
no other file touched."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

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
    await monitor.adopt(kind="fake", path=str(path), session_key=KEY, session_id="s1")
    assert await monitor.kernel.watch(watcher=MAIN, target=KEY)


async def test_the_fake_format_is_adopted_ticked_and_reported(
    fake_monitor: UpstreamMonitor, fake_root: Path
) -> None:
    path = fake_root / "one.fake"
    path.write_text("> before adoption\n")
    await adopt(fake_monitor, path)
    (link,) = await fake_monitor.links()
    assert ("fake", "fake-cli", "fake") == (link["kind"], link["upstreamKind"], link["catalogId"])
    append(path, "< working\n> fix the test\n")
    assert [("activity", 1)] == [(r.outcome, r.turns) for r in await fake_monitor.tick()]
    assert [("quiet", 0)] == [(r.outcome, r.turns) for r in await fake_monitor.tick()]
    status = await fake_monitor.kernel.status(KEY, changes_since=0)
    kinds = [e["kind"] for e in status["stateChanges"]["events"]]
    assert ["adopted", "human_direct_message"] == kinds
    assert 1 == len(await fake_monitor.kernel.notices(watcher=MAIN))
    (entry,) = (await fake_monitor.find_catalog("fake")).entries
    assert (KEY, "before adoption") == (entry.session_key, entry.title)


async def test_drift_and_a_block_show_in_links_and_metrics(
    fake_monitor: UpstreamMonitor, fake_root: Path
) -> None:
    path = fake_root / "one.fake"
    path.write_text("< hello\n")
    await adopt(fake_monitor, path)
    append(path, "hologram 3d\n")
    await fake_monitor.tick()
    (link,) = await fake_monitor.links()
    assert {"hologram": 1} == link["drift"]["unknownTypes"]
    metrics = fake_monitor.ticker.metrics
    assert metrics is not None
    assert 1 == metrics.drift_unknown.labels("fake", "hologram")._value.get()
    append(path, "!\n> after\n")
    assert ["blocked"] == [r.outcome for r in await fake_monitor.tick()]
    (link,) = await fake_monitor.links()
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
    assert [] == await fake_monitor.links()
    events = (await fake_monitor.kernel.status(KEY, changes_since=0))["stateChanges"]["events"]
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
        await fake_monitor.adopt(kind="faux", path=str(fake_root), session_key=KEY)
