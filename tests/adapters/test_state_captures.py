"""The captures of what each real harness writes at a turn's boundaries
(tests/fixtures/states, made by ``python -m tests.harnesses.capture_states``) read as their
formats say: replayed through ``sessionwatch replay``, each session holds its three typed
prompts (a turn that ends, one that calls a tool, one interrupted), one a scene, and no
drift. OpenCode's capture is its database's rows, which replay does not read from a file."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters import states
from adapters.jsonl_adapter import replay_file
from adapters.jsonl_check import TailSettings
from adapters.jsonl_format import format_of
from adapters.jsonl_scan import parse_line, time_ms
from tests.helpers import REPO

STATES = REPO / "tests" / "fixtures" / "states"
CAPTURES = sorted(
    p for p in STATES.glob("*.json") if json.loads(p.read_text())["kind"] != "opencode"
)


def test_every_harness_was_captured_with_its_version() -> None:
    about = [json.loads(p.read_text()) for p in sorted(STATES.glob("*.json"))]
    assert {"claude", "codex", "opencode", "pi"} == {a["kind"] for a in about}
    for a in about:
        assert list(a["ends"]) == ["ends", "tool", "interrupted"]
        lines = (STATES / f"{a['kind']}-{a['version']}.jsonl").read_bytes().splitlines()
        ends = list(a["ends"].values())
        assert ends == sorted(ends) and len(lines) >= ends[-1]  # then what closing wrote
        assert all(json.loads(line) for line in lines)


@pytest.mark.parametrize("about", CAPTURES, ids=lambda p: p.stem)
def test_a_capture_replays_to_its_three_prompts_and_no_drift(about: Path) -> None:
    kind = json.loads(about.read_text())["kind"]
    proc = subprocess.run(
        [sys.executable, "-m", "monitor", "replay", "--adapter", kind,
         str(about.with_suffix(".jsonl"))],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert 3 == summary["humanTurns"], summary
    drift = summary["drift"]
    assert ({}, 0, 0) == (
        drift["unknownTypes"], drift["unclassifiedUserRecords"], drift["invalidLines"]
    ), drift  # fmt: skip


# -- what each session is doing, read from the captures (adapters/states.py) ------------

JSONL = {p.stem: json.loads(p.read_text()) for p in CAPTURES}
# the JSONL captures of asks/: Claude Code's TUI asking a question, then a command's
# approval; Codex's app-server waiting for a command's approval
ASKS = {
    f"asks/{p.stem}": about
    for p in sorted(STATES.glob("asks/*.json"))
    if (about := json.loads(p.read_text()))["kind"] != "opencode"
}
EVERY = {**JSONL, **ASKS}  # every capture of a JSONL format, the question one's too
TOOL_NAMES = {"claude": b'"name":"Read"', "codex": b'"name":"exec_command"', "pi": b'"name":"read"'}


def doing(
    kind: str, lines: list[bytes], tmp: Path, cap: int = 1 << 20, own: list[str] | None = None
) -> dict[str, Any]:
    """The state ``sessionwatch replay`` reads from these lines (a file of them), ``own``
    the gateway's own messages (their echoes are no person's turns)."""
    path = tmp / f"{kind}-{len(lines)}-{cap}.jsonl"
    path.write_bytes(b"".join(lines))
    *_, summary = replay_file(format_of(kind), str(path), own or [], TailSettings(cap=cap))
    return dict(summary["state"])


PROMPTS = ["a plain prompt", "please use the tool", "a prompt interrupted"]  # the scenes


def capture_lines(name: str) -> list[bytes]:
    return (STATES / f"{name}.jsonl").read_bytes().splitlines(keepends=True)


@pytest.mark.parametrize("name", sorted(JSONL))
def test_each_scene_leaves_its_session_waiting_and_a_tool_call_leaves_it_working(
    name: str, tmp_path: Path
) -> None:
    """At each scene's end (a turn ended, a tool's turn ended, a turn interrupted) the
    next move is a person's; just after the model's tool call, the turn goes on, and has
    since the prompt that began it: the state there, and since when, are what they are
    just after that prompt."""
    kind, ends = JSONL[name]["kind"], JSONL[name]["ends"]
    lines = capture_lines(name)
    assert "unknown" == doing(kind, lines[:1], tmp_path)["state"]  # its first record alone
    for scene, end in ends.items():
        assert "waiting" == doing(kind, lines[:end], tmp_path)["state"], scene
    call = next(
        i for i in range(ends["ends"], ends["tool"]) if TOOL_NAMES[kind] in lines[i]
    )  # the model's tool call
    mid_tool = doing(kind, lines[: call + 1], tmp_path)
    assert "working" == mid_tool["state"]
    began = next(
        i + 1
        for i in range(ends["ends"], call)
        if doing(kind, lines[: i + 1], tmp_path)["state"] == "working"
    )  # the turn's first line that says so
    assert mid_tool == doing(kind, lines[:began], tmp_path)
    waiting = doing(kind, lines[: ends["ends"]], tmp_path)
    assert waiting["since"] is not None and waiting["since"] < mid_tool["since"]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
@pytest.mark.parametrize("name", sorted(JSONL))
def test_the_state_is_a_function_of_the_records_read_however_they_are_read(
    name: str, tmp_path: Path, data: st.DataObject
) -> None:
    """Any prefix of a capture, read in one tick or in many small ones, and with a torn
    line after it (written halfway), leaves one state, since one time."""
    kind = JSONL[name]["kind"]
    lines = capture_lines(name)
    n = data.draw(st.integers(1, len(lines)), label="lines")  # a session has its first
    cap = data.draw(st.sampled_from([4096, 16_384, 65_536]), label="scan cap")
    torn = data.draw(st.integers(1, 120), label="torn bytes")
    whole = doing(kind, lines[:n], tmp_path)
    assert whole == doing(kind, lines[:n], tmp_path, cap=cap)
    if n < len(lines):
        assert whole == doing(kind, [*lines[:n], lines[n][:torn].rstrip(b"\n")], tmp_path)


# A compaction each format writes (its own shape; no boundary), and the reference the
# searches are held to: every line parsed, in order, the state of the last boundary since
# the first of its run.
COMPACTIONS = {
    "claude": {"type": "user", "isCompactSummary": True, "timestamp": "2026-12-06T10:00:00Z",
               "message": {"role": "user", "content": "This session is being continued"}},
    "codex": {"type": "compacted", "timestamp": "2026-12-06T10:00:00Z",
              "payload": {"message": "summary", "replacement_history": []}},
    "pi": {"type": "compaction", "id": "c0mp", "parentId": None,
           "timestamp": "2026-12-06T10:00:00Z", "summary": "summary"},
}  # fmt: skip


def reference(kind: str, lines: list[bytes]) -> dict[str, Any]:
    fmt = format_of(kind)
    assert fmt.state_of is not None
    state, since = "unknown", None
    for line in lines:
        if not line.endswith(b"\n"):
            break  # torn: not read yet
        record = parse_line(line.strip(), recover=not fmt.strict)
        found = fmt.state_of(record) if isinstance(record, dict) else None
        if found is not None and found != state:
            state, since = found, time_ms(record)
    return {"state": state, "since": since}


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
@pytest.mark.parametrize("name", sorted(EVERY))
def test_any_sequence_of_records_leaves_the_state_every_record_read_in_turn_gives(
    name: str, tmp_path: Path, data: st.DataObject, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records of the capture in any order, compactions among them, a torn line at the
    end, read in one tick or in many, with searches a few lines wide or wider than all,
    some prompts the gateway's own (echoes): the state is the reference's, which parses
    every line (an echo is still a prompt the agent works on)."""
    kind = EVERY[name]["kind"]
    pool = [*capture_lines(name), orjson.dumps(COMPACTIONS[kind]) + b"\n"]
    picked = data.draw(st.lists(st.sampled_from(pool[1:]), min_size=0, max_size=30))
    lines = [pool[0], *picked]
    if data.draw(st.booleans(), label="torn"):
        lines.append(data.draw(st.sampled_from(pool[1:]))[: data.draw(st.integers(1, 80))])
    monkeypatch.setattr(states, "WINDOW", data.draw(st.sampled_from([64, 1024, 1 << 20])))
    cap = data.draw(st.sampled_from([4096, 16_384, 1 << 20]), label="scan cap")
    own = data.draw(st.lists(st.sampled_from(PROMPTS), unique=True), label="echoes")
    expected = reference(kind, lines)
    assert expected == doing(kind, lines, tmp_path, cap=cap, own=own)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(lines)), max_size=6), label="ticks"))
    assert expected == ticked(kind, lines, cuts)


def ticked(kind: str, lines: list[bytes], cuts: list[int]) -> dict[str, Any]:
    """What the monitor's checks come to, each reading the complete lines written since
    the last (``cuts``: where each check ended), each read searched on its own."""
    fmt, now = format_of(kind), states.Doing()
    whole = [line for line in lines if line.endswith(b"\n")]
    for start, stop in itertools.pairwise([0, *cuts, len(whole)]):
        chunk = b"".join(whole[start:stop])
        now = now.after(states.last_boundary(fmt, chunk, 0, len(chunk)))
    return now.to_json()


@pytest.mark.parametrize("name", sorted(JSONL))
def test_a_compaction_after_a_turn_ended_changes_nothing(name: str, tmp_path: Path) -> None:
    kind, ends = JSONL[name]["kind"], JSONL[name]["ends"]
    lines = capture_lines(name)[: ends["ends"]]
    compacted = [*lines, orjson.dumps(COMPACTIONS[kind]) + b"\n"]
    assert doing(kind, lines, tmp_path) == doing(kind, compacted, tmp_path)
    assert "waiting" == doing(kind, compacted, tmp_path)["state"]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("name", sorted(EVERY))
def test_the_few_lines_a_node_sends_say_what_all_of_them_say(
    name: str, data: st.DataObject
) -> None:
    """A paired node sends, of a read, only the lines the state is found in
    (``boundary_lines``, each reduced as its format's ``state_wire`` says): the sidecar
    finds the same state in them as in the whole read."""
    kind = EVERY[name]["kind"]
    fmt = format_of(kind)
    pool = [*capture_lines(name), orjson.dumps(COMPACTIONS[kind]) + b"\n"]
    chunk = b"".join(data.draw(st.lists(st.sampled_from(pool), max_size=30)))
    sent = [
        orjson.dumps(fmt.state_wire(orjson.loads(line))) if fmt.state_wire else line
        for line in states.boundary_lines(fmt, chunk, 0, len(chunk))
    ]
    assert len(sent) <= 4
    alone = b"".join(line + b"\n" for line in sent)
    whole = states.last_boundary(fmt, chunk, 0, len(chunk))
    assert whole == states.last_boundary(fmt, alone, 0, len(alone))


@pytest.mark.parametrize(
    "name", sorted(n for n, about in ASKS.items() if "approval" in about["ends"])
)
def test_a_command_waiting_for_approval_reads_working_never_asking(
    name: str, tmp_path: Path
) -> None:
    """Claude Code's TUI and Codex's app-server, each waiting for a person to approve a
    command, left unanswered: no record says a person is asked, so the session reads as
    its records say, working since the turn began."""
    kind, ends = ASKS[name]["kind"], ASKS[name]["ends"]
    lines = capture_lines(name)[: ends["approval"]]
    found = doing(kind, lines, tmp_path)
    assert "working" == found["state"] and found == reference(kind, lines)


@pytest.mark.parametrize("name", sorted(n for n, a in ASKS.items() if "asks" in a["ends"]))
def test_a_question_asked_reads_asking_until_it_is_answered(name: str, tmp_path: Path) -> None:
    """Claude Code's TUI asked a person a question (its AskUserQuestion tool): asking,
    since the call, until the answer came back (working), then the turn ended (waiting);
    a command waiting for approval is no question (working)."""
    kind, ends = ASKS[name]["kind"], ASKS[name]["ends"]
    lines = capture_lines(name)
    asked = doing(kind, lines[: ends["asks"]], tmp_path)
    called = max(i for i in range(ends["asks"]) if b'"AskUserQuestion"' in lines[i])
    assert ("asking", time_ms(orjson.loads(lines[called]))) == (asked["state"], asked["since"])
    answer = next(i for i in range(ends["asks"], ends["answered"]) if b"tool_result" in lines[i])
    assert "working" == doing(kind, lines[: answer + 1], tmp_path)["state"]
    assert "waiting" == doing(kind, lines[: ends["answered"]], tmp_path)["state"]
    # then a command waits on screen for a person's approval: no record says so, and the
    # state never claims it: working, since the prompt that asked for the command
    approval = doing(kind, lines[: ends["approval"]], tmp_path)
    prompt = max(i for i in range(ends["approval"]) if b"please run it" in lines[i])
    assert ("working", time_ms(orjson.loads(lines[prompt]))) == tuple(approval.values())
