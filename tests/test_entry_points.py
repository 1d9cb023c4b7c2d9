"""One change, every entry point: a person's turn in a group session, recorded through the
HTTP API, through the CLI and found by the tick in an adopted transcript, leaves the same
rows behind (the ambient watch of the agent's main session, its notice, the head) and the
same pending notice; a session created through the API or the CLI queues the same "New
session created" notice, read the same way by both."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from monitor.serve.root import running
from tests.helpers import Client, make_config, user_line

GROUP = "agent:main:telegram:group:x"
MAIN = "agent:main:main"
COORDINATOR = "agent:main:dashboard:coordinator"
ENTRY_POINTS = ("api", "cli", "tick")
# What each table keeps of the change, compared row by row: the columns that depend on who
# recorded it (the dedupe key the tick forms from its source, the wall-clock times) apart.
TABLES = {
    "session_state_events": (
        "sequence, session_key, agent_id, kind, actor_type, actor_id, run_id, summary, payload_json"
    ),
    "session_state_heads": "session_key, agent_id, last_sequence, pruned_max_sequence",
    "session_watch_cursors": (
        "watcher_session_key, watcher_store_path, target_session_key, last_seen_sequence,"
        " notified_sequence, material_sequence, provenance"
    ),
    "sessionwatch_opened_notices": "watcher_session_key, target_session_key, notified_sequence",
    "sessionwatch_created_notices": "main_session_key, created_key",
}


def cli(db: Path, config: Path, *args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "monitor", "--db", str(db), "--config", str(config), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    return orjson.loads(done.stdout)


def rows(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(db)
    try:
        return {
            table: conn.execute(f"SELECT {columns} FROM {table} ORDER BY 1, 2").fetchall()
            for table, columns in TABLES.items()
        }
    finally:
        conn.close()


def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "sessionwatch.toml"
    path.write_text(
        f'[roots]\nclaude = "{tmp_path / "claude"}"\n'
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n'
    )
    return path


async def two_turns(tmp_path: Path, entry: str) -> tuple[dict[str, Any], Any, Any]:
    """The group's transcript adopted, then two turns through ``entry``: the tables, and
    the main session's notices as the API and the CLI read them."""
    import aiohttp

    db = tmp_path / "state.db"
    config = make_config(tmp_path)
    transcript = tmp_path / "claude" / "group.jsonl"
    transcript.write_bytes(b"")
    async with running(config, db) as sidecar, aiohttp.ClientSession() as http:
        assert sidecar is not None
        client = Client(
            sidecar.addresses[0], (tmp_path / "token").read_text().strip(), http, sidecar
        )
        status, _ = await client.call(
            "POST",
            "/v1/links",
            {"kind": "claude", "path": str(transcript), "sessionKey": GROUP},
        )
        assert 200 == status
        watch = {"watcher": COORDINATOR, "target": GROUP}  # a transcript no one watches is
        assert 200 == (await client.call("POST", "/v1/watches", watch))[0]  # never checked
        turn = {
            "sessionKey": GROUP,
            "kind": "human_direct_message",
            "actorType": "human",
            "summary": "human message via claude",  # as the gateway's monitor writes it
        }
        for n in range(2):  # the first watches ambiently, the second opens its notice
            if entry == "api":
                assert 200 == (await client.call("POST", "/v1/events", turn))[0]
            elif entry == "cli":
                cli(
                    db,
                    config_file(tmp_path),
                    *("record", "--session", GROUP, "--kind", "human_direct_message"),
                    *("--actor", "human", "--summary", "human message via claude"),
                )
            else:
                with transcript.open("ab") as f:
                    f.write(user_line(f"what the group asked, {n}", f"u{n}"))
                assert await sidecar.ticks.run_tick({GROUP})  # serve's early check
        _, api_notices = await client.call("GET", f"/v1/watchers/{MAIN}/notices")
        cli_notices = cli(db, config_file(tmp_path), "notices", "--watcher", MAIN)
    return rows(db), api_notices, cli_notices


@pytest.mark.parametrize("entry", ENTRY_POINTS[1:])
async def test_group_turns_leave_the_same_rows_whoever_records_them(
    tmp_path_factory: pytest.TempPathFactory, entry: str
) -> None:
    """Against the API's: the ambient watch, its notice and its mark, the head, the event."""
    api = await two_turns(tmp_path_factory.mktemp("api"), "api")
    other = await two_turns(tmp_path_factory.mktemp(entry), entry)
    assert api[0] == other[0]
    watches = api[0]["session_watch_cursors"]
    assert [(COORDINATOR, GROUP, "explicit"), (MAIN, GROUP, "ambient-group")] == [
        (w[0], w[2], w[6]) for w in watches
    ]
    assert api[1] == other[1] == api[2] == other[2]
    assert 1 == len(api[1]["notices"])


async def test_a_session_created_through_the_cli_is_a_notice_the_api_reads(
    tmp_path: Path,
) -> None:
    """``sessionwatch session`` creates a session as ``PUT`` does: the "New session created"
    notice is queued for the main session, and the CLI and the API read the same."""
    import aiohttp

    db = tmp_path / "state.db"
    config = make_config(tmp_path)
    async with running(config, db) as sidecar, aiohttp.ClientSession() as http:
        assert sidecar is not None
        client = Client(
            sidecar.addresses[0], (tmp_path / "token").read_text().strip(), http, sidecar
        )
        cli(db, config_file(tmp_path), "session", "agent:main:subagent:one", "--session-id", "s1")
        put = {"sessionId": "s2"}
        assert 200 == (await client.call("PUT", "/v1/sessions/agent:main:subagent:two", put))[0]
        _, api = await client.call("GET", f"/v1/watchers/{MAIN}/notices")
        peeked = cli(db, config_file(tmp_path), "notices", "--watcher", MAIN)
        assert api == peeked
        assert [
            "Recent session creations (bounded summary; older entries may be omitted):",
            "- New session created: agent:main:subagent:two",
            "- New session created: agent:main:subagent:one",
        ] == api["notices"][0]["text"].splitlines()
        drained = cli(db, config_file(tmp_path), "notices", "--watcher", MAIN, "--drain")
        assert api == drained
        assert {"notices": []} == (await client.call("GET", f"/v1/watchers/{MAIN}/notices"))[1]
