"""The ``sessionwatch`` CLI as scripts drive it: separate processes on one database file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.helpers import REPO, notice, user_line

MAIN = "agent:main:main"
CHILD = "agent:main:subagent:child"


def sw(db: Path | str, *args: str, code: int = 0) -> Any:
    """``sessionwatch --db DB ARGS``: the answer as JSON, or (with ``code``) the one-line
    error; ``db`` a SQLite file or a PostgreSQL URL."""
    proc = subprocess.run(
        [sys.executable, "-m", "monitor", "--db", str(db), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert code == proc.returncode, proc.stderr
    if code:
        assert proc.stdout == ""
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr
        return proc.stderr
    return orjson.loads(proc.stdout)


def test_a_spawn_then_human_turns_give_one_notice_across_processes(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    spawned = sw(db, "spawn", "--parent", MAIN, "--child", CHILD, "--run-id", "r1")
    assert {
        "sequence": 1,
        "sessionKey": CHILD,
        "agentId": "main",
        "kind": "child_spawned",
        "actorType": "agent",
        "actorId": MAIN,
        "summary": "child session spawned",
        "occurredAt": spawned["occurredAt"],
        "payload": None,
        "duplicate": False,
    } == spawned
    for _ in range(3):
        sw(db, "record", "--session", CHILD, "--kind", "human_direct_message", "--actor", "human")
    expected = {"notices": [{"target": CHILD, "text": notice(CHILD, 1)}]}
    assert expected == sw(db, "notices", "--watcher", MAIN)
    assert expected == sw(db, "notices", "--watcher", MAIN, "--drain")
    assert {"notices": [{"target": CHILD, "text": notice(CHILD, 2)}]} == sw(
        db, "notices", "--watcher", MAIN, "--drain"
    )
    assert sw(db, "notices", "--watcher", MAIN) == {"notices": []}
    status = sw(db, "status", CHILD, "--changes-since", "3")
    assert [e["sequence"] for e in status["stateChanges"]["events"]] == [4]
    assert sw(db, "sessions") == {
        "sessions": [{"sessionKey": CHILD, "agentId": "main", "stateVersion": 4, "doing": None}]
    }


def test_record_dedupe_and_payload(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    args = [
        "record",
        "--session",
        "global",
        "--agent",
        "ops",
        "--kind",
        "goal_changed",
        "--actor",
        "system",
        "--dedupe-key",
        "goal:1",
        "--summary",
        "goal created",
    ]
    first = sw(db, *args)
    again = sw(db, *args)
    assert (first["sequence"], False, True) == (
        again["sequence"],
        first["duplicate"],
        again["duplicate"],
    )
    assert (first["agentId"], first["summary"]) == ("ops", "goal created")


def test_watch_reset_delete_and_prune(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    assert sw(db, "watch", "--watcher", MAIN, "--target", CHILD) == {"watched": True}
    refused = subprocess.run(
        [sys.executable, "-m", "monitor", "--db", str(db), "watch", "--watcher", "global",
         "--target", CHILD], capture_output=True, text=True, check=False,
    )  # fmt: skip
    why = 'the watcher "global" is not an agent-qualified key (agent:<agentId>:<rest>)'
    assert refused.returncode == 1  # refused: a script does not carry on as if it worked
    assert {"watched": False, "reason": why} == orjson.loads(refused.stdout)
    assert refused.stderr == f"sessionwatch: not watched: {why}\n"
    sw(db, "record", "--session", CHILD, "--kind", "goal_changed", "--actor", "human")
    assert sw(db, "reset", MAIN) == {"ok": True}
    assert sw(db, "notices", "--watcher", MAIN) == {"notices": []}
    assert sw(db, "delete", CHILD) == {"ok": True}
    assert sw(db, "status", CHILD)["stateVersion"] == 0
    sw(
        db,
        "record",
        "--session",
        CHILD,
        "--kind",
        "goal_changed",
        "--actor",
        "human",
        "--occurred-at",
        "0",
    )
    pruned = sw(db, "prune", "--now", str(4_000_000_000_000))
    assert pruned == {"deletedEvents": 1, "deletedCursors": 0, "stampedSessions": 1}


@pytest.mark.parametrize(
    "args",
    [
        ["record", "--session", CHILD, "--kind", "bogus", "--actor", "human"],
        ["record", "--session", CHILD, "--kind", "goal_changed", "--actor", "robot"],
        ["record", "--session", "global", "--kind", "goal_changed", "--actor", "human"],
        [
            "record",
            "--session",
            CHILD,
            "--kind",
            "goal_changed",
            "--actor",
            "human",
            "--payload",
            "{not json",
        ],
        [
            "record",
            "--session",
            CHILD,
            "--kind",
            "goal_changed",
            "--actor",
            "human",
            "--occurred-at",
            "yesterday",
        ],
        ["status", CHILD, "--changes-since", "-1"],
        ["recrod"],
        ["sessions", "--state", "sleeping"],
        ["notices", "--watcher", "global"],
        ["spawn", "--parent", "global", "--child", CHILD, "--run-id", "r"],
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    tmp_path: Path, args: list[str]
) -> None:
    db = tmp_path / "state.db"
    sw(db, "record", "--session", CHILD, "--kind", "goal_changed", "--actor", "human")
    message = sw(db, *args, code=2)
    assert message.startswith("sessionwatch: ")
    assert sw(db, "sessions") == {
        "sessions": [{"sessionKey": CHILD, "agentId": "main", "stateVersion": 1, "doing": None}]
    }


def test_host_and_store_url_are_checked_and_the_password_never_shown(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[host]\nid = "gw 1"\n')
    err = sw(tmp_path / "x.db", "--config", str(config), "config", code=2)
    assert "[host] id must be letters, digits" in err
    config.write_text('[store]\nurl = "mysql://x"\n')
    err = sw(tmp_path / "x.db", "--config", str(config), "config", code=2)
    assert "[store] url must be a postgresql:// URL" in err
    config.write_text('[store]\nurl = "postgresql://gw:s3cret@db.example/sw"\n[host]\nid = "gw1"\n')
    shown = sw(tmp_path / "x.db", "--config", str(config), "config")
    assert "s3cret" not in orjson.dumps(shown).decode()
    assert ("postgresql://gw:***@db.example/sw", "gw1") == (
        shown["store"]["url"],
        shown["host"]["id"],
    )


def test_serve_where_the_database_directory_cannot_be_made_says_so_in_one_line() -> None:
    err = sw("/proc/sessionwatch-test/state.db", "serve", code=1)
    assert "cannot take the instance lock /proc/sessionwatch-test/state.db.lock" in err
    assert "must be writable by this user" in err


def test_adopting_a_path_that_does_not_exist_is_refused_and_writes_nothing(
    tmp_path: Path,
) -> None:
    root = tmp_path / "claude"
    root.mkdir()
    config = tmp_path / "c.toml"
    config.write_text(f'[roots]\nclaude = "{root}"\n')
    db = tmp_path / "s.db"
    sw(db, "record", "--session", MAIN, "--kind", "goal_changed", "--actor", "human")
    said = sw(db, "--config", str(config), "adopt", "--kind", "claude", "--session-key", CHILD,
              "--path", str(root / "missing.jsonl"), code=2)  # fmt: skip
    assert f"no such file: {root / 'missing.jsonl'}" in said
    assert sw(db, "status", CHILD)["stateVersion"] == 0  # no session, no adopted event
    assert sw(db, "links")["links"] == []


def test_a_declined_adoption_exits_1_with_its_reason(tmp_path: Path) -> None:
    """A file that exists but cannot be read now (a FIFO) is adopted without a link, as
    OpenClaw's continuation does: the session is still adopted (its record is there), JSON
    on stdout as always, the reason on stderr, and an exit code that says so."""
    root = tmp_path / "claude"
    root.mkdir()
    os.mkfifo(root / "missing.jsonl")
    config = tmp_path / "c.toml"
    config.write_text(f'[roots]\nclaude = "{root}"\n')
    argv = ["--config", str(config), "adopt", "--kind", "claude", "--session-key", CHILD]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "monitor",
            "--db",
            str(tmp_path / "s.db"),
            *argv,
            "--path",
            str(root / "missing.jsonl"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert 1 == proc.returncode
    assert {
        "link": None,
        "declined": f"cannot read {root / 'missing.jsonl'}: not a regular file (a FIFO)",
        "warnings": [],
    } == orjson.loads(proc.stdout)
    assert "adopted without a link: cannot read" in proc.stderr


def test_deleting_a_bare_key_needs_its_agent(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    assert "is a bare key, a session of every agent" in sw(db, "delete", "global", code=2)
    assert {"ok": True} == sw(db, "delete", "global", "--agent", "main")


def test_config_shows_the_database_db_or_the_environment_chose(tmp_path: Path) -> None:
    shown = sw(tmp_path / "chosen.db", "config")
    assert str(tmp_path / "chosen.db") == shown["store"]["effective"]
    proc = subprocess.run(
        [sys.executable, "-m", "monitor", "config"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "SESSIONWATCH_DB": "postgresql://sw:s3cret@db.example/sw"},
    )
    assert "postgresql://sw:***@db.example/sw" == orjson.loads(proc.stdout)["store"]["effective"]
    assert "s3cret" not in proc.stdout


def test_a_listen_address_without_a_port_is_refused_before_anything_is_made(
    tmp_path: Path,
) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[api]\nlisten = "127.0.0.1"\n')
    db = tmp_path / "new" / "state.db"
    err = sw(db, "--config", str(config), "serve", code=2)
    assert "[api] listen must be HOST:PORT" in err
    assert not db.parent.exists()


@pytest.mark.parametrize("command", ["serve", "node"])
def test_a_token_file_that_cannot_be_made_is_one_line(tmp_path: Path, command: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[api]\nlisten = "127.0.0.1:0"\ntoken_file = "/proc/sw-test/token"\n')
    args = ["--listen", "127.0.0.1:0", "--token-file", "/proc/sw-test/token"]
    extra = args if command == "node" else []
    err = sw(tmp_path / "s.db", "--config", str(config), command, *extra, code=1)
    assert "cannot write the API token file /proc/sw-test/token" in err


def test_a_configuration_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    err = sw(tmp_path / "s.db", "--config", str(fifo), "config", code=2)
    assert f"cannot read configuration {fifo}: not a regular file" in err


def test_a_roots_key_no_format_has_is_refused_with_the_nearest(tmp_path: Path) -> None:
    """``[roots]`` takes the keys the formats register (the registry says which): a typo
    exits 2 naming the known keys and the nearest one; a value that is no string too."""
    config = tmp_path / "c.toml"
    config.write_text('[roots]\nclaud = "/somewhere"\n')
    err = sw(tmp_path / "s.db", "--config", str(config), "config", code=2)
    assert "unknown key [roots] claud" in err and "did you mean claude?" in err
    assert "opencode_db" in err  # the known keys
    config.write_text("[roots]\nclaude = 3\n")
    err = sw(tmp_path / "s.db", "--config", str(config), "config", code=2)
    assert "[roots] claude must be a string" in err
    config.write_text('[roots]\nopencode_db = "/x/opencode.db"\n')
    shown = sw(tmp_path / "s.db", "--config", str(config), "config")
    assert "/x/opencode.db" == shown["roots"]["opencode_db"]
    assert shown["roots"]["claude"].endswith(".claude/projects")  # the default, shown


def test_an_unknown_section_or_key_names_the_nearest_known_one(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    for text, said in (
        ("[monitr]\n", "unknown section [monitr]; did you mean monitor?"),
        ("[monitor]\ninterval = 5\n", "unknown key [monitor] interval; did you mean interval_s?"),
        ("[api]\nlisten_on = 1\n", "unknown key [api] listen_on; did you mean listen?"),
        ("[api]\nzzz = 1\n", "unknown key [api] zzz"),
    ):
        config.write_text(text)
        err = sw(tmp_path / "s.db", "--config", str(config), "config", code=2)
        assert said in err
    assert "did you mean" not in err  # nothing near: nothing guessed


@pytest.mark.parametrize(
    "args",
    [
        ["status", MAIN],
        ["sessions"],
        ["links"],
        ["notices", "--watcher", MAIN],
        ["notices", "--watcher", MAIN, "--follow"],
    ],
)
def test_a_command_that_only_reads_creates_no_database(tmp_path: Path, args: list[str]) -> None:
    """A typo in --db is refused, naming the path and what chose it; nothing is left."""
    typo = tmp_path / "stat-typo.db"
    said = sw(typo, *args, code=2)
    assert f"no state database at {typo} (chosen by --db)" in said
    assert list(tmp_path.iterdir()) == []


def test_the_catalog_lists_before_any_database_exists_and_makes_none(tmp_path: Path) -> None:
    (tmp_path / "claude" / "p").mkdir(parents=True)
    (tmp_path / "claude" / "p" / "s.jsonl").write_bytes(
        b'{"type":"user","uuid":"u","message":{"role":"user","content":"hello"}}\n'
    )
    config = tmp_path / "c.toml"
    config.write_text(f'[roots]\nclaude = "{tmp_path / "claude"}"\n')
    found = sw(tmp_path / "none.db", "--config", str(config), "catalog", "--json")
    assert [s["title"] for s in found["sessions"]] == ["hello"]
    assert not (tmp_path / "none.db").exists()
    sw(tmp_path / "new.db", "record", "--session", MAIN, "--kind", "goal_changed",
       "--actor", "human")  # fmt: skip
    assert (tmp_path / "new.db").exists()  # a command that writes creates it


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("interval_s = nan", "[monitor] interval_s must be a finite number"),
        ("interval_s = inf", "[monitor] interval_s must be a finite number"),
        ("adapter_budget_s = nan", "[monitor] adapter_budget_s must be a finite number"),
        ("interval_s = 864000", "[monitor] interval_s must be at most 86,400"),
        ("scan_cap_bytes = 99999999999999999999", "[monitor] scan_cap_bytes must be at most"),
        ("export_concurrency = 100000", "[monitor] export_concurrency must be at most 64"),
    ],
)
@pytest.mark.parametrize("command", ["config", "tick", "doctor"])
def test_numbers_must_be_finite_and_in_range(
    tmp_path: Path, setting: str, says: str, command: str
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f"[monitor]\n{setting}\n")
    said = sw(tmp_path / "s.db", "--config", str(config), command, code=2)
    assert says in said
    gateway = tmp_path / "g.toml"
    gateway.write_text("[gateway]\nretry_interval_s = nan\n")
    assert "must be a finite number" in sw(tmp_path / "s.db", "--config", str(gateway),
                                            command, code=2)  # fmt: skip


def test_log_format_json_says_a_fatal_start_up_error_as_json(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    for fmt in (["--log-format", "json"], ["--log-format=json"]):
        done = subprocess.run(
            [sys.executable, "-m", "monitor", *fmt, "--db", str(blocker / "x.db"), "serve"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert done.returncode == 1
        (line,) = done.stderr.splitlines()
        said = orjson.loads(line)
        assert (said["level"], said["logger"]) == ("ERROR", "sessionwatch")
        assert str(blocker) in said["message"]


def test_a_node_without_its_token_file_names_the_missing_key(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[nodes.lap]\nurl = "http://127.0.0.1:9"\n')
    said = sw(tmp_path / "s.db", "--config", str(config), "config", code=2)
    assert "[nodes.lap] needs token_file = ..." in said
    assert "__new__" not in said


def test_every_option_says_what_it_means_and_a_usage_error_shows_the_usage(
    tmp_path: Path,
) -> None:
    from monitor.cli import COMMANDS

    for name, declared in COMMANDS.items():
        for flags, options in declared.arguments:
            assert options.get("help"), f"{name} {flags[0]} has no help"
    said = sw(tmp_path / "s.db", "record", "--session", MAIN, "--text", "x", code=2)
    assert "usage: sessionwatch record [-h] --session SESSION --kind KIND" in said


def test_readopting_a_key_and_adopting_a_linked_source_are_said(tmp_path: Path) -> None:
    """Re-adopting a key onto another file, or adopting a file already linked to another
    key, is allowed, and said: in the answer's warnings and as a note on stderr; the
    catalog lists every key of a source."""
    root = tmp_path / "claude" / "p"
    root.mkdir(parents=True)
    for name in ("a", "b"):
        (root / f"{name}.jsonl").write_bytes(
            b'{"type":"user","uuid":"u","message":{"role":"user","content":"' + name.encode()
            + b'"}}\n'
        )  # fmt: skip
    config = tmp_path / "c.toml"
    config.write_text(f'[roots]\nclaude = "{tmp_path / "claude"}"\n')
    base = [
        sys.executable,
        "-m",
        "monitor",
        "--db",
        str(tmp_path / "s.db"),
        "--config",
        str(config),
    ]

    def adopt(name: str, key: str) -> subprocess.CompletedProcess[str]:
        path = str(root / f"{name}.jsonl")
        argv = [*base, "adopt", "--kind", "claude", "--path", path, "--session-key", key]
        return subprocess.run(argv, capture_output=True, text=True, check=False)

    assert adopt("a", CHILD).stderr == ""
    moved = adopt("b", CHILD)
    assert orjson.loads(moved.stdout)["warnings"] == [
        f"{CHILD} was linked to {root / 'a.jsonl'}; it now follows this source"
    ]
    assert "note: " in moved.stderr and moved.returncode == 0
    shared = adopt("b", "agent:main:subagent:other")
    assert f"this source is also linked to {CHILD}" in shared.stderr
    found = sw(tmp_path / "s.db", "--config", str(config), "catalog", "--json")
    (b,) = [s for s in found["sessions"] if s["path"].endswith("b.jsonl")]
    assert b["sessionKeys"] == ["agent:main:subagent:child", "agent:main:subagent:other"]


def test_a_node_serves_plain_http_on_loopback_only(tmp_path: Path) -> None:
    """Without --tls a node refuses an address other machines reach, with the way out."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "monitor", "node", "--listen", "0.0.0.0:0"]
    argv += ["--token-file", str(tmp_path / "node.token")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert 1 == done.returncode, done.stderr  # a configuration error, as serve's
    assert "plain HTTP is served on loopback only" in done.stderr
    assert "--tls" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "node.token").exists()  # refused before anything is made


def test_a_command_that_ends_at_once_prints_all_of_a_long_answer(tmp_path: Path) -> None:
    """``status`` ends without the interpreter's teardown (monitor.cli.run): what it printed
    is flushed first, so a 200-event answer arrives whole
    through a pipe, and a recorded event is there for the next process."""
    import asyncio

    from monitor.kernel import Kernel, NewEvent
    from monitor.kernel.events import ActorType, EventKind

    db = tmp_path / "state.db"

    async def fill() -> None:
        kernel = await Kernel.open(db)
        try:
            for i in range(250):
                kind, actor = EventKind.HUMAN_DIRECT_MESSAGE, ActorType.HUMAN
                await kernel.record(NewEvent(CHILD, kind, actor, dedupe_key=f"d{i}"))
        finally:
            await kernel.close()

    asyncio.run(fill())
    answer = sw(db, "status", CHILD, "--changes-since", "0")
    assert 200 == len(answer["stateChanges"]["events"])
    assert len(orjson.dumps(answer)) > 16_384  # stdio buffers 8 KiB
    sw(db, "record", "--session", CHILD, "--kind", "human_direct_message", "--actor", "human")
    assert 251 == sw(db, "status", CHILD)["stateVersion"]


def test_replay_ends_at_once_and_prints_every_turn(tmp_path: Path) -> None:
    """``replay`` ends without the interpreter's teardown too, once no other thread is
    alive: every turn's line arrives through a pipe, then the summary."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(user_line(f"prompt {i}", f"u{i}") for i in range(3000)))
    proc = subprocess.run(
        [sys.executable, "-m", "monitor", "replay", "--adapter", "claude", str(path)],
        capture_output=True,
        check=False,
    )
    assert 0 == proc.returncode, proc.stderr
    lines = [orjson.loads(x) for x in proc.stdout.splitlines()]
    assert len(proc.stdout) > 65_536  # more than a pipe holds
    assert [x["id"] for x in lines[:-1]] == [f"u{i}" for i in range(3000)]
    assert (lines[-1]["type"], lines[-1]["humanTurns"]) == ("summary", 3000)


def test_sessions_by_what_they_are_doing(tmp_path: Path) -> None:
    """``sessions --state``: a Pi session adopted, its first turn written as Pi 1.6.0 wrote
    it, a tick: waiting, with its state version; not working; ``--state`` of a few."""
    captured = REPO / "tests" / "fixtures" / "states"
    lines = (captured / "pi-1.6.0.jsonl").read_bytes().splitlines(keepends=True)
    ends = orjson.loads((captured / "pi-1.6.0.json").read_bytes())["ends"]
    root = tmp_path / "pi" / "--w--"
    root.mkdir(parents=True)
    path = root / "2026-12-06T10-00-00_s.jsonl"
    path.write_bytes(lines[0])
    config = tmp_path / "sw.toml"
    config.write_text(f'[roots]\npi = "{tmp_path / "pi"}"\n')
    db, key = tmp_path / "state.db", "agent:main:adopted:pi"

    def run(*args: str) -> Any:
        return sw(db, "--config", str(config), *args)

    run("adopt", "--kind", "pi", "--path", str(path), "--session-key", key)
    run("watch", "--watcher", MAIN, "--target", key)
    path.write_bytes(b"".join(lines[: ends["ends"]]))
    run("tick")
    [found] = run("sessions", "--state", "asking,waiting")["sessions"]
    assert (key, "waiting", "pi-cli") == (
        found["sessionKey"], found["doing"]["state"], found["doing"]["upstreamKind"]
    )  # fmt: skip
    assert found["stateVersion"] >= 1 and found["doing"]["since"]
    assert [] == run("sessions", "--state", "working")["sessions"]
