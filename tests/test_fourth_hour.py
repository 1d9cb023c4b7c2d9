"""An hour of trying, fourth round: each point a new operator met, as they met it (the CLI,
the API, ``serve``), each failing without its fix."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from monitor.config import load_config, parse_config
from monitor.errors import ConfigError
from tests.helpers import Client, served_address

MAIN = "agent:main:main"
PEER = "agent:main:dashboard:peer"


def run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SESSIONWATCH_DB",)}
    return subprocess.run(
        [sys.executable, "-m", "monitor", *argv],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=cwd,
        timeout=60,
    )


# -- every relative path of the file means one thing -----------------------------------


def test_every_relative_path_of_the_file_is_read_against_its_directory(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    path = tmp_path / "etc" / "sw.toml"
    path.write_text(
        '[store]\npath = "state/state.db"\n'
        '[api]\ntoken_file = "token"\n'
        '[gateway]\nhooks_url = "http://127.0.0.1:1/hooks"\nhooks_token_file = "../hooks"\n'
        '[session]\nstore_path = "agents/{agentId}/sessions.json"\n'
        '[nodes.box]\nurl = "http://127.0.0.1:2"\ntoken_file = "box-token"\n'
    )
    config = load_config(path)
    etc = tmp_path / "etc"
    assert str(etc / "state" / "state.db") == config.store.path
    assert str(etc / "token") == config.api.token_file
    assert str(tmp_path / "hooks") == config.gateway.hooks_token_file
    assert str(etc / "agents" / "{agentId}" / "sessions.json") == config.session.store_path
    assert str(etc / "box-token") == config.nodes["box"].token_file
    assert "~/x.db" == parse_config({"store": {"path": "~/x.db"}}).store.path
    with pytest.raises(ConfigError, match=r"\[store\] path = 'x.db' is relative"):
        parse_config({"store": {"path": "x.db"}})  # no file to be relative to


def test_a_write_from_another_directory_goes_to_the_one_database(tmp_path: Path) -> None:
    """``serve`` run from /tmp and ``watch`` run from elsewhere: one database, the file's."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "elsewhere").mkdir()
    config = tmp_path / "etc" / "sw.toml"
    config.write_text('[store]\npath = "state.db"\n')
    argv = ["--config", str(config), "watch", "--watcher", "agent:main:main"]
    done = run(*argv, "--target", "agent:main:peer", cwd=tmp_path / "elsewhere")
    assert 0 == done.returncode, done.stderr
    assert (tmp_path / "etc" / "state.db").exists()
    assert [] == os.listdir(tmp_path / "elsewhere")


# -- a refused write writes nothing ------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["record", "--session", "agent:main:peer", "--kind", "bogus", "--actor", "human"],
        [
            "record",
            "--session",
            "agent:main:peer",
            "--kind",
            "goal_changed",
            "--actor",
            "human",
            "--payload",
            '{"channel": 5}',
        ],
        ["spawn", "--parent", "agent:main:main", "--child", "agent:main:main", "--run-id", "r"],
        ["adopt", "claude:no-such-session", "--session-key", "agent:main:peer"],
    ],
    ids=["kind", "payload", "self-spawn", "catalog-id"],
)
def test_a_refused_write_leaves_no_database_behind(tmp_path: Path, argv: list[str]) -> None:
    db = tmp_path / "typo" / "state.db"
    done = run("--db", str(db), *argv)
    assert 2 == done.returncode, done.stderr
    assert "Traceback" not in done.stderr
    assert [] == os.listdir(tmp_path)  # neither the file nor the directory made for it


def test_the_first_write_makes_the_database_where_it_was_named(tmp_path: Path) -> None:
    db = tmp_path / "new" / "state.db"
    argv = ["--db", str(db), "watch", "--watcher", "agent:main:main", "--target", "agent:main:p"]
    assert 0 == run(*argv).returncode
    assert ["state.db"] == sorted(os.listdir(db.parent))
    assert 0o600 == db.stat().st_mode & 0o777
    done = run("--db", str(db), "status", "agent:main:p")
    assert 0 == done.returncode, done.stderr


# -- the API -------------------------------------------------------------------------------


async def test_routes_that_take_no_body_refuse_fields_by_name(client: Client) -> None:
    await client.call("POST", "/v1/watches", {"watcher": MAIN, "target": PEER})
    turn = {"sessionKey": PEER, "kind": "human_direct_message", "actorType": "human"}
    assert 200 == (await client.call("POST", "/v1/events", turn))[0]
    drain = f"/v1/watchers/{MAIN}/notices/drain"
    status, answer = await client.call("POST", drain, {"all": True})
    assert 400 == status and "unknown field 'all'" in answer["error"]["message"], answer
    status, answer = await client.call("GET", f"/v1/watchers/{MAIN}/notices")
    assert 1 == len(answer["notices"])  # the refused drain drained nothing
    status, answer = await client.call("POST", drain, {})
    assert (200, 1) == (status, len(answer["notices"]))
    reset = f"/v1/sessions/{PEER}/reset"
    status, answer = await client.call("POST", reset, {"agentId": "main"})
    assert 400 == status and "unknown field 'agentId'" in answer["error"]["message"], answer
    assert 200 == (await client.call("POST", reset))[0]


async def test_a_key_not_in_composed_form_is_refused_as_a_look_alike(client: Client) -> None:
    """``café`` with a combining accent prints as ``café`` with ``é``: one is refused, by
    name, as invisible characters are; the composed one is a session like any other."""
    turn = {"kind": "human_direct_message", "actorType": "human"}
    composed, decomposed = "agent:main:caf\u00e9", "agent:main:cafe\u0301"
    status, answer = await client.call("POST", "/v1/events", {**turn, "sessionKey": decomposed})
    assert 400 == status and "composed form (NFC)" in answer["error"]["message"], answer
    assert 200 == (await client.call("POST", "/v1/events", {**turn, "sessionKey": composed}))[0]


@pytest.mark.parametrize("path", ["sessions.json", "./s/sessions.json", "/s/../../etc/x"])
async def test_a_relative_or_climbing_store_path_is_refused(client: Client, path: str) -> None:
    status, answer = await client.call(
        "POST", "/v1/watches", {"watcher": MAIN, "target": PEER, "storePath": path}
    )
    assert 400 == status and "absolute path without '..'" in answer["error"]["message"], answer
    status, _ = await client.call(
        "POST", "/v1/watches", {"watcher": MAIN, "target": PEER, "storePath": "/s/sessions.json"}
    )
    assert 200 == status


@pytest.mark.parametrize("gateway", [True, False])
def test_serve_says_at_start_where_its_wakes_go(tmp_path: Path, gateway: bool) -> None:
    token = tmp_path / "hooks-token"
    token.write_text("t\n")
    token.chmod(0o600)
    hooks = f'[gateway]\nhooks_url = "http://127.0.0.1:9/hooks"\nhooks_token_file = "{token}"\n'
    config = tmp_path / "sw.toml"
    config.write_text(
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n'
        + (hooks if gateway else "")
    )
    env = {**os.environ, "HOME": str(tmp_path), "OPENCLAW_STATE_DIR": str(tmp_path / "none")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "--db", str(tmp_path / "s.db"), "--config",
         str(config), "serve"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )  # fmt: skip
    said: list[str] = []
    try:
        served_address(proc, said)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    text = "".join(said)
    if gateway:
        assert f"wakes go to http://127.0.0.1:9/hooks/wake (the token in {token})" in text, text
    else:
        assert "no wakes: no [gateway] hooks_url, and no OpenClaw next to" in text, text


def test_config_prints_the_roots_as_serve_and_doctor_read_them(tmp_path: Path) -> None:
    config = tmp_path / "sw.toml"
    config.write_text('[roots]\nclaude = "~/somewhere/claude"\n')
    env = {**os.environ, "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "monitor", "--config", str(config), "config"],
        capture_output=True, text=True, env=env, check=False, timeout=60,
    )  # fmt: skip
    assert 0 == done.returncode, done.stderr
    assert f"{tmp_path}/somewhere/claude" == orjson.loads(done.stdout)["roots"]["claude"]


def test_doctor_reading_another_programs_database_makes_no_wal_nor_shm(tmp_path: Path) -> None:
    """A WAL database of another program's, 0644, nothing beside it: the read that tells
    whose it is makes no -wal nor -shm (they would take its 0644)."""
    import sqlite3

    db = tmp_path / "other.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE theirs (a)")
    conn.commit()
    conn.close()
    db.chmod(0o644)
    env = {**os.environ, "HOME": str(tmp_path)}
    subprocess.run(
        [sys.executable, "-m", "monitor", "--db", str(db), "doctor"],
        capture_output=True, text=True, env=env, check=False, timeout=60,
    )  # fmt: skip
    assert ["other.db"] == sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("other"))


async def test_a_key_too_long_for_the_request_line_is_said_in_our_words(client: Client) -> None:
    """aiohttp's own message quoted the raw line back; ours says what the limits are."""
    status, answer = await client.call("GET", f"/v1/sessions/agent:main:{'x' * 10_000}")
    assert 400 == status, answer
    message = answer["error"]["message"]
    assert "a session key is at most 512 characters" in message and "xxxx" not in message


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="sysfs refuses a mkdir, even root's")
def test_a_home_that_does_not_exist_is_named_as_the_cause(tmp_path: Path) -> None:
    """HOME naming a directory that does not exist (and cannot be made): the message says
    so, not "permission denied ... must be writable" about a directory that is not there."""
    env = {k: v for k, v in os.environ.items() if k != "SESSIONWATCH_DB"}
    done = subprocess.run(
        [sys.executable, "-m", "monitor", "record", "--session", "agent:main:x", "--kind",
         "goal_changed", "--actor", "human"],
        capture_output=True, text=True, env={**env, "HOME": "/sys/nohome"}, check=False,
        timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode != 0
    assert "the home directory /sys/nohome does not exist (HOME is unset" in done.stderr, done
    assert "Traceback" not in done.stderr
