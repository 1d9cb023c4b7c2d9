"""Reading on every core: a list split across forked children gives what one process gives,
each item once, whatever a child does (dies, hangs), and a catalog read that way is the
catalog read in one process."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

import adapters.jsonl_catalog as jsonl_catalog
from adapters import forked
from adapters.claude import FORMAT as CLAUDE
from adapters.codex import FORMAT as CODEX


@dataclass
class Seen:
    """Which process read which item."""

    items: list[tuple[int, int]] = field(default_factory=list)

    def extend(self, other: Seen) -> None:
        self.items += other.items


def test_a_split_reads_every_item_once_across_processes() -> None:
    items = list(range(1000))
    found = forked.split(lambda part: Seen([(i, os.getpid()) for i in part]), items, 3)
    assert sorted(i for i, _ in found.items) == items
    assert len({pid for _, pid in found.items}) == 3  # this process and two children
    assert os.getpid() in {pid for _, pid in found.items}


def test_a_child_that_dies_has_its_part_read_here() -> None:
    here = os.getpid()

    def work(part: list[int]) -> Seen:
        if os.getpid() != here:
            os._exit(3)  # a child killed mid-way: nothing sent
        return Seen([(i, os.getpid()) for i in part])

    found = forked.split(work, list(range(100)), 2)
    assert sorted(i for i, _ in found.items) == list(range(100))
    assert {pid for _, pid in found.items} == {here}


def test_a_child_that_sends_part_of_its_answer_has_its_part_read_here() -> None:
    here = os.getpid()

    def work(part: list[int]) -> Seen:
        if os.getpid() != here:
            raise ValueError("fails in the child only")
        return Seen([(i, os.getpid()) for i in part])

    found = forked.split(work, list(range(100)), 2)
    assert sorted(i for i, _ in found.items) == list(range(100))


def test_a_child_that_hangs_is_killed_and_its_part_read_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    here = os.getpid()
    monkeypatch.setattr(forked, "PATIENCE_S", 0.5)

    def work(part: list[int]) -> Seen:
        while os.getpid() != here:
            time.sleep(60)  # a child stuck (a lock another thread held at the fork)
        return Seen([(i, os.getpid()) for i in part])

    found = forked.split(work, list(range(10)), 2)
    assert sorted(i for i, _ in found.items) == list(range(10))


def test_one_way_or_one_item_forks_nothing() -> None:
    here = os.getpid()
    for items, ways in (([1, 2, 3], 1), ([1], 4), ([], 4)):
        found = forked.split(lambda part: Seen([(i, os.getpid()) for i in part]), items, ways)
        assert sorted(i for i, _ in found.items) == items
        assert {pid for _, pid in found.items} <= {here}


def _sessions(root: Path) -> tuple[Path, Path]:
    claude, codex = root / "claude", root / "codex"
    for i in range(60):
        project = claude / f"p{i % 4}"
        project.mkdir(parents=True, exist_ok=True)
        prompt = {"role": "user", "content": f"prompt {i}"}
        first = {"type": "user", "uuid": f"u{i}", "cwd": f"/w/{i}", "message": prompt}
        title = {"type": "custom-title", "customTitle": f"title {i}"}
        lines = [first, title] if i % 2 else [first]
        (project / f"s{i}.jsonl").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
        os.utime(project / f"s{i}.jsonl", (1_700_000_000 + i, 1_700_000_000 + i))
    (claude / "p0" / "broken.jsonl").write_bytes(b"not json\n")
    (claude / "p1" / "s1" / "subagents").mkdir(parents=True)
    (claude / "p1" / "s1" / "subagents" / "agent-1.jsonl").write_bytes(b"{}\n")
    day = codex / "2026" / "03" / "01"
    day.mkdir(parents=True)
    for i in range(30):
        meta = {"type": "session_meta", "payload": {"id": f"t{i}", "cwd": "/w", "source": "cli"}}
        prompt = {"type": "event_msg", "payload": {"type": "user_message", "message": f"do {i}"}}
        body = orjson.dumps(meta) + b"\n" + orjson.dumps(prompt) + b"\n"
        (day / f"rollout-2026-03-01T10-00-00-t{i}.jsonl").write_bytes(body)
    return claude, codex


def test_a_catalog_read_on_every_core_is_the_one_read_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    claude, codex = _sessions(tmp_path)
    read = {}
    for fmt, root in ((CLAUDE, claude), (CODEX, codex)):
        here = jsonl_catalog.scan_files(fmt, str(root))
        monkeypatch.setattr(jsonl_catalog, "PARALLEL_FILES", 1)
        monkeypatch.setattr(forked, "cores", lambda: 3)
        spread = jsonl_catalog.scan_files(fmt, str(root))
        monkeypatch.undo()
        assert here == spread
        read[fmt.kind] = here
    claude_read = read["claude"]
    assert (60, 1, 1) == (len(claude_read.entries), claude_read.skipped, len(claude_read.errors))
    assert "title 59" == read["claude"].entries[0].title  # newest first
    assert 30 == len(read["codex"].entries)


def test_a_catalog_never_opens_a_fifo_its_directory_entry_or_link_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file's directory entry saves the ``stat`` before its open; a FIFO is still refused
    unopened (opening it would release a writer waiting for a reader), named directly or
    through a link."""
    claude, _ = _sessions(tmp_path)
    os.mkfifo(claude / "p0" / "pipe.jsonl")
    (claude / "p1" / "to-pipe.jsonl").symlink_to(claude / "p0" / "pipe.jsonl")
    (claude / "p2" / "to-file.jsonl").symlink_to(claude / "p3" / "s3.jsonl")
    opened: list[str] = []
    real_open = os.open

    def open_(path: str, *args: int, **kwargs: int) -> int:
        opened.append(os.path.basename(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    found = jsonl_catalog.scan_files(CLAUDE, str(claude))
    monkeypatch.undo()
    assert "s3.jsonl" in opened and "to-file.jsonl" in opened
    assert "pipe.jsonl" not in opened and "to-pipe.jsonl" not in opened
    refused = {Path(e["path"]).name: e["reason"] for e in found.errors}
    assert refused["pipe.jsonl"] == refused["to-pipe.jsonl"] == "not a regular file (a FIFO)"
    linked = [e for e in found.entries if e.path == str((claude / "p3" / "s3.jsonl").resolve())]
    assert 2 == len(linked)  # the file and the link to it, each an entry of the same file


def test_a_failure_here_leaves_no_child_behind() -> None:
    here = os.getpid()

    def work(part: list[int]) -> Seen:
        if os.getpid() == here:
            raise RuntimeError("a bug here")
        time.sleep(60)  # a child still at work
        return Seen()

    def children() -> set[str]:
        tasks = Path(f"/proc/{os.getpid()}/task").iterdir()
        return {pid for t in tasks for pid in (t / "children").read_text().split()}

    before = children()
    with pytest.raises(RuntimeError):
        forked.split(work, list(range(10)), 3)
    assert children() <= before  # killed and reaped: none left, not even a zombie
