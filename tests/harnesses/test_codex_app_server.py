"""The rollout reader of ``codex-app-server`` links against the real Codex app-server: at
every step of a thread's life (a prompt, a steer, a compaction, a revert, a fork, a branch
started as the gateway starts one), the turns read from the rollout are the turns
``thread/turns/list`` answers, with the same user-message counts, read whole by a fresh
reader and incrementally by one that followed the file since the start."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from adapters.codex_rollout import RolloutReader
from tests.harnesses.drivers import CodexAppServer, text_input
from tests.harnesses.harnesses import Harness, why_not_runnable
from tests.harnesses.test_scenarios import SLOW_S, SlowModel
from tests.interop import skip_unless_runnable
from tests.interop.gateway_rig import MockModelProcess

LAG_S = 10.0  # how long the listing may trail the rollout


class Compared:
    """The app-server's answer beside the reader's, for every thread, at every step."""

    def __init__(self, codex: CodexAppServer, home: Path) -> None:
        self.codex = codex
        self.home = home
        self.following = RolloutReader(str(home))
        self.steps = 0
        self.lag = 0.0  # the longest the listing trailed the rollout

    def same(self, thread: str) -> list[list[Any]]:
        """The reader's turns, as far as the app-server's projection has taken the rollout,
        are what it lists; once the projection caught up, they are the whole rollout's."""
        start = time.monotonic()
        while True:
            views = [self._read(reader, thread) for reader in self.readers()]
            listed = self.codex.turns_listed(thread)
            if all(gated == listed for gated, _ in views) or time.monotonic() - start > LAG_S:
                break  # else the projection moved between the two reads: read both again
        assert [gated for gated, _ in views] == [listed, listed]
        while views[0][1] != listed and time.monotonic() - start < LAG_S:
            time.sleep(0.05)
            listed = self.codex.turns_listed(thread)
        self.lag = max(self.lag, time.monotonic() - start)
        assert views[0][1] == views[1][1] == listed
        self.steps += 1
        return listed

    def readers(self) -> tuple[RolloutReader, RolloutReader]:
        return self.following, RolloutReader(str(self.home))

    @staticmethod
    def _read(reader: RolloutReader, thread: str) -> tuple[list[list[Any]], list[list[Any]]]:
        """What the listing shows now by the reader (gated by the projection), and the whole
        rollout's turns."""
        path = reader.find(thread)
        assert path is not None, thread
        files = reader.turns(path)
        gated = files.upto(reader.projected(path, thread) if files.paginated else None)
        shown = [[t.id, len(t.messages)] for t in gated[-100:][::-1]]
        return shown, _whole(path)


def _whole(path: str) -> list[list[Any]]:
    """The whole rollout's turns, by a reader of its own (sessions/YYYY/MM/DD/file)."""
    home = str(Path(path).parents[4])
    turns = RolloutReader(home).turns(path).upto(None)
    return [[t.id, len(t.messages)] for t in turns[-100:][::-1]]


def test_the_reader_follows_the_app_servers_turns(model: MockModelProcess, tmp_path: Path) -> None:
    skip_unless_runnable(why_not_runnable("codex"))
    harness = Harness("codex", tmp_path / "codex", model)
    codex = CodexAppServer(harness, experimental=True)
    seen = Compared(codex, harness.work / "codex-home")
    try:
        source = codex.thread
        codex.turn("first prompt")
        assert [1] == [n for _, n in seen.same(source)]
        with SlowModel(model, SLOW_S) as slow:
            turn, since = codex.start_turn("second prompt")
            slow.asked()
            codex.call("turn/steer", threadId=source, expectedTurnId=turn,
                       input=text_input("steered while it answers"))  # fmt: skip
            assert "completed" == codex.completed(since)
        assert [2, 1] == [n for _, n in seen.same(source)]
        since = codex.mark()
        codex.call("thread/compact/start", threadId=source)
        codex.completed(since)
        codex.turn("third prompt")
        listed = seen.same(source)
        assert [1, 0, 2, 1] == [n for _, n in listed]
        codex.call("thread/revert", threadId=source, beforeTurnId=listed[0][0])
        assert [0, 2, 1] == [n for _, n in seen.same(source)]
        codex.turn("after the revert")
        seen.same(source)
        fork = str(codex.call("thread/fork", threadId=source)["thread"]["id"])
        codex.turn("the fork's prompt", thread=fork)
        assert [1, 1, 0, 2, 1] == [n for _, n in seen.same(fork)]
        branch = str(
            codex.call("thread/start", cwd=str(harness.project), threadSource="openclaw")["thread"][
                "id"
            ]
        )
        history = [{"type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": "first prompt"}]}]  # fmt: skip
        codex.call("thread/inject_items", threadId=branch, items=history)
        codex.turn("typed into the branch", thread=branch)
        assert [1] == [n for _, n in seen.same(branch)]
        legacy = str(
            codex.call("thread/start", cwd=str(harness.project), historyMode="legacy")["thread"][
                "id"
            ]
        )
        codex.turn("a legacy prompt", thread=legacy)
        with SlowModel(model, SLOW_S) as slow:
            turn, since = codex.start_turn("a second legacy prompt", thread=legacy)
            slow.asked()
            codex.call("turn/steer", threadId=legacy, expectedTurnId=turn,
                       input=text_input("a legacy steer"))  # fmt: skip
            assert "completed" == codex.completed(since)
        assert [2, 1] == [n for _, n in seen.same(legacy)]
        assert seen.steps == 8
        print(f"the listing trailed the rollout by at most {seen.lag:.3f} s")
    finally:
        codex.close()
