"""A session the harness compresses, archives or writes back is followed; only a real
deletion is ``upstream_missing``. Codex's rollout compression (``.jsonl.zst``, written by
the real ``zstandard`` library here as Codex writes it with the C library) and its archive."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import zstandard

from monitor.config import Config, RootsConfig
from monitor.kernel import Kernel
from monitor.upstream import UpstreamMonitor
from monitor.web import wire
from tests.helpers import REPO, notice

KEY = "agent:main:adopted:codex"
MAIN = "agent:main:main"
NAME = "rollout-2026-03-01T10-00-00-019c0000-0000-7000-8000-000000000001.jsonl"


def typed(text: str) -> bytes:
    record = {"type": "event_msg", "payload": {"type": "user_message", "message": text}}
    return orjson.dumps(record) + b"\n"


def compress(path: Path) -> Path:
    """What Codex's compression worker does to an idle rollout: ``.zst`` beside, plain gone."""
    packed = path.with_name(path.name + ".zst")
    packed.write_bytes(zstandard.ZstdCompressor(level=3).compress(path.read_bytes()))
    path.unlink()
    return packed


def resume(packed: Path) -> Path:
    """What resuming does: the plain file written back (a new inode), the ``.zst`` gone."""
    plain = packed.with_name(packed.name.removesuffix(".zst"))
    plain.write_bytes(zstandard.ZstdDecompressor().stream_reader(packed.read_bytes()).read())
    packed.unlink()
    return plain


def rollout(roots: RootsConfig) -> Path:
    folder = Path(roots.codex) / "2026" / "03" / "01"
    folder.mkdir(parents=True)
    path = folder / NAME
    first = (REPO / "sample_transcripts" / "codex_rollout.jsonl").read_bytes().splitlines(True)[0]
    path.write_bytes(first + typed("fix the flaky invoice test"))
    return path


async def tick(kernel: Kernel, roots: RootsConfig) -> list[tuple[str, int, str | None]]:
    """One tick of a fresh monitor, as separate processes would run it."""
    monitor = UpstreamMonitor.from_config(kernel, Config(roots=roots))
    return [(r.outcome, r.turns, r.reason) for r in await monitor.ticker.tick()]


async def test_a_compressed_rollout_is_idle_and_followed_when_resumed(
    kernel: Kernel, roots: RootsConfig
) -> None:
    path = rollout(roots)
    monitor = UpstreamMonitor.from_config(kernel, Config(roots=roots))
    before = (await monitor.sessions.find()).entries
    await monitor.adoption.adopt(kind="codex", path=str(path), session_key=KEY, session_id="s1")
    assert await kernel.watch(watcher=MAIN, target=KEY)
    packed = compress(path)

    listed = (await monitor.sessions.find()).entries  # listed as it was, titled from its head
    assert [(e.catalog_id, e.title, e.path) for e in listed] == [
        (e.catalog_id, e.title, e.path) for e in before
    ]
    for _ in range(5):  # well past the three misses
        assert await tick(kernel, roots) == [
            ("quiet", 0, f"compressed by the harness to {packed.name}; followed when the"
             " session is resumed"),
        ]  # fmt: skip
    links = wire.links(await monitor.links())
    assert (links[0]["missingStreak"], links[0]["status"]["outcome"]) == (0, "quiet")
    assert "compressed by the harness" in links[0]["status"]["reason"]
    assert await kernel.notices(watcher=MAIN) == []

    plain = resume(packed)
    with plain.open("ab") as f:
        f.write(typed("and now the credit notes"))
    assert [(o, t) for o, t, _ in await tick(kernel, roots)] == [("activity", 1)]
    assert [(o, t) for o, t, _ in await tick(kernel, roots)] == [("quiet", 0)]
    events = wire.status(await kernel.status(KEY, changes_since=0))["stateChanges"]["events"]
    assert [e["kind"] for e in events] == ["adopted", "human_direct_message"]
    assert [notice(KEY, 1)] == [n.text for n in await kernel.notices(watcher=MAIN)]


async def test_a_compressed_rollout_can_be_adopted_and_replayed(
    kernel: Kernel, roots: RootsConfig
) -> None:
    packed = compress(rollout(roots))
    monitor = UpstreamMonitor.from_config(kernel, Config(roots=roots))
    (entry,) = (await monitor.sessions.find()).entries
    assert entry.title == "fix the flaky invoice test"
    adopted = wire.adopted(
        await monitor.adoption.adopt(
            kind="codex", path=str(packed), session_key=KEY, session_id="s1"
        )
    )
    plain = packed.with_name(packed.name.removesuffix(".zst"))
    assert adopted["link"]["ref"]["filePath"] == str(plain)
    assert adopted["link"]["marker"]["offset"] == len(
        zstandard.ZstdDecompressor().stream_reader(packed.read_bytes()).read()
    )
    adapter = monitor.adapters["codex"]
    summary = list(adapter.replay(str(packed), None, []))[-1]
    assert summary["humanTurns"] == 1
    await kernel.watch(watcher=MAIN, target=KEY)
    resumed = resume(packed)
    with resumed.open("ab") as f:
        f.write(typed("one more"))
    assert [(o, t) for o, t, _ in await tick(kernel, roots)] == [("activity", 1)]


async def test_an_archived_rollout_is_reported_and_a_deleted_one_is_missing(
    kernel: Kernel, roots: RootsConfig
) -> None:
    path = rollout(roots)
    monitor = UpstreamMonitor.from_config(kernel, Config(roots=roots))
    await monitor.adoption.adopt(kind="codex", path=str(path), session_key=KEY, session_id="s1")
    await kernel.watch(watcher=MAIN, target=KEY)
    archive = Path(roots.codex).parent / "archived_sessions"
    archive.mkdir()
    os.rename(path, archive / path.name)  # what `codex archive` does
    for _ in range(4):
        (outcome,) = await tick(kernel, roots)
        assert outcome[:2] == ("quiet", 0)
        assert outcome[2] is not None and "archived by Codex" in outcome[2]
    os.rename(archive / path.name, path)  # unarchived: the same file again
    with path.open("ab") as f:
        f.write(typed("back at it"))
    assert [(o, t) for o, t, _ in await tick(kernel, roots)] == [("activity", 1)]
    path.unlink()  # a real deletion
    seen = [(await tick(kernel, roots))[0][0] for _ in range(3)]
    assert seen == ["missing"] * 3
    assert await monitor.links() == []
