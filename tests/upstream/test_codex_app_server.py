"""Codex threads the gateway adopted (``codex-app-server`` links), read from their rollouts.

The fixtures are real rollouts, written by Codex 0.171.0's app-server on the mock model
(tests/fixtures/codex_app_server/README.md says how), with what ``thread/turns/list``
answered for each thread at the end. The reader must list the same turns, with the same
user-message counts; the check must record what the gateway's monitor records from the
same marker.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from adapters.base import Probe, text_hash
from adapters.codex_follow import branch_point
from adapters.codex_gateway import gateway_check
from adapters.codex_rollout import Message, RolloutReader, RolloutTurn

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "codex_app_server"
LISTED: dict[str, Any] = json.loads((FIXTURES / "turns_list.json").read_text())


def listed(turns: list[RolloutTurn]) -> list[list[Any]]:
    """Newest first, the newest 100, as ``thread/turns/list`` pages them."""
    return [[t.id, len(t.messages)] for t in turns[-100:][::-1]]


@pytest.mark.parametrize("home", ["paginated", "legacy"])
def test_the_reader_lists_the_turns_the_app_server_lists(home: str) -> None:
    """Legacy with a steer and a compaction; paginated with a steer, a compaction, a revert
    (read through its history_base), a fork of the reverted thread, and a branch the
    gateway would start (thread_source "openclaw", history injected, then a prompt)."""
    reader = RolloutReader(str(FIXTURES / home))
    for thread, answer in LISTED[home]["threads"].items():
        path = reader.find(thread)
        assert path is not None, thread
        assert listed(reader.turns(path).upto(None)) == answer, thread


def test_a_revert_is_read_from_the_live_generation() -> None:
    """The original file still holds the reverted turn; the live generation's history ends
    before it, as the app-server answered before and after the revert."""
    data = LISTED["paginated"]
    source = data["source"]
    reader = RolloutReader(str(FIXTURES / "paginated"))
    live = reader.find(source)
    assert live is not None and "_" in Path(live).name.split(source)[-1]
    original = next((FIXTURES / "paginated").rglob(f"rollout-*-{source}.jsonl"))
    assert listed(reader.turns(str(original)).upto(None)) == data["before_revert"]


def test_the_state_database_names_the_live_file(tmp_path: Path) -> None:
    """Codex's ``state_5.sqlite`` wins over the file names: here it names the original."""
    import sqlite3

    home = tmp_path / "home"
    shutil.copytree(FIXTURES / "paginated", home)
    source = LISTED["paginated"]["source"]
    original = next(home.rglob(f"rollout-*-{source}.jsonl"))
    conn = sqlite3.connect(home / "state_5.sqlite")
    conn.execute("CREATE TABLE threads (id TEXT PRIMARY KEY, rollout_path TEXT)")
    conn.execute("INSERT INTO threads VALUES (?, ?)", (source, str(original)))
    conn.commit()
    conn.close()
    assert RolloutReader(str(home)).find(source) == str(original)


def test_an_archived_or_compressed_rollout_is_still_read(tmp_path: Path) -> None:
    import zstandard

    home = tmp_path / "home"
    shutil.copytree(FIXTURES / "legacy", home)
    thread, answer = next(iter(LISTED["legacy"]["threads"].items()))
    path = next(home.rglob("*.jsonl"))
    archive = home / "archived_sessions"
    archive.mkdir()
    moved = archive / path.name
    path.rename(moved)
    reader = RolloutReader(str(home))
    found = reader.find(thread)
    assert found == str(moved)
    assert found is not None
    assert listed(reader.turns(found).upto(None)) == answer
    packed = moved.with_name(moved.name + ".zst")
    packed.write_bytes(zstandard.ZstdCompressor().compress(moved.read_bytes()))
    moved.unlink()
    reader = RolloutReader(str(home))
    found = reader.find(thread)
    assert found == str(packed)
    assert found is not None
    assert listed(reader.turns(found).upto(None)) == answer


def test_reading_as_the_file_grows_equals_reading_it_whole(tmp_path: Path) -> None:
    """The rollout appended a line at a time, and a line torn in two: the incremental read
    equals a fresh reader's whole read at every step."""
    home = tmp_path / "home"
    source = next((FIXTURES / "paginated").rglob("*.jsonl"))
    target = home / source.relative_to(FIXTURES / "paginated")
    target.parent.mkdir(parents=True)
    target.write_bytes(b"")
    growing = RolloutReader(str(home))
    for line in source.read_bytes().splitlines(keepends=True):
        half = len(line) // 2
        with target.open("ab") as f:
            f.write(line[:half])
        growing.turns(str(target))
        with target.open("ab") as f:
            f.write(line[half:])
        assert listed(growing.turns(str(target)).upto(None)) == listed(
            RolloutReader(str(home)).turns(str(target)).upto(None)
        )


def turn(ident: str, *texts: str, at: int = 100) -> RolloutTurn:
    return RolloutTurn(
        id=ident,
        messages=[Message(text_hash(t), (text_hash(t),)) for t in texts],
        started_s=at,
        completed_s=at + 1,
        open=False,
    )


NO_OWN: frozenset[str] = frozenset()


def test_the_gateways_record_from_its_marker() -> None:
    """The cases of the gateway monitor's classifier, from the same marker."""
    a, b, c = turn("A", "one"), turn("B", "two", at=200), turn("C", "three", at=300)
    # a new turn after the marker's: one turn, the newest's id and count, its time
    out = gateway_check([a, b], {"turnId": "A", "userMessageCount": 1}, NO_OWN, 0)
    assert (out.status, len(out.turns), out.dedupe_id) == ("activity", 1, "B:1")
    assert out.marker == {"turnId": "B", "userMessageCount": 1}
    assert out.latest_at == 201_000
    # two turns between two polls: one record of two, named by the newest
    out = gateway_check([a, b, c], {"turnId": "A", "userMessageCount": 1}, NO_OWN, 0)
    assert (len(out.turns), out.dedupe_id, out.latest_at) == (2, "C:1", 301_000)
    # a steer: a second message in the marker's own turn
    steered = turn("B", "two", "steered", at=200)
    out = gateway_check([a, steered], {"turnId": "B", "userMessageCount": 1}, NO_OWN, 0)
    assert (len(out.turns), out.dedupe_id) == (1, "B:2")
    # nothing new: the marker stays
    out = gateway_check([a, b], {"turnId": "B", "userMessageCount": 1}, NO_OWN, 0)
    assert (out.status, out.marker) == ("quiet", {"turnId": "B", "userMessageCount": 1})
    # a compaction turn (no user message) moves the marker, records nothing
    out = gateway_check([a, b, turn("K")], {"turnId": "B", "userMessageCount": 1}, NO_OWN, 0)
    assert (out.status, out.marker) == ("quiet", {"turnId": "K", "userMessageCount": 0})
    # the gateway's own text is not a person's, and the marker still moves
    own = frozenset({text_hash("  two ")})
    out = gateway_check([a, b], {"turnId": "A", "userMessageCount": 1}, own, 0)
    assert (out.status, out.marker) == ("quiet", {"turnId": "B", "userMessageCount": 1})
    # a marker turn outside the newest 100: every listed turn is read
    many = [turn(f"T{i}", f"p{i}") for i in range(120)]
    out = gateway_check(many, {"turnId": "gone", "userMessageCount": 1}, NO_OWN, 0)
    assert (len(out.turns), out.dedupe_id) == (100, "T119:1")
    # a marker without a count: the marker's turn is taken as read whole
    out = gateway_check([a, steered], {"turnId": "B"}, NO_OWN, 0)
    assert (out.status, out.marker) == ("quiet", {"turnId": "B", "userMessageCount": 2})
    # a marker the gateway cannot read records nothing and stays
    for bad in ({"turnId": 7}, {"turnId": "A", "userMessageCount": -1}, {}):
        assert gateway_check([a, b], bad, NO_OWN, 0).marker == bad
    # the gateway's next poll from the advanced marker records nothing new
    first = gateway_check([a, b, c], {"turnId": "A", "userMessageCount": 1}, NO_OWN, 0)
    assert first.marker is not None
    again = gateway_check([a, b, c], first.marker, NO_OWN, 0)
    assert (again.status, again.turns, again.marker) == ("quiet", [], first.marker)


def test_a_several_block_message_is_the_gateways_when_each_block_is() -> None:
    blocks = ("first part", "second part")
    message = Message(text_hash(" ".join(blocks)), tuple(text_hash(b) for b in blocks))
    t = RolloutTurn(id="B", messages=[message], started_s=1, completed_s=2, open=False)
    own = frozenset(text_hash(b) for b in blocks)
    out = gateway_check([turn("A", "x"), t], {"turnId": "A", "userMessageCount": 1}, own, 0)
    assert out.status == "quiet"


async def test_the_adapter_checks_the_thread_the_tick_names(tmp_path: Path) -> None:
    """The ref's ``probeThreadId`` (the gateway's branch) is read instead of its own
    thread; a thread whose rollout is nowhere is left to the gateway, never missing."""
    from adapters.base import Settings
    from adapters.codex_app_server import build

    adapter = build(Settings(roots={"codex": str(FIXTURES / "paginated" / "sessions")}))
    data = LISTED["paginated"]
    branch_turns = data["threads"][data["branch"]]
    source_turns = data["threads"][data["source"]]
    marker = {"turnId": source_turns[0][0], "userMessageCount": source_turns[0][1]}
    ref = {"threadId": data["source"], "connectionFingerprint": "f"}
    quiet, branch, nowhere = await adapter.check(
        [
            Probe(session_key="k", ref=ref, marker=marker),
            Probe(session_key="k", ref={**ref, "probeThreadId": data["branch"]}, marker=marker),
            Probe(session_key="k", ref={"threadId": "nowhere"}, marker=marker),
        ]
    )
    assert (quiet.status, quiet.marker) == ("quiet", marker)
    # the branch's own turn is new to the source's marker: the marker's turn is not listed
    assert (branch.status, branch.dedupe_id) == ("activity", f"{branch_turns[0][0]}:1")
    assert nowhere.status == "inconclusive" and "left to the gateway" in (nowhere.reason or "")


async def test_a_rollout_the_reader_does_not_know_is_drift_said_once(tmp_path: Path) -> None:
    from adapters.base import Settings
    from adapters.codex_app_server import build

    day = tmp_path / "sessions" / "2026" / "12" / "01"
    day.mkdir(parents=True)
    thread = "01a233d0-0000-7000-8000-000000000001"
    meta = {"type": "session_meta", "payload": {"id": thread, "history_mode": "windowed"}}
    (day / f"rollout-2026-12-01T00-00-00-{thread}.jsonl").write_text(json.dumps(meta) + "\n")
    adapter = build(Settings(roots={"codex": str(tmp_path / "sessions")}))
    probe = Probe(session_key="k", ref={"threadId": thread}, marker={"turnId": None})
    first, second = await adapter.check([probe]), await adapter.check([probe])
    assert first[0].status == second[0].status == "inconclusive"
    assert "history_mode 'windowed'" in (first[0].reason or "")
    assert first[0].drift is not None and second[0].drift is None


async def test_a_rollout_in_the_gateways_own_codex_home_is_found_by_its_binding(
    tmp_path: Path,
) -> None:
    """The sidecar's Codex root is another home: the rollout the gateway's binding names
    (``rolloutPath``) leads to the gateway's home, where a revert's base is found too."""
    from adapters.base import Settings
    from adapters.codex_app_server import build
    from adapters.codex_gateway import probed_ref

    data = LISTED["paginated"]
    adapter = build(Settings(roots={"codex": str(tmp_path / "elsewhere" / "sessions")}))
    live = RolloutReader(str(FIXTURES / "paginated")).find(data["source"])
    stored = {"state": "active", "binding": {"threadId": data["source"], "rolloutPath": live}}
    ref = probed_ref({"threadId": data["source"]}, data["source"], stored, "s1")
    assert ref["rolloutPath"] == live
    marker = {"turnId": "older", "userMessageCount": 1}
    (out,) = await adapter.check([Probe(session_key="k", ref=ref, marker=marker)])
    newest = data["threads"][data["source"]][0]
    assert (out.status, out.dedupe_id, len(out.turns)) == ("activity", f"{newest[0]}:1", 5)


async def test_a_marker_moves_only_to_a_turn_the_listing_shows(tmp_path: Path) -> None:
    """The app-server lists a paginated thread from its projection, which trails the
    rollout by a moment: until the projection took the new turn, the check records nothing
    (so the gateway's own check, listing the same, always finds the marker's turn); then it
    records the turn."""
    import sqlite3

    from adapters.base import Settings
    from adapters.codex_app_server import build

    home = tmp_path / "home"
    shutil.copytree(FIXTURES / "paginated", home)
    data = LISTED["paginated"]
    projection = sqlite3.connect(home / "thread_history_1.sqlite")
    projection.execute(
        "CREATE TABLE thread_history_projection_state (thread_id TEXT PRIMARY KEY,"
        " next_rollout_byte_offset INTEGER NOT NULL, next_rollout_ordinal INTEGER NOT NULL)"
    )
    projection.execute("INSERT INTO thread_history_projection_state VALUES (?, 0, 8)",
                       (data["branch"],))  # fmt: skip
    projection.commit()
    adapter = build(Settings(roots={"codex": str(home / "sessions")}))
    probe = Probe(session_key="k", ref={"threadId": data["branch"]}, marker={"turnId": None})
    (before,) = await adapter.check([probe])
    assert (before.status, before.marker) == ("quiet", {"turnId": None})
    assert str(home / "thread_history_1.sqlite-wal") in adapter.watched_paths(probe.ref)
    projection.execute("UPDATE thread_history_projection_state SET next_rollout_ordinal = 17")
    projection.commit()
    projection.close()
    (after,) = await adapter.check([probe])
    assert (after.status, after.dedupe_id) == (
        "activity",
        f"{data['threads'][data['branch']][0][0]}:1",
    )


def test_the_gateways_own_prompt_with_its_provenance_line_is_its_own() -> None:
    """The gateway's Codex plugin sends its run's prompt with a first line of provenance:
    the prompt is the gateway's, whether or not its transcript has the text yet. A person's
    text that merely mentions the line is not."""
    from adapters.codex_rollout import _message

    header = '[OpenClaw conversation info: sender={"id":"cli"}]\n'
    sent = RolloutTurn(id="B", messages=[_message([{"type": "text", "text": header + "go on"}])])
    marker = {"turnId": "A", "userMessageCount": 1}
    out = gateway_check([turn("A", "x"), sent], marker, NO_OWN, 0)
    assert (out.status, out.marker) == ("quiet", {"turnId": "B", "userMessageCount": 1})
    quoted = "I saw " + header + "go on"
    typed = RolloutTurn(id="C", messages=[_message([{"type": "text", "text": quoted}])])
    assert gateway_check([turn("A", "x"), typed], marker, NO_OWN, 0).status == "activity"


async def test_a_record_type_codex_never_declared_is_drift_said_once(tmp_path: Path) -> None:
    """A new form of a prompt would be a type or subtype the reader does not know: it is
    counted, shown once as the link's status, and the turns go on as the app-server lists."""
    from adapters.base import Settings
    from adapters.codex_app_server import build

    home = tmp_path / "home"
    shutil.copytree(FIXTURES / "legacy", home)
    thread, answer = next(iter(LISTED["legacy"]["threads"].items()))
    path = next(home.rglob("*.jsonl"))
    adapter = build(Settings(roots={"codex": str(home / "sessions")}))
    marker = {"turnId": answer[0][0], "userMessageCount": answer[0][1]}
    probe = Probe(session_key="k", ref={"threadId": thread}, marker=marker)
    (plain,) = await adapter.check([probe])
    assert (plain.status, plain.drift, plain.reason) == ("quiet", None, None)
    novel = {"type": "event_msg", "payload": {"type": "user_message_v2", "message": "hi"}}
    with path.open("ab") as f:
        f.write(json.dumps(novel).encode() + b"\n")
    (first,) = await adapter.check([probe])
    assert first.drift is not None
    assert first.drift.unknown_types == {"event_msg:user_message_v2": 1}
    assert "user_message_v2" in (first.reason or "")
    (again,) = await adapter.check([probe])
    assert (again.drift, again.reason) == (None, None)


def test_following_the_source_begins_where_the_gateway_left_it() -> None:
    """The first look at the source after the branch: from the link's marker while it
    names a source turn; else from the newest source turn begun by the branch's first turn
    of its own (turns a fork inherits are the source's); with no branch turn yet, from the
    source's newest."""
    person = Message(text_hash("typed"), (text_hash("typed"),))
    source = [RolloutTurn(f"s{i}", [person], started_s=100 * i) for i in range(1, 5)]
    inherited = RolloutTurn("s1", [person], started_s=100)
    branch = [inherited, RolloutTurn("b1", [person], started_s=250)]
    on_source = {"turnId": "s2", "userMessageCount": 1}
    assert on_source == branch_point(source, on_source, branch)
    on_branch = {"turnId": "b1", "userMessageCount": 1}
    assert {"turnId": "s2", "userMessageCount": 1} == branch_point(source, on_branch, branch)
    assert {"turnId": "s4", "userMessageCount": 1} == branch_point(source, on_branch, [inherited])
    early = [RolloutTurn("b0", [], started_s=50)]
    assert {"turnId": None, "userMessageCount": None} == branch_point(source, on_branch, early)
    found = gateway_check(source, branch_point(source, on_branch, branch), frozenset(), 0)
    assert ["s4", "s3"] == [t.native_id for t in found.turns]  # newest first, as it pages
