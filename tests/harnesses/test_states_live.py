"""What each real harness's session is doing, read live: Claude Code, Codex, OpenCode and Pi
driven through their own front ends against the mock model (as the captures were,
tests/harnesses/capture_states.py), adopted by a sidecar whose checks run between the
scenes. Each check right after a record was written shows what it says (the tick after
the record: within one interval), a check with nothing new changes nothing, and a turn
whose answer hangs reads ``working`` until it is interrupted, then ``waiting``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harnesses.capture_states import QUESTION, Scenes, answer, front
from tests.harnesses.drivers import ClaudeTui, why_no_tmux
from tests.harnesses.harnesses import KINDS, Harness, Sidecar, why_not_runnable
from tests.interop import skip_unless_runnable
from tests.interop.gateway_rig import MockModelProcess, wait_for

HANG_S = 60.0


def doing(sw: Sidecar, key: str) -> dict[str, Any]:
    """One check, as a process of its own runs it, then what ``links`` says of ``key``."""
    sw("tick")
    (link,) = [x for x in sw("links")["links"] if x["sessionKey"] == key]
    return dict(link["doing"])


@pytest.mark.parametrize("kind", KINDS)
def test_each_scene_reads_live_as_the_harness_wrote_it(
    kind: str, model: MockModelProcess, tmp_path: Path
) -> None:
    skip_unless_runnable(why_not_runnable(kind))
    scenes = Scenes(kind, tmp_path / kind, model)
    driven = front(scenes.harness)
    sw = Sidecar(tmp_path, scenes.harness)
    key = f"agent:main:live:{kind}"
    try:
        driven.prompt("a plain prompt")  # the session exists once it has a turn
        sw.adopt(kind, key)
        assert "unknown" == doing(sw, key)["state"]  # nothing read since adoption
        scenes.tool(driven.prompt)
        ended = doing(sw, key)
        assert "waiting" == ended["state"], ended
        assert ended == doing(sw, key)  # nothing new: nothing moves

        before = len(model.requests())
        model.script(delay_s=HANG_S)
        try:
            driven.start("a prompt whose answer hangs")
            wait_for("the model asked", lambda: len(model.requests()) > before, 60)
            working = doing(sw, key)
            assert "working" == working["state"], working  # the prompt is written
            assert working["since"] >= ended["since"]
            driven.interrupt()
        finally:
            model.script(delay_s=0)
        interrupted = doing(sw, key)
        assert "waiting" == interrupted["state"], interrupted
        assert interrupted["since"] >= working["since"]
    finally:
        driven.close()


def test_a_question_claude_code_asks_reads_asking_until_answered(
    model: MockModelProcess, tmp_path: Path
) -> None:
    """Claude Code's own TUI (in tmux) asks a person which file to read and waits: the
    check after the question was written reads ``asking``; once a person answers and the
    turn ends, ``waiting``."""
    skip_unless_runnable(why_not_runnable("claude") or why_no_tmux())
    harness = Harness("claude", tmp_path / "claude", model)
    tui = ClaudeTui(harness)
    sw = Sidecar(tmp_path, harness)
    key = "agent:main:live:asks"
    try:
        tui.type("a plain prompt")
        tui.idle()
        sw.adopt("claude", key)
        model.script(tool={"when": "ask me", "name": "AskUserQuestion", "input": QUESTION})
        try:
            tui.type("please ask me which file to read")
            wait_for("the question on screen", lambda: "1. README.md" in tui.screen(), 60)
        finally:
            model.script(tool=None)
        asked = doing(sw, key)
        assert "asking" == asked["state"], asked
        assert asked == doing(sw, key)  # still waiting on the person: nothing moves
        answer(tui)  # the first answer
        tui.idle()
        wait_for("the turn's end", lambda: doing(sw, key)["state"] == "waiting", 60)
    finally:
        tui.close()
