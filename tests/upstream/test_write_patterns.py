"""Each prompt is recorded once whatever writes the transcript: appends, a save by rename,
a rewrite in place in chunks (checked mid-rewrite), a cut back to nothing and a regrow,
interleaved with the checks of two checkers (``serve``'s and a ``sessionwatch tick``'s,
each with its own memory) as hypothesis chooses. Counted: each prompt that was in the file
when a check read it, or at the end (one cut away before any check was never seen)."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor.config import Config, RootsConfig
from monitor.kernel import Kernel
from monitor.upstream import UpstreamMonitor
from tests.helpers import T0, ManualClock

KEY = "agent:main:adopted:x"
MAIN = "agent:main:main"


class Transcript:
    """A Claude Code transcript and the prompts typed into it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.typed = 0
        self.before = True  # not adopted yet
        self.content = b""
        self.seen: set[bytes] = set()  # the prompts in the file when a check read it

    def look(self) -> None:
        data = self.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written is not read
        self.seen |= set(re.findall(rb'"uuid": "(u[0-9]+)"', complete))

    def _prompt(self) -> bytes:
        self.typed += 1
        # a second apart: the history before the adoption (at the test clock's T0), the rest
        # after it
        at = datetime.fromtimestamp(T0 // 1000 - 100 * self.before + self.typed, UTC).isoformat()
        record = {
            "type": "user",
            "uuid": f"u{self.typed}",
            "timestamp": at,
            "message": {"role": "user", "content": f"prompt {self.typed}"},
        }
        reply = {
            "type": "assistant",
            "timestamp": at,
            "message": {"role": "assistant", "content": "on it"},
        }
        return json.dumps(record).encode() + b"\n" + json.dumps(reply).encode() + b"\n"

    def append(self, n: int) -> None:
        new = b"".join(self._prompt() for _ in range(n))
        self.content += new
        with self.path.open("ab") as f:
            f.write(new)

    def rename(self, n: int) -> None:
        """Saved whole to a new file that takes the name (the history, then ``n`` prompts)."""
        self.content += b"".join(self._prompt() for _ in range(n))
        fresh = self.path.with_suffix(".new")
        fresh.write_bytes(self.content)
        fresh.replace(self.path)

    def cut_and_regrow(self, n: int) -> None:
        """Cut back to nothing, then ``n`` new prompts: the old history is gone. (Never to
        the very same size: an idle check is a stat, size and inode, so a file rewritten to
        its old size is seen at its next write, not before.)"""
        old = len(self.content)
        self.content = b"".join(self._prompt() for _ in range(n))
        if len(self.content) == old:
            self.content += b'{"type":"summary","summary":"x"}\n'
        self.path.write_bytes(b"")
        self.path.write_bytes(self.content)

    def rewrite_chunks(self, n: int, cuts: list[tuple[int, bool]]) -> list[int]:
        """The same file written again in place, with ``n`` prompts more at its end, in
        chunks ending at the fractions ``cuts`` (per mille) of its length, moved on to the
        next line's end when told (a writer that writes whole lines): the ends."""
        self.content += b"".join(self._prompt() for _ in range(n))
        size = len(self.content)
        ends = set()
        for at, whole in cuts:
            end = max(1, size * at // 1000)
            line_end = self.content.find(b"\n", end - 1) + 1 or size
            ends.add(line_end if whole else min(end, size))
        return sorted(ends | {size})

    def write_upto(self, end: int, start: int) -> None:
        with self.path.open("r+b" if start else "wb") as f:
            if not start:
                f.truncate(0)
            f.seek(start)
            f.write(self.content[start:end])


WRITES = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 3)),
    st.tuples(st.just("rename"), st.integers(0, 2)),
    st.tuples(st.just("cut"), st.integers(0, 2)),
    st.tuples(
        st.just("rewrite"),
        st.integers(0, 2),
        st.lists(
            st.tuples(st.integers(1, 999), st.integers(0, 2), st.booleans()),
            min_size=1,
            max_size=6,
        ),
    ),
    st.tuples(st.just("check"), st.integers(0, 1)),
)


async def run(tmp: Path, steps: list[Any]) -> tuple[int, int]:
    roots = RootsConfig(claude=str(tmp / "claude"))
    Path(roots.claude).mkdir(parents=True)
    kernel = await Kernel.open(tmp / "state.db", clock=ManualClock())
    try:
        t = Transcript(Path(roots.claude) / "s.jsonl")
        t.append(2)  # history before adoption: not counted
        t.before = False
        history = set(re.findall(rb'"uuid": "(u[0-9]+)"', t.content))
        config = Config(roots=roots)
        checkers = [UpstreamMonitor.from_config(kernel, config) for _ in range(2)]
        await checkers[0].adoption.adopt(
            kind="claude", path=str(t.path), session_key=KEY, session_id="s1"
        )
        assert await kernel.watch(watcher=MAIN, target=KEY)
        await checkers[
            0
        ].ticker.tick()  # serve's first check: the file's fingerprints in the marker
        for step in steps:
            what = step[0]
            if what == "append":
                t.append(step[1])
            elif what == "rename":
                t.rename(step[1])
            elif what == "cut":
                t.cut_and_regrow(step[1])
            elif what == "check":
                t.look()
                await checkers[step[1]].ticker.tick()
            else:  # a rewrite in place, a check by either checker (2: none) after each chunk
                ends = t.rewrite_chunks(step[1], [(c, whole) for c, _, whole in step[2]])
                who = [w for _, w, _ in step[2]] + [2] * len(ends)
                start = 0
                for end, checker in zip(ends, who, strict=False):
                    t.write_upto(end, start)
                    start = end
                    if checker < 2:
                        t.look()
                        await checkers[checker].ticker.tick()
        t.look()
        for checker in checkers:
            await checker.ticker.tick()
            await checker.ticker.tick()
        status = await kernel.status(KEY, changes_since=0)
        assert status.state_changes is not None
        recorded = sum(
            int((e.payload or {}).get("turns", 1))
            for e in status.state_changes.events
            if e.kind == "human_direct_message"
        )
        return len(t.seen - history), recorded
    finally:
        await kernel.close()


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(WRITES, min_size=1, max_size=12))
def test_any_write_pattern_checked_by_two_checkers_records_each_prompt_once(
    tmp_path_factory: Any, steps: list[Any]
) -> None:
    tmp = tmp_path_factory.mktemp("writes")
    typed, recorded = asyncio.run(run(tmp, steps))
    assert typed == recorded, steps


def test_a_rewrite_in_place_checked_mid_way_counts_no_old_prompt_again(tmp_path: Path) -> None:
    """The case seen from outside: 30 prompts, then the file cut back and written again in
    ten chunks of whole lines, a check after each, by one checker then the other: nothing
    new, nothing counted; then one prompt more, counted once."""
    cuts = [(c, i % 2, True) for i, c in enumerate(range(100, 1000, 100))]
    steps: list[Any] = [("append", 3)] * 10 + [("check", 0), ("rewrite", 0, cuts), ("append", 1)]
    assert (31, 31) == asyncio.run(run(tmp_path, steps))
