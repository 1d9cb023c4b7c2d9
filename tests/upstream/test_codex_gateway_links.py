"""The tick on the gateway's own ``codex-app-server`` links, next to an OpenClaw install.

The install is the files the gateway writes, as OpenClaw 2026.9.6 and ``@openclaw/codex``
2026.9.5 lay them out: the link row, the plugin's supervision binding in
``plugin_state_entries``, the agent database's session row and transcript (the gateway's
own texts). The rollouts are a real Codex 0.171.0 thread, appended turn by turn.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from adapters.codex_gateway import gateway_check
from monitor.config import Config, RootsConfig
from monitor.kernel import Kernel
from monitor.upstream import UpstreamMonitor, links
from tests.helpers import ManualClock
from tests.upstream.test_codex_app_server import FIXTURES, LISTED

KEY = "agent:main:codex:adopted"
MAIN = "agent:main:main"
SESSION = "sess-1"
FINGERPRINT = "sha256:" + "ab" * 32
PLUGIN_STATE_DDL = """
CREATE TABLE IF NOT EXISTS plugin_state_entries (
  plugin_id TEXT NOT NULL, namespace TEXT NOT NULL, entry_key TEXT NOT NULL,
  value_json TEXT NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER,
  PRIMARY KEY (plugin_id, namespace, entry_key)
) STRICT;
"""
AGENT_DDL = """
CREATE TABLE session_nodes (session_key TEXT PRIMARY KEY, current_session_id TEXT);
CREATE TABLE transcript_events (session_id TEXT, seq INTEGER, event_json TEXT,
  event_zstd BLOB, PRIMARY KEY (session_id, seq));
CREATE TABLE session_transcript_active_events (session_id TEXT, active_position INTEGER,
  event_seq INTEGER, message_position INTEGER);
"""


class Install:
    """An OpenClaw state directory and a Codex home, as the gateway and Codex leave them."""

    def __init__(self, tmp: Path) -> None:
        self.state = tmp / "openclaw"
        self.db = self.state / "state" / "openclaw.sqlite"
        self.db.parent.mkdir(parents=True)
        self.agent_db = self.state / "agents" / "main" / "agent" / "openclaw-agent.sqlite"
        self.agent_db.parent.mkdir(parents=True)
        with sqlite3.connect(self.agent_db) as conn:
            conn.executescript(AGENT_DDL)
            conn.execute("INSERT INTO session_nodes VALUES (?, ?)", (KEY, SESSION))
        self.home = tmp / "codex-home"
        self.seq = 0
        self.source = LISTED["paginated"]["source"]
        self.branch = LISTED["paginated"]["branch"]
        fixture = next((FIXTURES / "paginated").rglob(f"rollout-*-{self.source}.jsonl"))
        self.source_lines = fixture.read_bytes().splitlines(keepends=True)
        self.rollout = self.home / fixture.relative_to(FIXTURES / "paginated")
        self.rollout.parent.mkdir(parents=True)
        self.rollout.write_bytes(b"")
        self.written = 0

    def codex_types_until(self, turns_done: int) -> None:
        """Append the source's lines up to the end of its ``turns_done``-th turn."""
        done = 0
        for i, line in enumerate(self.source_lines):
            if b'"task_complete"' in line:
                done += 1
                if done == turns_done:
                    with self.rollout.open("ab") as f:
                        f.write(b"".join(self.source_lines[self.written : i + 1]))
                    self.written = i + 1
                    return
        raise AssertionError(f"the fixture has fewer than {turns_done} turns")

    def person_types_into_source(self, n: int) -> str:
        """A turn typed into the source after the gateway's branch: the source's last turn
        again, under a new turn id, ``n`` minutes after the fixture's day ended; its id."""
        at = max(i for i, line in enumerate(self.source_lines) if b'"task_started"' in line)
        old = orjson.loads(self.source_lines[at])["payload"]["turn_id"]
        new = f"01a233d1-{n:04x}-7000-8000-000000000000"
        with self.rollout.open("ab") as f:
            for line in self.source_lines[at:]:
                line = line.replace(old.encode(), new.encode())
                f.write(line.replace(b'"2026-12-01T22:54:', f'"2026-12-01T23:{n:02d}:'.encode()))
        return new

    def gateway_adopts(self, marker: dict[str, Any]) -> None:
        ref = {"connectionFingerprint": FINGERPRINT, "threadId": self.source}
        with sqlite3.connect(self.db) as conn:
            conn.execute(
                "INSERT INTO session_upstream_links VALUES"
                " (?, 'main', 'codex', 'gateway:local', ?, 'codex-app-server', ?, ?, NULL, 1, 1)",
                (KEY, self.source, orjson.dumps(ref).decode(), orjson.dumps(marker).decode()),
            )

    def gateway_materializes_the_branch(
        self, session_id: str = SESSION, lease_until: int | None = None
    ) -> None:
        """The binding now names the branch; the branch's rollout is written. With
        ``lease_until``, the gateway holds the binding's lease (it is changing the thread)."""
        digest = base64.urlsafe_b64encode(hashlib.sha256(KEY.encode()).digest()).rstrip(b"=")
        stored = {
            "version": 1,
            "state": "active",
            "sessionId": session_id,
            "binding": {
                "threadId": self.branch,
                "cwd": "/work",
                "connectionScope": "supervision",
                "supervisionSourceThreadId": self.source,
                "preserveNativeModel": True,
                "conversationSourceTransferComplete": True,
                "model": "mock-model",
                "modelProvider": "mock",
            },
        }
        if lease_until is not None:
            stored["lease"] = {"token": "t", "expiresAt": lease_until}
        with sqlite3.connect(self.db) as conn:
            conn.executescript(PLUGIN_STATE_DDL)
            conn.execute(
                "INSERT OR REPLACE INTO plugin_state_entries VALUES"
                " ('codex', 'app-server-thread-bindings', ?, ?, 1, NULL)",
                (f"session-key:main:{digest.decode()}", orjson.dumps(stored).decode()),
            )
        branch = next((FIXTURES / "paginated").rglob(f"rollout-*-{self.branch}.jsonl"))
        shutil.copy(branch, self.home / branch.relative_to(FIXTURES / "paginated"))

    def gateway_said(self, text: str) -> None:
        """A user message the gateway sent into the session (its own, not a person's)."""
        self.seq += 1
        event = {"type": "message", "message": {"role": "user", "content": text}}
        with sqlite3.connect(self.agent_db) as conn:
            conn.execute(
                "INSERT INTO transcript_events VALUES (?, ?, ?, NULL)",
                (SESSION, self.seq, orjson.dumps(event).decode()),
            )
            conn.execute(
                "INSERT INTO session_transcript_active_events VALUES (?, ?, ?, ?)",
                (SESSION, self.seq, self.seq, self.seq),
            )

    def marker(self) -> dict[str, Any]:
        with sqlite3.connect(self.db) as conn:
            (raw,) = conn.execute("SELECT last_marker_json FROM session_upstream_links").fetchone()
        found: dict[str, Any] = orjson.loads(raw)
        return found

    def records(self) -> list[tuple[str, int]]:
        """The human turns recorded: dedupe key, and how many turns each says."""
        with sqlite3.connect(self.db) as conn:
            rows = conn.execute(
                "SELECT dedupe_key, payload_json FROM session_state_events"
                " WHERE kind = 'human_direct_message' ORDER BY sequence"
            ).fetchall()
        return [(k, int(orjson.loads(p or "{}").get("turns", 1))) for k, p in rows]


@pytest.fixture
async def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    install = Install(tmp_path)
    monkeypatch.setenv("OPENCLAW_STATE_DIR", str(install.state))
    kernel = await Kernel.open(install.db, clock=ManualClock())
    roots = RootsConfig(codex=str(install.home / "sessions"))
    monitor = UpstreamMonitor.from_config(kernel, Config(roots=roots))
    yield install, kernel, monitor
    await kernel.close()


def turn_ids(thread: str) -> list[str]:
    return [t for t, _ in LISTED["paginated"]["threads"][thread]][::-1]


async def test_the_gateways_codex_link_is_recorded_as_its_monitor_would(rig: Any) -> None:
    install, kernel, monitor = rig
    install.codex_types_until(1)
    first = turn_ids(install.source)[0]
    install.gateway_adopts({"turnId": first, "userMessageCount": 1})
    assert await kernel.watch(watcher=MAIN, target=KEY)
    link = (await monitor.links())[0].link
    assert (link.kind, link.foreign) == ("codex-app-server", False)
    prefix = f"upstream:{KEY}:{link.source_key}:"

    # a prompt, and a steer in the same turn: one record of two, named as the gateway names it
    install.codex_types_until(2)
    second = turn_ids(install.source)[1]
    assert [("activity", 2)] == [(r.outcome, r.turns) for r in await monitor.ticker.tick()]
    assert install.records() == [(f"{prefix}{second}:2", 2)]
    assert install.marker() == {"turnId": second, "userMessageCount": 2}

    # the gateway's own prompt is not a person's; the marker still moves
    install.gateway_said("third prompt")
    install.codex_types_until(3)
    assert [("quiet", 0)] == [(r.outcome, r.turns) for r in await monitor.ticker.tick()]
    third = turn_ids(install.source)[2]
    assert install.marker() == {"turnId": third, "userMessageCount": 1}

    # the gateway's monitor, polling afterwards from the same marker, finds nothing new
    turns = monitor.adapters["codex-app-server"].reader.turns(str(install.rollout)).upto(None)
    again = gateway_check(turns, install.marker(), frozenset(), 0)
    assert (again.status, again.turns) == ("quiet", [])

    # the branch: once the binding names it, the branch is what is read (a person typed into
    # it) on the gateway's marker; the source's turns the gateway never saw (it probed the
    # source up to the third) are followed beside it, on the sidecar's own marker
    install.gateway_materializes_the_branch()
    install.codex_types_until(5)
    branch_turn = turn_ids(install.branch)[-1]
    assert [("activity", 2)] == [(r.outcome, r.turns) for r in await monitor.ticker.tick()]
    fifth = orjson.loads(install.source_lines[-1])["payload"]["turn_id"]
    assert install.records()[-2:] == [
        (f"{prefix}{branch_turn}:1", 1),
        (f"upstream-source:{KEY}:{link.source_key}:{fifth}:1", 1),
    ]
    assert install.marker() == {"turnId": branch_turn, "userMessageCount": 1}
    assert [("quiet", 0)] == [(r.outcome, r.turns) for r in await monitor.ticker.tick()]
    assert len(install.records()) == 3

    # file watching names the branch's rollout now, and the source's, which is followed
    watched = await monitor.watched_paths()
    assert any(install.branch in p for p in watched)
    assert any(install.source in Path(p).name for p in watched)


async def test_a_person_typing_in_the_source_after_the_branch_is_recorded_once(
    rig: Any, tmp_path: Path
) -> None:
    """After the branch the gateway probes the branch only. A prompt typed into the source
    is the person's own: recorded once, on the sidecar's own marker, under a dedupe key of
    its own; the gateway's link and marker stay as the gateway left them. A second
    sidecar process's tick, on the same database, settling first, is not counted again."""
    install, kernel, monitor = rig
    install.codex_types_until(5)
    fifth = orjson.loads(install.source_lines[-1])["payload"]["turn_id"]
    install.gateway_adopts({"turnId": fifth, "userMessageCount": 1})
    assert await kernel.watch(watcher=MAIN, target=KEY)
    install.gateway_materializes_the_branch()
    link = (await monitor.links())[0].link

    # the first look after the branch: the branch's turn (typed there) on the gateway's
    # marker; the source is followed from the turn that marker named, with nothing after
    assert [("activity", 1)] == [(r.outcome, r.turns) for r in await monitor.ticker.tick()]
    assert not any(k.startswith("upstream-source:") for k, _ in install.records())
    gateways = install.marker()
    typed = install.person_types_into_source(1)
    assert [("activity", 1)] == [(r.outcome, r.turns) for r in await monitor.ticker.tick()]
    source_key = f"upstream-source:{KEY}:{link.source_key}:{typed}:1"
    assert install.records()[-1] == (source_key, 1)
    assert install.marker() == gateways  # the gateway's marker is the gateway's
    assert [("quiet", 0)] == [(r.outcome, r.turns) for r in await monitor.ticker.tick()]
    assert 1 == sum(k.startswith("upstream-source:") for k, _ in install.records())
    # the marker is kept beside this branch only: beside another (the gateway read the
    # source between the two), following begins again where the link then stands
    kept = await kernel.read(lambda c: links.follow_marker(c, link, install.source, install.branch))
    assert {"turnId": typed, "userMessageCount": 1} == kept
    other = await kernel.read(
        lambda c: links.follow_marker(c, link, install.source, "a-new-branch")
    )
    assert other is None
    notices = await kernel.notices(watcher=MAIN)
    assert [KEY] == [n.target for n in notices]

    # another sidecar process ticks between this one's read and its write: once
    again = install.person_types_into_source(2)
    adapter = monitor.adapters["codex-app-server"]
    inner = adapter.check

    async def other_first(probes: Any) -> Any:
        outcomes = await inner(probes)
        if any(p.follow and p.follow.marker and p.follow.marker["turnId"] == typed for p in probes):
            other = await Kernel.open(install.db, clock=ManualClock())
            try:
                roots = RootsConfig(codex=str(install.home / "sessions"))
                second = UpstreamMonitor.from_config(other, Config(roots=roots))
                assert [1] == [r.turns for r in await second.ticker.tick()]
            finally:
                await other.close()
        return outcomes

    adapter.check = other_first
    results = await monitor.ticker.tick()
    assert [("quiet", 0)] == [(r.outcome, r.turns) for r in results]
    keys = [k for k, _ in install.records() if k.startswith("upstream-source:")]
    assert keys == [source_key, f"upstream-source:{KEY}:{link.source_key}:{again}:1"]
    assert install.marker() == gateways


async def test_a_binding_of_another_generation_leaves_the_source_probed(rig: Any) -> None:
    """A binding written for an earlier session id is not this session's: the gateway
    probes the link's own thread, and so does the sidecar."""
    install, kernel, monitor = rig
    install.codex_types_until(1)
    install.gateway_adopts({"turnId": turn_ids(install.source)[0], "userMessageCount": 1})
    assert await kernel.watch(watcher=MAIN, target=KEY)
    install.gateway_materializes_the_branch(session_id="an-earlier-session")
    install.codex_types_until(2)
    assert [("activity", 2)] == [(r.outcome, r.turns) for r in await monitor.ticker.tick()]
    assert install.marker() == {"turnId": turn_ids(install.source)[1], "userMessageCount": 2}


async def test_whichever_sees_a_prompt_first_records_it_once(rig: Any) -> None:
    """The gateway's monitor records the turn and advances the shared marker first: the
    sidecar's check, read from the old marker, is refused and checks again from the new
    one, finding nothing."""
    install, kernel, monitor = rig
    install.codex_types_until(1)
    install.gateway_adopts({"turnId": turn_ids(install.source)[0], "userMessageCount": 1})
    assert await kernel.watch(watcher=MAIN, target=KEY)
    install.codex_types_until(2)
    link = (await monitor.links())[0].link
    adapter = monitor.adapters["codex-app-server"]
    inner_check = adapter.check

    async def gateway_first(probes: Any) -> Any:
        outcomes = await inner_check(probes)
        if probes[0].marker == {"turnId": turn_ids(install.source)[0], "userMessageCount": 1}:
            found = outcomes[0]
            key = f"upstream:{KEY}:{link.source_key}:{found.dedupe_id}"
            with sqlite3.connect(install.db) as conn:  # as the gateway's monitor writes it
                conn.execute(
                    "INSERT INTO session_state_events (dedupe_key, session_key, agent_id, kind,"
                    " actor_type, occurred_at, summary, payload_json) VALUES"
                    " (?, ?, 'main', 'human_direct_message', 'human', 1, 'human message',"
                    " '{\"turns\":2}')",
                    (key, KEY),
                )
                conn.execute(
                    "UPDATE session_upstream_links SET last_marker_json = ?",
                    (orjson.dumps(found.marker).decode(),),
                )
        return outcomes

    adapter.check = gateway_first
    results = await monitor.ticker.tick()
    assert [r.outcome for r in results] == ["quiet"]
    assert [n for _, n in install.records()] == [2]


async def test_a_link_waits_while_the_gateway_holds_its_bindings_lease(rig: Any) -> None:
    """The gateway holds its binding's lease while it changes the session's thread (it makes
    its branch): the link is skipped as a run in progress, and checked once the lease is
    released or has expired."""
    install, kernel, monitor = rig
    install.codex_types_until(1)
    install.gateway_adopts({"turnId": turn_ids(install.source)[0], "userMessageCount": 1})
    assert await kernel.watch(watcher=MAIN, target=KEY)
    now = kernel.clock()
    install.gateway_materializes_the_branch(lease_until=now + 65_000)
    (result,) = await monitor.ticker.tick()
    assert (result.outcome, result.reason) == (
        "skipped",
        "run active: the gateway holds its Codex binding's lease",
    )
    assert install.records() == []
    install.gateway_materializes_the_branch(lease_until=now - 1)  # expired: a gateway gone
    assert [("activity", 1)] == [(r.outcome, r.turns) for r in await monitor.ticker.tick()]
