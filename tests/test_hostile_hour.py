"""An hour of trying, third round: each point a new user or a hostile one met, as they met
it (the CLI, the API, ``serve``), each failing without its fix."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.config import load_config, parse_config
from monitor.errors import AlreadyRunning, ConfigError
from monitor.serve.root import running
from tests.helpers import REPO, Client, make_config, served_address, user_line
from tests.test_cli import sw

RELEASES = REPO / "tests" / "fixtures" / "releases"


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "monitor", *argv],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


# -- roots -----------------------------------------------------------------------------


def test_an_empty_root_is_refused_naming_the_key(tmp_path: Path) -> None:
    """Not the directory the command runs in: adopt, catalog and doctor never see it."""
    config = tmp_path / "sw.toml"
    config.write_text('[roots]\nclaude = ""\n')
    adopt = ["adopt", "--kind", "claude", "--path", "/anywhere/x.jsonl", "--session-key", "k"]
    for argv in (["catalog"], adopt):
        done = run("--db", str(tmp_path / "s.db"), "--config", str(config), *argv)
        assert 2 == done.returncode, done.stderr
        assert "[roots] claude is empty" in done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "s.db").exists()


def test_a_relative_root_is_read_against_the_configuration_files_directory(
    tmp_path: Path,
) -> None:
    (tmp_path / "etc").mkdir()
    path = tmp_path / "etc" / "sw.toml"
    path.write_text('[roots]\ncodex = "relative/dir"\n')
    assert str(tmp_path / "etc" / "relative" / "dir") == load_config(path).roots.codex
    with pytest.raises(ConfigError, match="relative"):  # no file to be relative to
        parse_config({"roots": {"codex": "relative/dir"}})


# -- tokens in clear text ----------------------------------------------------------------


def test_a_hooks_url_in_clear_text_to_another_host_is_refused_unless_meant() -> None:
    gateway = {"hooks_url": "http://192.0.2.10:18789/hooks", "hooks_token_file": "/t"}
    with pytest.raises(ConfigError, match=r"192\.0\.2\.10.*allow_plain_http"):
        parse_config({"gateway": gateway})
    assert parse_config({"gateway": {**gateway, "allow_plain_http": True}}).gateway.wakes
    for ok in ("http://127.0.0.1:18789/hooks", "http://[::1]:1/hooks", "https://gw.lan/hooks"):
        assert parse_config({"gateway": {**gateway, "hooks_url": ok}}).gateway.wakes


def test_open_hands_the_token_to_this_sidecars_own_address_only(tmp_path: Path) -> None:
    """``open --url`` naming another server is refused before any call: that server never
    hears the token."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    config = tmp_path / "sw.toml"
    config.write_text(f'[api]\nlisten = "127.0.0.1:8765"\ntoken_file = "{tmp_path / "t"}"\n')
    (tmp_path / "t").write_text("a-token-long-enough-0123456789abcdef\n")
    (tmp_path / "t").chmod(0o600)
    try:
        done = run("--config", str(config), "open", "--url", f"http://127.0.0.1:{port}")
        assert 2 == done.returncode, done.stderr
        assert "not where this sidecar serves" in done.stderr
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing came
    finally:
        listener.close()


# -- one serve per database file ---------------------------------------------------------


async def test_a_hard_link_in_another_runtime_directory_is_the_same_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock is on the database file itself: another ``XDG_RUNTIME_DIR`` changes nothing,
    and nothing piles up in the runtime directory."""
    config = make_config(tmp_path)
    db = tmp_path / "state.db"
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    async with running(config, db):
        (tmp_path / "other").mkdir()
        os.link(db, tmp_path / "other" / "alias.db")
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "elsewhere"))
        with pytest.raises(AlreadyRunning, match="hard link"):
            async with running(config, tmp_path / "other" / "alias.db"):
                pass
    assert [] == list(runtime.iterdir())


def test_an_unclean_stop_of_the_first_release_upgrades_its_wal_and_shm(tmp_path: Path) -> None:
    """Its ``-wal`` was left 0644: serve makes the database, its WAL and its SHM 0600 and
    says so once, instead of refusing the SHM its own check made."""
    db = tmp_path / "state.db"
    shutil.copy(RELEASES / "865cf60.db", db)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("INSERT INTO sessionwatch_meta VALUES ('left', 'in the wal')")
    conn.commit()
    shutil.copy(db, tmp_path / "copy.db")
    shutil.copy(f"{db}-wal", tmp_path / "copy.db-wal")  # as a SIGKILL leaves it
    conn.close()
    os.replace(tmp_path / "copy.db", db)
    os.replace(tmp_path / "copy.db-wal", f"{db}-wal")
    for path in (db, Path(f"{db}-wal")):
        path.chmod(0o644)
    config = tmp_path / "sw.toml"
    config.write_text(f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "--db", str(db), "--config", str(config), "serve"],
        stderr=subprocess.PIPE,
        text=True,
    )
    said: list[str] = []
    try:
        served_address(proc, said)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert 1 == sum("set to 0600" in line for line in said), said
    assert 0o600 == db.stat().st_mode & 0o777


# -- one clear line --------------------------------------------------------------------


async def test_a_payload_nested_a_thousand_deep_is_a_400(client: Client) -> None:
    """1,000 deep is a client's mistake, said in one line; 500 deep is read."""
    head = b'{"sessionKey": "agent:main:x", "kind": "goal_changed", "actorType": "human",'
    deep = head + b' "payload": {"x": ' + b"[" * 1000 + b"]" * 1000 + b"}}"
    status, answer = await client.call("POST", "/v1/events", raw=deep)
    assert 400 == status and "nested too deep" in answer["error"]["message"]
    fine = head + b' "payload": {"x": ' + b"[" * 500 + b"]" * 500 + b"}}"
    assert 200 == (await client.call("POST", "/v1/events", raw=fine))[0]


def test_a_client_that_hangs_up_mid_body_leaves_no_traceback(tmp_path: Path) -> None:
    config = tmp_path / "sw.toml"
    config.write_text(f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "--db", str(tmp_path / "s.db"), "--config",
         str(config), "serve"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        base = served_address(proc)
        host, port = base.removeprefix("http://").rsplit(":", 1)
        token = (tmp_path / "token").read_text().strip()
        for _ in range(20):
            with socket.create_connection((host, int(port))) as s:
                s.sendall(
                    b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type:"
                    b" application/json\r\nAuthorization: Bearer " + token.encode() +
                    b"\r\nContent-Length: 100\r\n\r\n{\"sessionKey\":"
                )  # fmt: skip
        run("--db", str(tmp_path / "s.db"), "status", "agent:main:x")  # it still answers
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err, err


@pytest.mark.parametrize("value", ["1e-300", "0.01", "0"])
def test_a_tick_interval_below_the_minimum_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match=r"interval_s must (be at least 0.1 s|be positive)"):
        parse_config({"monitor": {"interval_s": float(value)}})


@pytest.mark.parametrize("version", ["abc", "4.0", "-1"])
def test_a_schema_version_that_is_no_number_is_one_clear_line(tmp_path: Path, version: str) -> None:
    db = tmp_path / "state.db"
    sw(db, "record", "--session", "agent:main:x", "--kind", "goal_changed", "--actor", "human")
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE sessionwatch_meta SET value = ? WHERE key = 'schema_version'",
                     (version,))  # fmt: skip
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the image is the whole database
    conn.close()
    image = db.read_bytes()
    for argv in (["status", "agent:main:x"], ["serve"]):
        done = run("--db", str(db), *argv)
        assert 0 != done.returncode
        assert "not a whole number" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert image == db.read_bytes()


def test_an_empty_db_flag_is_refused_not_the_default(tmp_path: Path) -> None:
    done = run("--db", "", "status", "agent:main:x", env={"HOME": str(tmp_path)})
    assert 2 == done.returncode
    assert "--db is empty" in done.stderr
    assert not (tmp_path / ".local").exists()


# -- what the catalog and the log say -----------------------------------------------------


def test_the_catalog_lists_transcripts_with_odd_first_lines(tmp_path: Path) -> None:
    """A BOM, invalid UTF-8, a lone surrogate escape: read by the monitor, so listed."""
    root = tmp_path / "claude" / "p"
    root.mkdir(parents=True)
    shutil.copy(REPO / "sample_transcripts" / "claude_odd_bytes.jsonl", root / "odd.jsonl")
    (root / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + user_line("a prompt after a BOM", "b"))
    (root / "latin.jsonl").write_bytes(
        user_line("caf\xe9", "l").replace(b"caf\xc3\xa9", b"caf\xe9")
    )
    (root / "lone.jsonl").write_bytes(user_line("x", "s").replace(b'"x"', b'"\\ud83d"'))
    config = tmp_path / "sw.toml"
    config.write_text(f'[roots]\nclaude = "{tmp_path / "claude"}"\n')
    found = sw(tmp_path / "s.db", "--config", str(config), "catalog", "--json")
    assert [] == found["errors"]
    assert 4 == len(found["sessions"])


def test_the_catalog_says_each_unreadable_node_once_and_exits_1(tmp_path: Path) -> None:
    (tmp_path / "node.token").write_text("wrong-token-0123456789abcdef0123456789\n")
    (tmp_path / "node.token").chmod(0o600)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there: the node is down
    config = tmp_path / "sw.toml"
    config.write_text(
        f'[roots]\nclaude = "{tmp_path}"\n[nodes.laptop]\nurl = "http://127.0.0.1:{port}"\n'
        f'token_file = "{tmp_path / "node.token"}"\n'
    )
    done = run("--db", str(tmp_path / "s.db"), "--config", str(config), "catalog")
    assert 1 == done.returncode, done.stderr
    assert 1 == done.stdout.count("node laptop:"), done.stdout
    assert "0 skipped" not in done.stdout


def test_a_global_option_after_the_command_says_where_it_goes(tmp_path: Path) -> None:
    done = run("status", "--config", str(tmp_path / "x.toml"), "agent:main:x")
    assert 2 == done.returncode
    assert "goes before the command" in done.stderr
    argv = ["record", "--session", "agent:main:x", "--kind", "goal_changed", "--actor", "human"]
    done = run(*argv, "--db", str(tmp_path / "x.db"))
    assert 2 == done.returncode
    assert "as in sessionwatch --db VALUE record ..." in done.stderr, done.stderr
    assert not (tmp_path / "x.db").exists()


def test_small_points(tmp_path: Path) -> None:
    """The CLI's --occurred-at bound is the API's; --scan-cap 0 is refused as the
    configuration refuses it; a path with a NUL is bad input, not outside the roots."""
    db = tmp_path / "s.db"
    late = ("--occurred-at", "253402300800000")
    done = run("--db", str(db), "record", "--session", "agent:main:x", "--kind",
               "goal_changed", "--actor", "human", *late)  # fmt: skip
    assert 2 == done.returncode and "year 9999" in done.stderr, done.stderr
    (tmp_path / "t.jsonl").write_bytes(user_line("x"))
    done = run("--db", str(db), "replay", "--kind", "claude", "--path",
               str(tmp_path / "t.jsonl"), "--scan-cap", "0")  # fmt: skip
    assert 2 == done.returncode, done.stderr
    assert not db.exists()


async def test_api_small_points(client: Client) -> None:
    status, answer = await client.call("GET", "/v1/sessions?keys=agent:main:a&keys=agent:main:b")
    assert 400 == status and "more than once" in answer["error"]["message"]
    typo = {"sessionKey": "agent:main:x", "kind": "human_direct_message", "actorType": "human"}
    for key in ("agent:main:\u202eevil", "agent:main:a\u200bb"):
        status, answer = await client.call("POST", "/v1/events", {**typo, "sessionKey": key})
        assert 400 == status and "invisible character" in answer["error"]["message"]
    status, answer = await client.call(
        "POST", "/v1/links", {"kind": "claude", "path": "/tmp/a\x00b", "sessionKey": "agent:main:x"}
    )
    assert 400 == status and answer["error"]["code"] != "outside_roots"


async def test_the_unix_socket_is_removed_at_a_clean_stop(tmp_path: Path) -> None:
    sock = tmp_path / "sw.sock"
    base = make_config(tmp_path)
    config = base._replace(api=base.api._replace(listen=f"unix:{sock}"))
    async with running(config, tmp_path / "state.db"):
        assert sock.exists()
    assert not sock.exists()


def test_a_toml_file_with_a_bom_is_read(tmp_path: Path) -> None:
    path = tmp_path / "sw.toml"
    path.write_bytes(b"\xef\xbb\xbf[monitor]\ninterval_s = 30\n")
    assert 30 == load_config(path).monitor.interval_s


async def test_the_gateways_own_words_are_logged_escaped_and_each_way_down_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from monitor.delivery.hooks import HooksClient
    from monitor.delivery.transport import CallFailed, Ready, Reply
    from tests.helpers import ManualClock, ManualTimers

    answers: list[Reply | str] = [
        Reply(400, b'{"error": "bad \\u001b[2J text"}'),
        Reply(500, b"boom"),
        "timed out",
    ]

    class Transport:
        async def post(
            self, url: str, body: bytes, headers: object, ready: Ready | None = None
        ) -> Reply | None:
            if ready is not None and not await ready():
                return None
            answer = answers[0] if len(answers) == 1 else answers.pop(0)
            if isinstance(answer, str):
                raise CallFailed(answer)
            return answer

        async def close(self) -> None:
            pass

    token = Path(os.environ.get("TMPDIR", "/tmp")) / f"hooks-{os.getpid()}"
    token.write_text("t-0123456789\n")
    token.chmod(0o600)
    timers = ManualTimers(ManualClock())
    client = HooksClient("http://127.0.0.1:1/hooks", token, timers=timers, transport=Transport())
    caplog.set_level(logging.WARNING)
    try:
        for _ in range(3):
            waking = asyncio.ensure_future(client.wake("agent:main:main", "n"))
            while not waking.done():
                await timers.advance(1_000)
    finally:
        token.unlink()
    said = caplog.text
    assert "\x1b" not in said and "\\x1b[2J" in said
    assert "500 boom" in said and "timed out" in said


async def test_a_mistyped_channel_is_refused_other_keys_dropped(client: Client) -> None:
    """A key near the one the summary names, when that one is missing, is a typo: refused
    with the key meant (it would read "human message via unknown"); any other key is
    dropped, as OpenClaw's compact payload drops it."""
    turn = {"sessionKey": "agent:main:x", "kind": "human_direct_message", "actorType": "human"}
    status, answer = await client.call("POST", "/v1/events", {**turn, "payload": {"chanel": "t"}})
    assert 400 == status and "did you mean channel" in answer["error"]["message"]
    status, answer = await client.call("POST", "/v1/events", {**turn, "payload": {"x": 1}})
    assert (200, "human message via unknown") == (status, answer["summary"])
    both = {"channel": "telegram", "chanel": "t"}
    status, answer = await client.call("POST", "/v1/events", {**turn, "payload": both})
    assert (200, "human message via telegram") == (status, answer["summary"])


def test_the_cli_refuses_a_mistyped_channel_too(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    typo = ("--kind", "human_direct_message", "--actor", "human", "--payload", '{"chanel": "t"}')
    done = run("--db", str(db), "record", "--session", "agent:main:x", *typo)
    assert 2 == done.returncode and "did you mean channel" in done.stderr, done.stderr
    if db.exists():  # nothing recorded
        assert 0 == sw(db, "status", "agent:main:x")["stateVersion"]


def test_the_version_is_the_packages() -> None:
    from importlib.metadata import version

    done = run("--version")
    assert (0, f"sessionwatch {version('sessionwatch')}\n") == (done.returncode, done.stdout)
