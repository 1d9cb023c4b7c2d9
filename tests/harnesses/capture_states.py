"""Captures of what each real harness writes at a turn's boundaries, for deriving what a
session is doing now (working, waiting for a person) from its records alone.

Run: python -m tests.harnesses.capture_states [KIND ...] (a kind, claude-asks,
codex-approval, opencode-approval; all when none is named)

Each harness, offline against the mock model through its own programmatic front end
(``tests/harnesses/drivers.py``), is driven through three scenes, in one session:

- ``ends``: a prompt, a text answer, the turn ends;
- ``tool``: a prompt, the model calls a tool (one the harness runs unasked), its result,
  a text answer, the turn ends;
- ``interrupted``: a prompt whose answer hangs, interrupted as a person would (Esc).

And ``claude-asks``: Claude Code's own TUI, in tmux (``-p`` disables the tool that asks a
person), asks a question, is answered, then waits for a command's approval, left
unanswered (:func:`capture_asking`); ``codex-approval`` and ``opencode-approval``: Codex's
app-server and OpenCode's serve wait for a command's approval; all kept in
``tests/fixtures/states/asks/``.

What it wrote is kept in ``tests/fixtures/states/<kind>-<version>.jsonl``: the session's
records as written (OpenCode's: its ``message`` and ``part`` rows, each as
``{"table", "id", "data"}``, in the order written; its ``permission`` table holds the rules a
person saved, never a question waiting for an answer), and beside it a ``.json`` saying the
version and where each scene's records end (a line count). The records are kept whole but
for one thing: a string over :data:`LONGEST` characters is shortened (:func:`shortened`),
as those are the harness's own system prompt, tool descriptions and instructions (Claude
Code's are not ours to copy), which no rule of a turn's boundary reads.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from tests.harnesses.drivers import (
    ClaudeStream,
    ClaudeTui,
    CodexAppServer,
    OpenCodeServer,
    PiRpc,
)
from tests.harnesses.harnesses import KINDS, Harness, installed_version, why_not_runnable
from tests.helpers import REPO
from tests.interop.gateway_rig import MockModelProcess, wait_for

FIXTURES = REPO / "tests" / "fixtures" / "states"
LONGEST = 200
HANG_S = 60.0  # an answer that never comes before the interrupt
# a tool each harness runs without asking (a read of the project's own file)
TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "claude": ("Read", {"file_path": "README.md"}),
    "codex": ("exec_command", {"cmd": "cat README.md"}),
    "opencode": ("read", {"filePath": "README.md"}),
    "pi": ("read", {"path": "README.md"}),
}


def shortened(value: Any) -> Any:
    """``value`` with every string over :data:`LONGEST` characters cut to its first 40 and
    a note of its length."""
    if isinstance(value, str) and len(value) > LONGEST:
        return f"{value[:40]}[... {len(value)} characters]"
    if isinstance(value, list):
        return [shortened(v) for v in value]
    if isinstance(value, dict):
        return {k: shortened(v) for k, v in value.items()}
    return value


def kept(line: bytes) -> bytes:
    """A record as the fixture keeps it (a line that is not JSON, as it is)."""
    try:
        return json.dumps(
            shortened(json.loads(line)), ensure_ascii=False, separators=(",", ":")
        ).encode()
    except ValueError:
        return line


def records(harness: Harness) -> list[bytes]:
    """What the session wrote so far, a record a line."""
    _, root = harness.root()
    if harness.kind == "opencode":
        with sqlite3.connect(root) as conn:
            rows = conn.execute(
                "SELECT 'message', id, time_created, data FROM message UNION ALL"
                " SELECT 'part', id, time_created, data FROM part ORDER BY 3, 2"
            ).fetchall()
        return [
            json.dumps(
                {"table": table, "id": ident, "data": json.loads(data)}, separators=(",", ":")
            ).encode()
            for table, ident, _, data in rows
        ]
    (path,) = sorted(Path(root).rglob("*.jsonl"))
    return path.read_bytes().splitlines()


class Scenes:
    """One harness's session, driven scene by scene; ``ends`` says where each ended."""

    def __init__(self, kind: str, work: Path, model: MockModelProcess) -> None:
        self.harness = Harness(kind, work, model)
        (self.harness.project / "README.md").write_text("a project\n")
        self.model = model
        self.ends: dict[str, int] = {}

    def scene(self, name: str, act: Callable[[], object]) -> None:
        act()
        self.ends[name] = len(records(self.harness))

    def tool(self, prompt: Callable[[str], object]) -> None:
        name, given = TOOLS[self.harness.kind]
        self.model.script(tool={"when": "use the tool", "name": name, "input": given})
        try:
            prompt("please use the tool")
        finally:
            self.model.script(tool=None)

    def hanging(self, start: Callable[[], object], interrupt: Callable[[], object]) -> None:
        before = len(self.model.requests())
        self.model.script(delay_s=HANG_S)
        try:
            start()
            wait_for("the model asked", lambda: len(self.model.requests()) > before, 60)
            interrupt()
        finally:
            self.model.script(delay_s=0)


class Front(NamedTuple):
    """How a harness's front end is driven: a prompt to its turn's end; a prompt started
    (its answer hanging) and its interruption, to the turn's end; and the end of it."""

    prompt: Callable[[str], object]
    start: Callable[[str], object]
    interrupt: Callable[[], object]
    close: Callable[[], object]


def front(harness: Harness) -> Front:
    if harness.kind == "claude":
        claude, since = ClaudeStream(harness), [0]

        def typed(text: str) -> None:
            since[0] = claude.type(text)

        def interrupted() -> None:
            claude.interrupt()
            claude.finished(since[0])

        return Front(claude.prompt, typed, interrupted, claude.close)
    if harness.kind == "codex":
        codex, turn = CodexAppServer(harness), [("", 0)]

        def started(text: str) -> None:
            turn[0] = codex.start_turn(text)

        def stopped() -> None:
            codex.call("turn/interrupt", threadId=codex.thread, turnId=turn[0][0])
            codex.completed(turn[0][1])

        return Front(codex.turn, started, stopped, codex.close)
    if harness.kind == "opencode":
        server = OpenCodeServer(harness)

        def aborted() -> None:
            server.post(f"/session/{server.session}/abort")
            server.idle()

        return Front(
            server.message, lambda text: server.message(text, wait=False), aborted, server.close
        )
    pi, since = PiRpc(harness), [0]

    def start(text: str) -> None:
        since[0] = pi.mark()
        pi.command("prompt", message=text)

    def abort() -> None:
        pi.command("abort")
        pi.wait("the aborted end", lambda m: m.get("type") == "agent_end", since[0])

    return Front(pi.prompt, start, abort, pi.close)


def drive(scenes: Scenes) -> None:
    """The three scenes, through the harness's front end."""
    driven = front(scenes.harness)
    try:
        scenes.scene("ends", lambda: driven.prompt("a plain prompt"))
        scenes.scene("tool", lambda: scenes.tool(driven.prompt))
        scenes.scene(
            "interrupted",
            lambda: scenes.hanging(lambda: driven.start("a prompt interrupted"), driven.interrupt),
        )
    finally:
        driven.close()


def capture(kind: str) -> Path:
    with mock_model() as (work, model):
        scenes = Scenes(kind, work / kind, model)
        drive(scenes)
        written = records(scenes.harness)
    return keep(FIXTURES, kind, written, scenes.ends)


@contextlib.contextmanager
def mock_model() -> Iterator[tuple[Path, MockModelProcess]]:
    """A scratch directory and the mock model serving in it, for one capture (a harness may
    still write there as it closes: the directory's removal lets it)."""
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        (work / "model").mkdir()
        model = MockModelProcess(work / "model")
        try:
            yield work, model
        finally:
            model.stop()


def keep(folder: Path, kind: str, written: list[bytes], ends: dict[str, int]) -> Path:
    """A capture kept in ``folder``: its records (:func:`kept`), and beside them the
    version that wrote them and where each scene ends."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{kind}-{installed_version(kind)}"
    (folder / f"{name}.jsonl").write_bytes(b"".join(kept(line) + b"\n" for line in written))
    about = {"kind": kind, "version": installed_version(kind), "ends": ends}
    (folder / f"{name}.json").write_text(json.dumps(about, indent=1) + "\n")
    return folder / f"{name}.jsonl"


# A question the agent asks a person, through Claude Code's own TUI (``-p`` disables the
# tool): AskUserQuestion, the harness's tool for it.
QUESTION = {
    "questions": [
        {
            "question": "Which file should I read?",
            "header": "File",
            "multiSelect": False,
            "options": [
                {"label": "README.md", "description": "the project's readme"},
                {"label": "NOTES.md", "description": "the notes"},
            ],
        }
    ]
}
ASKS = FIXTURES / "asks"
COMMAND = {"command": "touch made-by-the-agent.txt", "description": "make a file"}


def capture_asking() -> Path:
    """Claude Code's TUI, its permission mode ``default``: ``asks``, where the records end
    while a question it asked waits on screen; ``answered``, once a person picked an answer
    and the turn ended; ``approval``, while a command it wants to run waits on screen for a
    person's approval, left unanswered (no record says so: the tool call reads working).
    Kept in ``tests/fixtures/states/asks/``."""
    with mock_model() as (work, model):
        harness = Harness("claude", work / "claude", model)
        settings = harness.home / ".claude" / "settings.json"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps({"permissions": {"defaultMode": "default"}}))
        tui = ClaudeTui(harness)
        ends: dict[str, int] = {}
        try:
            model.script(tool={"when": "ask me", "name": "AskUserQuestion", "input": QUESTION})
            tui.type("please ask me which file to read")
            wait_for("claude: the question", lambda: "1. README.md" in tui.screen(), 60)
            wait_for("the question written", lambda: _asked(records(harness)), 60)
            ends["asks"] = len(records(harness))
            model.script(tool=None)
            answer(tui)
            answered = lambda: b'"end_turn"' in b"".join(records(harness)[ends["asks"] :])  # noqa: E731
            try:
                wait_for("the turn's end", answered, 60)
            except AssertionError:
                print(tui.screen(), file=sys.stderr)
                raise
            ends["answered"] = len(records(harness))
            model.script(tool={"when": "run it", "name": "Bash", "input": COMMAND})
            tui.type("please run it")
            wait_for("the approval asked", lambda: "Do you want to proceed" in tui.screen(), 60)
            model.script(tool=None)
            wait_for("the call written", lambda: b'"Bash"' in records(harness)[-1], 60)
            ends["approval"] = len(records(harness))
        finally:
            tui.close()
        written = records(harness)
    return keep(ASKS, "claude", written, ends)


def capture_opencode_approval() -> Path:
    """OpenCode's serve, ``bash`` set to ask: a command waits for a person's approval (the
    server lists it, ``GET /permission``), left unanswered: ``approval``, where the rows
    end then. Kept in ``tests/fixtures/states/asks/``."""
    with mock_model() as (work, model):
        harness = Harness("opencode", work / "opencode", model)
        config = json.loads((harness.work / "opencode.json").read_text())
        (harness.work / "opencode.json").write_text(
            json.dumps({**config, "permission": {"bash": "ask"}})
        )
        server = OpenCodeServer(harness)
        try:
            server.message("a plain prompt")
            model.script(tool={"when": "run it", "name": "bash", "input": COMMAND})
            server.message("please run it", wait=False)
            wait_for("the approval asked", lambda: server.get("/permission"), 60)
            model.script(tool=None)
            ends = {"approval": len(records(harness))}
            written = records(harness)
        finally:
            server.close()
    return keep(ASKS, "opencode", written, ends)


def capture_codex_approval() -> Path:
    """Codex's app-server, a turn started with ``approvalPolicy`` ``untrusted``: a command
    waits for a person's approval (its ``item/commandExecution/requestApproval``), left
    unanswered: ``approval``, where the rollout ends then. Kept in
    ``tests/fixtures/states/asks/``."""
    with mock_model() as (work, model):
        harness = Harness("codex", work / "codex", model)
        codex = CodexAppServer(harness)
        try:
            codex.turn("a plain prompt")
            model.script(tool={"when": "run it", "name": "exec_command", "input": SHELL})
            since = codex.mark()
            codex.call(
                "turn/start",
                threadId=codex.thread,
                input=[{"type": "text", "text": "please run it"}],
                approvalPolicy="untrusted",
            )
            asked = "item/commandExecution/requestApproval"
            codex.wait("the approval asked", lambda m: m.get("method") == asked, since)
            model.script(tool=None)
            wait_for("the call written", lambda: _called(records(harness)), 60)
            written = records(harness)
        finally:
            codex.close()
    return keep(ASKS, "codex", written, {"approval": len(written)})


SHELL = {"cmd": "touch made-by-the-agent.txt"}


def _called(lines: list[bytes]) -> bool:
    return any(b'"function_call"' in line and b"made-by-the-agent" in line for line in lines)


def answer(tui: ClaudeTui) -> None:
    """Pick the question's first answer (Enter), again until the question is gone: a key
    pressed while the TUI still draws it is lost."""

    pressed = [0.0]

    def gone() -> bool:
        if "1. README.md" not in tui.screen():
            return True
        if time.monotonic() - pressed[0] > 2:  # once in a while, not at every look
            tui.keys("Enter")
            pressed[0] = time.monotonic()
        return False

    wait_for("claude: answered", gone, 60)


def _asked(lines: list[bytes]) -> bool:
    return any(b'"AskUserQuestion"' in line and b'"tool_use"' in line for line in lines)


TUI_SCENES = {
    "claude-asks": capture_asking,
    "codex-approval": capture_codex_approval,
    "opencode-approval": capture_opencode_approval,
}


def main() -> None:
    for kind in sys.argv[1:] or [*KINDS, *TUI_SCENES]:
        why = why_not_runnable(kind.partition("-")[0])
        if why:
            print(f"{kind}: {why}")
            continue
        print(TUI_SCENES[kind]() if kind in TUI_SCENES else capture(kind))


if __name__ == "__main__":
    main()
