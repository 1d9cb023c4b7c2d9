"""What a person does beyond typing one prompt at a time, driven through the harnesses' own
programmatic front ends (``tests/harnesses/drivers.py``) against the mock model, and ticked
through the real monitor at each step: a prompt queued while the model answers, an
interrupted turn, a native compaction, a fork. Every count is exact.

What cannot be driven, and why, is in docs/formats.md ("Versions tested").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harnesses.drivers import (
    ClaudeStream,
    ClaudeTui,
    CodexAppServer,
    OpenCodeServer,
    PiRpc,
    text_input,
    why_no_tmux,
)
from tests.harnesses.harnesses import Harness, Sidecar, replay_summary, why_not_runnable
from tests.interop import skip_unless_runnable
from tests.interop.gateway_rig import MockModelProcess, wait_for

SLOW_S = 3.0  # a reply slow enough to queue a prompt behind it
HANGING_S = 60.0  # a reply that is interrupted before it comes


@pytest.fixture
def model(tmp_path: Path) -> Iterator[MockModelProcess]:
    """A mock of this test's own: the scenarios script its delays."""
    (tmp_path / "model").mkdir()
    mock = MockModelProcess(tmp_path / "model")
    yield mock
    mock.stop()


class SlowModel:
    """Within it, the mock answers after ``delay_s`` (a reply slow enough to queue a prompt
    behind it, or one interrupted before it comes); back to at once on leaving."""

    def __init__(self, model: MockModelProcess, delay_s: float) -> None:
        self.model = model
        model.script(delay_s=delay_s)
        self.before = len(model.requests())

    def asked(self, n: int = 1) -> None:
        """Wait until the harness has asked the mock ``n`` times since: it is answering."""
        wait_for("the model to be asked", lambda: len(self.model.requests()) >= self.before + n, 60)

    def __enter__(self) -> SlowModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.model.script(delay_s=0)


def test_pi_queued_interrupted_compacted_and_forked(
    model: MockModelProcess, tmp_path: Path
) -> None:
    """``pi --mode rpc``: a ``steer`` and a ``follow_up`` sent while the model answers are
    turns of their own; an ``abort``ed prompt was still typed, so it counts; ``compact``
    is one ``compacted`` event and no turn; a ``fork`` writes a new session file that the
    adopted parent never sees, and the fork adopted in turn counts only its own prompts."""
    skip_unless_runnable(why_not_runnable("pi"))
    harness = Harness("pi", tmp_path / "pi", model)
    settings = harness.home / ".pi" / "agent" / "settings.json"
    settings.write_text('{"compaction": {"keepRecentTokens": 1}}')  # so a short one compacts
    sw = Sidecar(tmp_path, harness)
    key = "agent:main:harness:pi-rpc"
    pi = PiRpc(harness)
    try:
        pi.prompt("first prompt")
        parent = sw.adopt("pi", key)

        with SlowModel(model, SLOW_S) as slow:
            since = pi.mark()
            pi.command("prompt", message="second prompt")
            slow.asked()
            pi.command("steer", message="steered while it answers")
            pi.command("follow_up", message="and a follow-up queued behind it")
            pi.wait("the turn's end", lambda m: m.get("type") == "agent_end", since)
            pi.idle()
        sw.ticked_to(key, 3)

        with SlowModel(model, HANGING_S) as slow:
            since = pi.mark()
            pi.command("prompt", message="a prompt the person interrupts")
            slow.asked()
            pi.command("abort")
            pi.wait("the aborted turn's end", lambda m: m.get("type") == "agent_end", since)
        sw.ticked_to(key, 4)

        pi.command("compact")
        sw.ticked_to(key, 1, "compacted")
        assert 4 == sw.human_turns(key)

        forks = pi.command("get_fork_messages")["data"]["messages"]
        second = next(m for m in forks if m["text"] == "second prompt")
        pi.command("fork", entryId=second["entryId"])
        state = pi.command("get_state")["data"]
        pi.prompt("the fork's first prompt")
        fork_key = "agent:main:harness:pi-fork"
        sw.adopt("pi", fork_key, native_id=state["sessionId"])
        pi.prompt("the fork's second prompt")
        sw.ticked_to(fork_key, 1)
        assert 4 == sw.human_turns(key)
    finally:
        pi.close()
    summary = replay_summary(sw, harness, parent)
    assert (5, 1) == (summary["humanTurns"], summary["compactions"]), summary
    assert ({}, 0) == (
        summary["drift"]["unknownTypes"],
        summary["drift"]["unclassifiedUserRecords"],
    )


def test_codex_queued_interrupted_compacted_and_forked(
    model: MockModelProcess, tmp_path: Path
) -> None:
    """``codex app-server``: a ``turn/steer`` sent while the model answers is a turn of its
    own; a ``turn/interrupt``ed prompt was still typed, so it counts, and the
    ``<turn_aborted>`` note Codex writes is not; ``thread/compact/start`` is one
    ``compacted`` event and no turn; a sub-agent the model starts with ``spawn_agent``
    writes a rollout of its own (never in the catalog), and neither its prompt nor the
    ``<subagent_notification>`` written back is a turn; ``thread/fork`` starts a rollout of
    its own that the adopted parent never sees."""
    skip_unless_runnable(why_not_runnable("codex"))
    harness = Harness("codex", tmp_path / "codex", model)
    sw = Sidecar(tmp_path, harness)
    key = "agent:main:harness:codex-app-server"
    codex = CodexAppServer(harness)
    try:
        codex.turn("first prompt")
        parent = sw.adopt("codex", key)

        with SlowModel(model, SLOW_S) as slow:
            turn, since = codex.start_turn("second prompt")
            slow.asked()
            codex.call(
                "turn/steer",
                threadId=codex.thread,
                expectedTurnId=turn,
                input=text_input("steered while it answers"),
            )
            assert "completed" == codex.completed(since)
        sw.ticked_to(key, 2)

        with SlowModel(model, HANGING_S) as slow:
            turn, since = codex.start_turn("a prompt the person interrupts")
            slow.asked()
            codex.call("turn/interrupt", threadId=codex.thread, turnId=turn)
            assert "interrupted" == codex.completed(since)
        sw.ticked_to(key, 3)

        since = codex.mark()
        codex.call("thread/compact/start", threadId=codex.thread)
        codex.completed(since)
        sw.ticked_to(key, 1, "compacted")
        assert 3 == sw.human_turns(key)

        spawn = {"message": "look at the billing tests"}
        model.script(
            tool={
                "when": "delegate",
                "name": "spawn_agent",
                "namespace": "multi_agent_v1",
                "input": spawn,
            }
        )
        codex.turn("please delegate the billing check")
        rollout = Path(parent["path"])
        wait_for(
            "the sub-agent's notification in the parent",
            lambda: b"<subagent_notification>" in rollout.read_bytes(),
            60,
        )
        model.script(tool=None)
        sw.ticked_to(key, 4)
        sessions = sw("catalog", "--kind", "codex", "--json")["sessions"]
        assert [parent["nativeId"]] == [s["nativeId"] for s in sessions]

        fork = str(codex.call("thread/fork", threadId=codex.thread)["thread"]["id"])
        codex.turn("the fork's first prompt", thread=fork)
        fork_key = "agent:main:harness:codex-fork"
        sw.adopt("codex", fork_key, native_id=fork)
        codex.turn("the fork's second prompt", thread=fork)
        sw.ticked_to(fork_key, 1)
        assert 4 == sw.human_turns(key)
    finally:
        codex.close()
    summary = replay_summary(sw, harness, parent)
    assert (5, 1) == (summary["humanTurns"], summary["compactions"]), summary
    assert ({}, 0) == (
        summary["drift"]["unknownTypes"],
        summary["drift"]["unclassifiedUserRecords"],
    )


def test_claude_code_queued_interrupted_and_a_sub_agent(
    model: MockModelProcess, tmp_path: Path
) -> None:
    """``claude -p --input-format stream-json``: a prompt sent while the model answers is
    queued and then a turn of its own; an interrupted prompt was still typed, so it counts,
    and the ``[Request interrupted by user]`` row Claude writes is not a turn; a sub-agent
    the model starts with the ``Agent`` tool writes its own transcript (never in the
    catalog), and neither its prompt nor the ``<task-notification>`` Claude writes back into
    the session is a turn."""
    skip_unless_runnable(why_not_runnable("claude"))
    harness = Harness("claude", tmp_path / "claude", model)
    sw = Sidecar(tmp_path, harness)
    key = "agent:main:harness:claude-stream"
    claude = ClaudeStream(harness)
    try:
        claude.prompt("first prompt")
        parent = sw.adopt("claude", key)

        with SlowModel(model, SLOW_S) as slow:
            since = claude.type("second prompt")
            slow.asked()
            claude.type("queued while it answers")
            claude.finished(since, 2)
        sw.ticked_to(key, 2)

        with SlowModel(model, HANGING_S) as slow:
            since = claude.type("a prompt the person interrupts")
            slow.asked()
            claude.interrupt()
            claude.finished(since)
        sw.ticked_to(key, 3)

        task = {"description": "check the tests", "prompt": "look at the billing tests"}
        model.script(
            tool={
                "when": "delegate",
                "name": "Agent",
                "input": {**task, "subagent_type": "general-purpose"},
            }
        )
        claude.prompt("please delegate the billing check")
        transcript = Path(parent["path"])
        wait_for(
            "the sub-agent's report in the session",
            lambda: b"<task-notification>" in transcript.read_bytes(),
            60,
        )
        model.script(tool=None)
        sw.ticked_to(key, 4)
        assert [] != list(transcript.with_suffix("").glob("subagents/agent-*.jsonl"))
        sessions = sw("catalog", "--kind", "claude", "--json")["sessions"]
        assert [parent["nativeId"]] == [s["nativeId"] for s in sessions]
    finally:
        claude.close()
    summary = replay_summary(sw, harness, parent)
    assert 5 == summary["humanTurns"], summary
    assert ({}, 0) == (
        summary["drift"]["unknownTypes"],
        summary["drift"]["unclassifiedUserRecords"],
    )


def test_opencode_queued_interrupted_compacted_sub_agent_and_forked(
    model: MockModelProcess, tmp_path: Path
) -> None:
    """``opencode serve``: a prompt sent while the model answers is queued and then a turn
    of its own; an aborted prompt was still typed, so it counts; ``summarize`` is one
    ``compacted`` event, and its ``compaction`` message is no turn; a ``task`` sub-agent
    is a child session, never in the catalog, and its prompt is not the parent's turn; a
    fork is a session of its own, which copies the parent's messages and counts only what
    is typed into it after its adoption."""
    skip_unless_runnable(why_not_runnable("opencode"))
    harness = Harness("opencode", tmp_path / "opencode", model)
    sw = Sidecar(tmp_path, harness)
    key = "agent:main:harness:opencode-serve"
    server = OpenCodeServer(harness)
    try:
        server.message("first prompt")
        parent = sw.adopt("opencode", key, native_id=server.session)

        with SlowModel(model, SLOW_S) as slow:
            server.message("second prompt", wait=False)
            slow.asked()
            server.message("queued while it answers", wait=False)
            slow.asked(2)
            server.idle()
        sw.ticked_to(key, 2)

        with SlowModel(model, HANGING_S) as slow:
            server.message("a prompt the person interrupts", wait=False)
            slow.asked()
            server.post(f"/session/{server.session}/abort")
            server.idle()
        sw.ticked_to(key, 3)

        server.post(f"/session/{server.session}/summarize", dict(server.MODEL))
        sw.ticked_to(key, 1, "compacted")
        assert 3 == sw.human_turns(key)

        task = {"description": "check the tests", "prompt": "look at the billing tests"}
        model.script(
            tool={"when": "delegate", "name": "task", "input": {**task, "subagent_type": "general"}}
        )
        server.message("please delegate the billing check")
        model.script(tool=None)
        sw.ticked_to(key, 4)
        sessions = sw("catalog", "--kind", "opencode", "--json")["sessions"]
        assert [server.session] == [s["nativeId"] for s in sessions]

        fork = str(server.post(f"/session/{server.session}/fork")["id"])
        server.message("the fork's first prompt", session=fork)
        fork_key = "agent:main:harness:opencode-fork"
        sw.adopt("opencode", fork_key, native_id=fork)
        server.message("the fork's second prompt", session=fork)
        sw.ticked_to(fork_key, 1)
        assert 4 == sw.human_turns(key)
    finally:
        server.close()
    summary = replay_summary(sw, harness, parent)
    assert (5, 1) == (summary["humanTurns"], summary["compactions"]), summary
    assert ({}, 0) == (
        summary["drift"]["unknownTypes"],
        summary["drift"]["unclassifiedUserRecords"],
    )


def test_claude_code_interactive_tui_queued_and_interrupted(
    model: MockModelProcess, tmp_path: Path
) -> None:
    """The interactive TUI under tmux, typed into as a person does: a prompt typed while
    the model answers is queued by the TUI (``Queued``, a ``queue-operation``) and is a turn
    of its own once sent; a prompt interrupted with Escape was still typed, so it counts."""
    skip_unless_runnable(why_not_runnable("claude") or why_no_tmux())
    harness = Harness("claude", tmp_path / "claude", model)
    sw = Sidecar(tmp_path, harness)
    key = "agent:main:harness:claude-tui"
    tui = ClaudeTui(harness)
    try:
        before = len(model.requests())
        tui.type("first prompt")
        wait_for("the first answer", lambda: len(model.requests()) > before, 60)
        tui.idle()
        parent = sw.adopt("claude", key)

        with SlowModel(model, SLOW_S) as slow:
            tui.type("second prompt")
            slow.asked()
            tui.type("queued while it answers")
            slow.asked(2)
            tui.idle()
        sw.ticked_to(key, 2)

        with SlowModel(model, HANGING_S) as slow:
            tui.type("a prompt the person interrupts")
            slow.asked()
            tui.interrupt()
        sw.ticked_to(key, 3)
    finally:
        tui.close()
    summary = replay_summary(sw, harness, parent)
    assert 4 == summary["humanTurns"], summary
    assert ({}, 0) == (
        summary["drift"]["unknownTypes"],
        summary["drift"]["unclassifiedUserRecords"],
    )
    assert b"queue-operation" in Path(parent["path"]).read_bytes()
