"""The adapter contract (adapters/base.py), one suite for every registered format and the
scripted fake: resolve, baseline, check, missing, blocked, drift, self-echo and the catalog,
each on a real source (files appended to, a real OpenCode database, a real node on loopback).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from adapters import registry
from adapters.base import Adapter, NodeAddress, Outcome, Probe, Settings, text_hash
from adapters.catalog import catalog_id
from adapters.registry import Entry
from monitor.errors import OutsideRoots
from monitor.web.node import build_node_app
from tests.opencode_db import OpenCodeDB

FAKE = Entry(name="fake", module="adapters.fake", upstream_kind="fake-cli", catalog_id="fake")
MAX_LINE = 4096


@pytest.fixture
def fake_registered() -> Iterator[None]:
    registry.register(FAKE)
    yield
    registry.unregister(FAKE.name)


def _ts(n: int) -> str:
    return f"2026-03-01T10:{n // 60:02d}:{n % 60:02d}.000Z"


@dataclass
class Source:
    """One native source of a kind, and how to make things happen in it."""

    kind: str
    tmp: Path
    path: str = ""
    thread: str | None = None
    n: int = 0
    blocks: bool = True
    db: OpenCodeDB | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def native(self) -> str:
        """The format the source is written in (a node kind's is the format it serves)."""
        if self.kind == "fake":
            return "fake"
        return registry.entry(self.kind).serves or self.kind

    def line(self, record: dict[str, Any] | str) -> None:
        data = record if isinstance(record, str) else orjson.dumps(record).decode()
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(data + "\n")

    def next_id(self) -> str:
        self.n += 1
        return f"r{self.n}"

    # each kind's records ---------------------------------------------------------------

    def create(self) -> None:
        root = self.tmp / self.kind
        root.mkdir(parents=True)
        if self.native == "opencode":
            self.db = OpenCodeDB(root / "opencode.db")
            self.db.session("ses_1")
            self.path, self.thread, self.blocks = str(root / "opencode.db"), "ses_1", False
            if self.kind.endswith("-node"):
                self.thread = "ses_1"
            return
        if self.native == "fake":
            self.path = str(root / "one.fake")
            Path(self.path).write_text("< hello\n")
            return
        project = root / "proj"
        project.mkdir()
        if self.native == "codex":
            self.path = str(project / "rollout-2026-03-01T10-00-00-019c-thread.jsonl")
            self.line(
                {
                    "timestamp": _ts(0),
                    "type": "session_meta",
                    "payload": {"id": "019c-thread", "cwd": "/w", "cli_version": "0.98.0"},
                }
            )
        elif self.native == "pi":
            self.path = str(project / "2026-03-01T10-00-00_3f2a.jsonl")
            self.line({"type": "session", "version": 3, "id": "3f2a", "timestamp": _ts(0)})
        else:  # claude, and claude-node (a Claude transcript on the node)
            self.path = str(project / "0b9c-41f2.jsonl")
            self.blocks = self.kind == "claude"
        if self.kind.endswith("-node"):  # a node's sources are named by thread id
            self.thread = {"codex": "019c-thread", "pi": "3f2a"}.get(self.native, "0b9c-41f2")
        self.agent()

    def human(self, text: str) -> None:
        i = self.next_id()
        if self.native == "opencode":
            assert self.db is not None
            self.db.prompt("ses_1", text)
        elif self.native == "fake":
            self.line(f"> {text}")
        elif self.native == "codex":
            message: dict[str, Any] = {"type": "user_message", "message": text, "images": []}
            self.line({"timestamp": _ts(self.n), "type": "event_msg", "payload": message})
        elif self.native == "pi":
            content = [{"type": "text", "text": text}]
            message = {"role": "user", "content": content, "timestamp": 1772359200000 + self.n}
            self.line({"type": "message", "id": i, "timestamp": _ts(self.n), "message": message})
        else:
            message = {"role": "user", "content": text}
            self.line({"type": "user", "uuid": i, "timestamp": _ts(self.n), "message": message})

    def agent(self) -> None:
        i = self.next_id()
        if self.native == "opencode":
            assert self.db is not None
            self.db.reply("ses_1")
        elif self.native == "fake":
            self.line("< done")
        elif self.native == "codex":
            payload = {"type": "agent_message", "message": "done"}
            self.line({"timestamp": _ts(self.n), "type": "event_msg", "payload": payload})
        elif self.native == "pi":
            message = {"role": "assistant", "content": [{"type": "text", "text": "done"}]}
            self.line({"type": "message", "id": i, "timestamp": _ts(self.n), "message": message})
        else:
            message = {"role": "assistant", "content": [{"type": "text", "text": "done"}]}
            self.line(
                {"type": "assistant", "uuid": i, "timestamp": _ts(self.n), "message": message}
            )

    def unknown(self) -> str:
        """A record of a type the format never had; its name as drift counts it."""
        if self.native == "opencode":
            assert self.db is not None
            mid = self.db.message("ses_1")
            self.db.part("ses_1", mid, type="hologram")
            return "hologram"
        if self.native == "fake":
            self.line("hologram 3d")
            return "hologram"
        record: dict[str, Any] = {"type": "hologram", "timestamp": _ts(self.n)}
        if self.native == "claude":
            record["uuid"] = self.next_id()
        self.line(record)
        return "hologram"

    def block(self) -> None:
        if self.native == "fake":
            self.line("!")
        elif self.native == "pi":
            self.line("this is not JSON")
        else:  # a line longer than the largest line the monitor reads
            self.line({"type": "user", "padding": "x" * (MAX_LINE * 2)})

    def remove(self) -> None:
        if self.native == "opencode":
            assert self.db is not None
            with self.db.connect() as conn:
                conn.execute("DELETE FROM session WHERE id = 'ses_1'")
                conn.execute("DELETE FROM event_sequence WHERE aggregate_id = 'ses_1'")
        else:
            os.unlink(self.path)


KINDS = [*registry.adoptable_names(), "fake"]


@pytest.fixture(params=KINDS)
async def source(
    request: pytest.FixtureRequest, tmp_path: Path, fake_registered: None
) -> AsyncIterator[tuple[Source, Adapter, str]]:
    """A source of the kind, its adapter (built by the registry, as the service builds it)
    and the path ``resolve`` takes (a node's name for a paired node)."""
    kind = str(request.param)
    src = Source(kind=kind, tmp=tmp_path)
    src.create()
    roots = {kind: str(tmp_path / kind)}
    if src.native == "opencode":
        roots[kind] = src.path
    nodes: dict[str, NodeAddress] = {}
    runner = None
    named = src.path
    if kind != "fake" and registry.entry(kind).remote:
        (tmp_path / "node.token").write_text("node-secret\n")
        served = {src.native: roots[kind]}
        runner = web.AppRunner(build_node_app(served, "node-secret"))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        nodes["laptop"] = NodeAddress(
            url=f"http://{host}:{port}", token_file=str(tmp_path / "node.token")
        )
        named = "laptop"
    settings = Settings(roots=roots, nodes=nodes, scan_cap=1024, max_line=MAX_LINE)
    yield src, registry.entry(kind).build(settings), named
    if runner is not None:
        await runner.cleanup()


async def check(
    adapter: Adapter, ref: dict[str, Any], marker: dict[str, Any], **kw: Any
) -> Outcome:
    (outcome,) = await adapter.check(
        [Probe(session_key="agent:main:x", ref=ref, marker=marker, **kw)]
    )
    return outcome


async def test_baseline_starts_at_the_end_and_a_later_turn_is_reported_once(
    source: tuple[Source, Adapter, str],
) -> None:
    src, adapter, named = source
    src.human("before adoption")
    ref = adapter.resolve(named, src.thread).ref
    marker = await adapter.baseline(ref)
    quiet = await check(adapter, ref, marker)
    assert quiet.status == "quiet" and not quiet.turns
    src.agent()
    src.human("fix the failing test")
    found = await check(adapter, ref, marker)
    assert found.status == "activity"
    assert [text_hash("fix the failing test")] == [t.text_hash for t in found.turns]
    assert found.marker is not None and found.marker != marker
    again = await check(adapter, ref, found.marker)
    assert again.status == "quiet" and not again.turns


async def test_an_own_message_is_not_a_human_turn(source: tuple[Source, Adapter, str]) -> None:
    src, adapter, named = source
    ref = adapter.resolve(named, src.thread).ref
    marker = await adapter.baseline(ref)
    src.human("sent by the gateway")
    outcome = await check(adapter, ref, marker, own=((7, text_hash("sent by the gateway")),))
    assert not outcome.turns
    assert [7] == outcome.consumed_own


async def test_a_source_that_is_gone_is_missing(source: tuple[Source, Adapter, str]) -> None:
    src, adapter, named = source
    ref = adapter.resolve(named, src.thread).ref
    marker = await adapter.baseline(ref)
    src.remove()
    assert "missing" == (await check(adapter, ref, marker)).status


async def test_an_unreadable_record_blocks_at_its_offset(
    source: tuple[Source, Adapter, str],
) -> None:
    src, adapter, named = source
    if not src.blocks:
        pytest.skip(f"{src.kind} has no record that cannot be read past")
    ref = adapter.resolve(named, src.thread).ref
    marker = await adapter.baseline(ref)
    at = os.path.getsize(src.path)
    src.block()
    src.human("after the block")
    for _ in range(MAX_LINE):  # a long line is read a scan cap's worth per check
        outcome = await check(adapter, ref, marker)
        assert not outcome.turns
        if outcome.status != "quiet" or outcome.marker in (None, marker):
            break
        marker = outcome.marker
    assert "blocked" == outcome.status
    assert at == outcome.blocked_offset


async def test_a_record_type_never_seen_is_drift_not_silence(
    source: tuple[Source, Adapter, str],
) -> None:
    src, adapter, named = source
    ref = adapter.resolve(named, src.thread).ref
    marker = await adapter.baseline(ref)
    name = src.unknown()
    outcome = await check(adapter, ref, marker)
    assert outcome.status in ("quiet", "activity")
    assert outcome.drift is not None and name in outcome.drift.unknown_types


async def test_the_catalog_lists_the_source_under_its_catalog_key(
    source: tuple[Source, Adapter, str],
) -> None:
    src, adapter, named = source
    src.human("a title to find")
    ref = adapter.resolve(named, src.thread).ref
    found = await adapter.catalog()
    assert not found.errors
    ids = [e.catalog_id for e in found.entries]
    assert catalog_id(src.kind, adapter.catalog_key(ref)) in ids


async def test_a_source_outside_the_root_is_refused(
    source: tuple[Source, Adapter, str], tmp_path: Path
) -> None:
    src, adapter, _ = source
    if src.kind.endswith("-node"):
        pytest.skip("a node's sources are named by node, not by path")
    stray = tmp_path / "elsewhere.jsonl"
    stray.write_text("{}\n")
    with pytest.raises(OutsideRoots):
        adapter.resolve(str(stray), src.thread)
