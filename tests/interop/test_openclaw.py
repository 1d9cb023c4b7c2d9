"""The sidecar and OpenClaw's own published code on one state database, both directions.

These run only where OpenClaw's npm package and Node 24 are installed:
``tests/interop/install.sh`` puts them in ``~/.cache/sessionwatch/interop`` (or the
directory given), and ``SESSIONWATCH_INTEROP_DIR`` may point elsewhere. Elsewhere
they skip and say why. ``openclaw_driver.mjs`` calls OpenClaw's exported session-state
functions by name; nothing of OpenClaw's is copied here.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.interop import NODE, NOT_INSTALLED, OPENCLAW, unless_runnable

PACKAGE = OPENCLAW
DRIVER = Path(__file__).with_name("openclaw_driver.mjs")

pytestmark = unless_runnable(
    None if NODE.exists() and (PACKAGE / "dist").is_dir() else NOT_INSTALLED
)

MAIN = "agent:main:main"
CHILD = "agent:main:subagent:c1"
ADOPTED = "agent:main:adopted:one"
PROMPT = {"type": "user", "message": {"role": "user", "content": "real upstream prompt"}}
REPLY = {"type": "assistant", "message": {"role": "assistant", "content": "ok"}}


def jsonl(*records: dict[str, Any]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


class Setup:
    """An OpenClaw state directory, its database, a Claude root and a sidecar config."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.state_dir = tmp / "openclaw-state"
        self.db = self.state_dir / "state" / "openclaw.sqlite"
        self.claude = tmp / "claude"
        (self.claude / "proj").mkdir(parents=True)
        self.config = tmp / "sessionwatch.toml"
        self.config.write_text(f'[roots]\nclaude = "{self.claude}"\n')

    def store_path(self, agent: str = "main") -> str:
        return os.path.realpath(
            self.state_dir / "agents" / agent / "agent" / "openclaw-agent.sqlite"
        )

    def sw(self, *args: str) -> Any:
        base = [sys.executable, "-m", "monitor", "--db", str(self.db), "--config", str(self.config)]
        proc = subprocess.run(
            [*base, *args],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "HOME": str(self.tmp)},
        )
        assert proc.returncode == 0, proc.stderr
        return orjson.loads(proc.stdout)

    def openclaw(self, *ops: tuple[str, list[Any]]) -> list[Any]:
        ops_file = self.tmp / "ops.json"
        ops_file.write_text(json.dumps([{"fn": fn, "args": args} for fn, args in ops]))
        env = {**os.environ, "HOME": str(self.tmp), "OPENCLAW_STATE_DIR": str(self.state_dir)}
        proc = subprocess.run(
            [str(NODE), str(DRIVER), str(PACKAGE), str(ops_file)],
            capture_output=True,
            text=True,
            check=False,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        results = [
            json.loads(line.removeprefix("@@RESULT "))
            for line in proc.stdout.splitlines()
            if line.startswith("@@RESULT ")
        ]
        assert len(results) == len(ops), proc.stdout + proc.stderr
        return results

    def schema_issues(self) -> list[Any]:
        issues: list[Any] = self.openclaw(("schemaIssues", [str(self.db)]))[0]
        return issues


def as_openclaw_event(event: dict[str, Any], key: str) -> dict[str, Any]:
    """A sidecar ``stateChanges`` event as OpenClaw's listSessionStateEventsSince gives it."""
    return {**event, "sessionKey": key, "agentId": "main"}


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


def test_openclaw_accepts_and_reads_a_database_the_sidecar_created(setup: Setup) -> None:
    """Schema, events, heads, cursors and store paths written by the sidecar are OpenClaw's."""
    setup.db.parent.mkdir(parents=True)
    setup.sw("spawn", "--parent", MAIN, "--child", CHILD, "--run-id", "r1")
    setup.sw(
        "record",
        "--session",
        CHILD,
        "--kind",
        "human_direct_message",
        "--actor",
        "human",
        "--payload",
        '{"channel": "telegram"}',
    )
    setup.sw(
        "record",
        "--session",
        CHILD,
        "--kind",
        "run_completed",
        "--actor",
        "system",
        "--run-id",
        "r1",
    )
    assert [] == setup.schema_issues()

    ours = setup.sw("status", CHILD, "--changes-since", "0")
    version, changes, cursors = setup.openclaw(
        ("getSessionStateVersion", [CHILD, "main"]),
        ("listSessionStateEventsSince", [CHILD, "main", 0]),
        ("rows", [str(setup.db), "SELECT * FROM session_watch_cursors"]),
    )
    assert ours["stateVersion"] == version == 3
    assert [as_openclaw_event(e, CHILD) for e in ours["stateChanges"]["events"]] == changes[
        "events"
    ]
    assert {k: v for k, v in ours["stateChanges"].items() if k != "events"} == {
        k: v for k, v in changes.items() if k != "events"
    }
    assert [(MAIN, setup.store_path(), CHILD, 1, 2, 2, "explicit")] == [
        (
            c["watcher_session_key"],
            c["watcher_store_path"],
            c["target_session_key"],
            c["last_seen_sequence"],
            c["notified_sequence"],
            c["material_sequence"],
            c["provenance"],
        )
        for c in cursors
    ]


def test_openclaw_acks_a_notice_the_sidecar_opened(setup: Setup) -> None:
    """OpenClaw's drain acknowledges the cursor the sidecar froze; a re-registration by
    OpenClaw keeps it; the sidecar then shows nothing pending."""
    setup.db.parent.mkdir(parents=True)
    setup.sw("watch", "--watcher", MAIN, "--target", ADOPTED)
    for _ in range(2):
        setup.sw(
            "record", "--session", ADOPTED, "--kind", "human_direct_message", "--actor", "human"
        )
    assert 1 == len(setup.sw("notices", "--watcher", MAIN)["notices"])
    cursors = "SELECT * FROM session_watch_cursors"
    before, registered, unchanged, _, after = setup.openclaw(
        ("rows", [str(setup.db), cursors]),
        ("registerSessionStateWatch", [{"watcherSessionKey": MAIN, "targetSessionKey": ADOPTED}]),
        ("rows", [str(setup.db), cursors]),
        ("acknowledgeSessionStateNotices", [MAIN, [ADOPTED]]),
        ("rows", [str(setup.db), cursors]),
    )
    # Same store path on both sides, so OpenClaw's re-registration keeps the cursor as it is.
    assert registered is True
    assert before == unchanged
    assert setup.store_path() == after[0]["watcher_store_path"]
    assert (1, 2, 2) == (
        after[0]["last_seen_sequence"],
        after[0]["notified_sequence"],
        after[0]["material_sequence"],
    )
    # The follow-up notice for the interleaved event is the sidecar's to show.
    assert [n["text"] for n in setup.sw("notices", "--watcher", MAIN)["notices"]] == [
        f'Session "{ADOPTED}" changed (other actor). Reconcile before acting: '
        f'session_status sessionKey "{ADOPTED}" changesSince 1.'
    ]


def test_openclaw_checker_reads_a_link_the_sidecar_wrote(setup: Setup) -> None:
    """A Claude link adopted by the sidecar is a claude-cli link OpenClaw's checker reads,
    and both count the same turn at the same offset."""
    setup.db.parent.mkdir(parents=True)
    transcript = setup.claude / "proj" / "3f2a.jsonl"
    transcript.write_bytes(jsonl(PROMPT, REPLY))
    setup.sw("adopt", "--kind", "claude", "--path", str(transcript), "--session-key", ADOPTED)
    setup.sw("watch", "--watcher", MAIN, "--target", ADOPTED)
    assert [] == setup.schema_issues()
    with transcript.open("ab") as f:
        f.write(jsonl(PROMPT, REPLY))

    (link,) = setup.openclaw(("readSessionUpstreamLink", [ADOPTED, "main"]))
    assert ("claude-cli", "gateway:local", "claude", "3f2a") == (
        link["upstreamKind"],
        link["hostId"],
        link["catalogId"],
        link["threadId"],
    )
    assert os.path.realpath(transcript) == link["upstreamRef"]["filePath"]
    (activity,) = setup.openclaw(
        ("checkClaudeUpstreamActivity", [[{**link, "ownRecentUserTexts": []}]])
    )
    size = transcript.stat().st_size
    assert [{"humanTurns": 1, "nextMarker": {"offset": size}}] == [
        {"humanTurns": a["humanTurns"], "nextMarker": a["nextMarker"]} for a in activity
    ]

    (result,) = setup.sw("tick")["outcomes"]
    assert ("activity", 1) == (result["outcome"], result["turns"])
    (ours,) = setup.sw("links")["links"]
    assert size == ours["marker"]["offset"]
    events = setup.sw("status", ADOPTED, "--changes-since", "0")["stateChanges"]["events"]
    assert ["adopted from claude", "human message via claude"] == [e["summary"] for e in events]


def test_a_gateway_check_from_the_old_marker_settles_nothing_once_the_sidecar_has(
    setup: Setup,
) -> None:
    """OpenClaw's monitor settles a check only while the link's ``updatedAt`` is the one it
    scanned from: it compares it before it records, and its marker update takes it as
    ``expectedUpdatedAt``; it never compares markers. Its check reads a prompt; the reply is
    appended; the sidecar records the prompt at the new end (a dedupe id the gateway's
    check does not share). The sidecar's marker moves ``updatedAt``, so the gateway's
    check would record nothing, and OpenClaw's own marker update refuses it."""
    setup.db.parent.mkdir(parents=True)
    transcript = setup.claude / "proj" / "3f2a.jsonl"
    transcript.write_bytes(b"")
    setup.sw("adopt", "--kind", "claude", "--path", str(transcript), "--session-key", ADOPTED)
    setup.sw("watch", "--watcher", MAIN, "--target", ADOPTED)
    transcript.write_bytes(jsonl(PROMPT))
    (scanned,) = setup.openclaw(("readSessionUpstreamLink", [ADOPTED, "main"]))
    (activity,) = setup.openclaw(
        ("checkClaudeUpstreamActivity", [[{**scanned, "ownRecentUserTexts": []}]])
    )
    (found,) = activity
    assert (1, transcript.stat().st_size) == (found["humanTurns"], found["nextMarker"]["offset"])

    with transcript.open("ab") as f:
        f.write(jsonl(REPLY))
    (result,) = setup.sw("tick")["outcomes"]
    assert ("activity", 1) == (result["outcome"], result["turns"])

    current, updated = setup.openclaw(
        ("readSessionUpstreamLink", [ADOPTED, "main"]),
        (
            "updateSessionUpstreamLinkMarker",
            [ADOPTED, "main", found["nextMarker"], {"expectedUpdatedAt": scanned["updatedAt"]}],
        ),
    )
    assert current["updatedAt"] > scanned["updatedAt"]  # the gateway's check stops here
    assert updated is False  # and its marker update refuses
    assert transcript.stat().st_size == current["marker"]["offset"]
    events = setup.sw("status", ADOPTED, "--changes-since", "0")["stateChanges"]["events"]
    assert ["adopted from claude", "human message via claude"] == [e["summary"] for e in events]


def openclaw_source_key(link: dict[str, Any]) -> str:
    """The 16 hex digits OpenClaw's monitor puts in its dedupe key (``upstreamSourceKey``,
    which its package does not export): sha256 of host, thread and the ref's JSON."""
    ref = json.dumps(link["upstreamRef"], separators=(",", ":"), ensure_ascii=False)
    raw = f"{link['hostId']}\0{link['threadId']}\0{ref}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


@pytest.mark.parametrize("typed_meanwhile", [False, True], ids=["quiet", "typed-meanwhile"])
def test_a_sidecar_tick_between_the_gateways_two_writes_records_no_turn_twice(
    setup: Setup, typed_meanwhile: bool
) -> None:
    """The gateway's monitor settles a turn in two writes, with OpenClaw's own functions in
    its own order: it reads the link, checks the file, records the turn (the dedupe key
    ``upstream:<key>:<source>:<offset>``), and only then moves the marker, guarded by the
    ``updatedAt`` it read. Here it is held between the two, and the sidecar ticks there. It
    must not count the turn the gateway just recorded, and a prompt typed meanwhile is
    recorded once; whatever the gateway's marker write then does, a last tick finds nothing
    new, and every prompt is one turn."""
    setup.db.parent.mkdir(parents=True)
    transcript = setup.claude / "proj" / "3f2a.jsonl"
    transcript.write_bytes(b"")
    setup.sw("adopt", "--kind", "claude", "--path", str(transcript), "--session-key", ADOPTED)
    setup.sw("watch", "--watcher", MAIN, "--target", ADOPTED)
    # with its timestamp, as Claude Code writes it: without one, OpenClaw's check takes the
    # file's mtime, a fraction of a millisecond, and its own insert refuses that REAL
    prompt = {**PROMPT, "timestamp": "2026-12-04T08:00:00.000Z"}
    transcript.write_bytes(jsonl(prompt, REPLY))

    # The gateway's check and its first write.
    (scanned,) = setup.openclaw(("readSessionUpstreamLink", [ADOPTED, "main"]))
    (activity,) = setup.openclaw(
        ("checkClaudeUpstreamActivity", [[{**scanned, "ownRecentUserTexts": []}]])
    )
    (found,) = activity
    assert 1 == found["humanTurns"]
    dedupe = f"upstream:{ADOPTED}:{openclaw_source_key(scanned)}:{found['dedupeId']}"
    turn = {
        "sessionKey": ADOPTED,
        "agentId": "main",
        "actor": {"actorType": "human"},
        "channel": "claude",
        "dedupeKey": dedupe,
        "occurredAt": found["occurredAt"],
    }
    (recorded,) = setup.openclaw(("recordSessionHumanDirectMessage", [turn]))
    assert recorded

    # Held there: a prompt may be typed, and the sidecar ticks.
    if typed_meanwhile:
        with transcript.open("ab") as f:
            f.write(jsonl(prompt, REPLY))
    (result,) = setup.sw("tick")["outcomes"]
    assert result["turns"] == (1 if typed_meanwhile else 0), result

    # The gateway's second write, guarded by the updatedAt it read, then a last tick.
    guard = {"expectedUpdatedAt": scanned["updatedAt"]}
    setup.openclaw(
        ("updateSessionUpstreamLinkMarker", [ADOPTED, "main", found["nextMarker"], guard])
    )
    (last,) = setup.sw("tick")["outcomes"]
    assert last["outcome"] == "quiet", last
    events = setup.sw("status", ADOPTED, "--changes-since", "0")["stateChanges"]["events"]
    turns = [e for e in events if e["kind"] == "human_direct_message"]
    assert (2 if typed_meanwhile else 1) == sum(
        (e.get("payload") or {}).get("turns", 1) for e in turns
    )
    (ours,) = setup.sw("links")["links"]
    assert transcript.stat().st_size == ours["marker"]["offset"]


def test_the_sidecar_continues_what_openclaw_wrote(setup: Setup) -> None:
    """On a database OpenClaw created: its events read identically, its cursor's notice shows
    with no flags, its claude-cli link is ticked from its marker, a codex-app-server link
    whose thread has no rollout here is left to the gateway (read, its marker untouched), and
    OpenClaw still accepts the database afterwards."""
    transcript = setup.claude / "proj" / "77aa.jsonl"
    transcript.write_bytes(jsonl(PROMPT, REPLY))
    marker = transcript.stat().st_size
    link = {
        "sessionKey": ADOPTED,
        "agentId": "main",
        "catalogId": "claude",
        "hostId": "gateway:local",
        "threadId": "77aa",
        "upstreamKind": "claude-cli",
        "upstreamRef": {"filePath": str(transcript)},
        "marker": {"size": marker},
    }
    codex = {
        **link,
        "sessionKey": "agent:main:adopted:codex",
        "catalogId": "codex",
        "threadId": "thr-1",
        "upstreamKind": "codex-app-server",
        "upstreamRef": {"connectionFingerprint": "fp", "threadId": "thr-1"},
        "marker": {"turnId": None, "userMessageCount": 0},
    }
    event = {"agentId": "main", "kind": "human_direct_message", "actorType": "human"}
    setup.openclaw(
        ("registerSessionStateWatch", [{"watcherSessionKey": MAIN, "targetSessionKey": ADOPTED}]),
        (
            "registerSessionStateWatch",
            [{"watcherSessionKey": MAIN, "targetSessionKey": codex["sessionKey"]}],
        ),
        (
            "recordSessionStateEvent",
            [
                {
                    **event,
                    "sessionKey": ADOPTED,
                    "summary": "human message via telegram",
                    "runId": "run-7",
                }
            ],
        ),
        ("upsertSessionUpstreamLink", [link]),
        ("upsertSessionUpstreamLink", [codex]),
    )
    (theirs,) = setup.openclaw(("listSessionStateEventsSince", [ADOPTED, "main", 0]))
    ours = setup.sw("status", ADOPTED, "--changes-since", "0")
    assert theirs["events"] == [
        as_openclaw_event(e, ADOPTED) for e in ours["stateChanges"]["events"]
    ]
    assert "run-7" == ours["stateChanges"]["events"][0]["runId"]
    assert [ADOPTED] == [n["target"] for n in setup.sw("notices", "--watcher", MAIN)["notices"]]

    listed = {x["sessionKey"]: x for x in setup.sw("links")["links"]}
    assert (False, "claude") == (listed[ADOPTED]["foreign"], listed[ADOPTED]["kind"])
    assert (False, "codex-app-server") == (
        listed[codex["sessionKey"]]["foreign"],
        listed[codex["sessionKey"]]["kind"],
    )

    with transcript.open("ab") as f:
        f.write(jsonl(PROMPT, REPLY))
    results = {r["sessionKey"]: r for r in setup.sw("tick")["outcomes"]}
    assert ("activity", 1) == (results[ADOPTED]["outcome"], results[ADOPTED]["turns"])
    assert "inconclusive" == results[codex["sessionKey"]]["outcome"]
    assert "left to the gateway" in results[codex["sessionKey"]]["reason"]
    again = {r["sessionKey"]: r for r in setup.sw("tick")["outcomes"]}
    assert ("quiet", 0) == (again[ADOPTED]["outcome"], again[ADOPTED]["turns"])

    after, version, codex_after = setup.openclaw(
        ("schemaIssues", [str(setup.db)]),
        ("getSessionStateVersion", [ADOPTED, "main"]),
        ("readSessionUpstreamLink", [codex["sessionKey"], "main"]),
    )
    assert [] == after
    assert setup.sw("status", ADOPTED)["stateVersion"] == version
    assert (codex["marker"], codex["upstreamRef"]) == (
        codex_after["marker"],
        codex_after["upstreamRef"],
    )
