"""The service under faults and hostile input: a database another process holds locked,
out-of-range integers, odd headers and arguments, private files, group commit."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sqlite3
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from monitor.errors import BadInput, StoreLocked
from monitor.kernel import Kernel
from monitor.kernel.store.sqlite import Store
from monitor.serve.root import running
from monitor.web import wire
from tests.helpers import Client, make_config, user_line

CHILD = "agent:main:subagent:c1"
EVENT = {"sessionKey": CHILD, "kind": "human_direct_message", "actorType": "human"}


def sw(db: Path, *args: str | bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "monitor", "--db", str(db), *args],
        capture_output=True,
        check=False,
        timeout=120,
    )


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    import aiohttp

    async with running(make_config(tmp_path), tmp_path / "state.db") as sidecar:
        assert sidecar is not None
        async with aiohttp.ClientSession() as http:
            token = (tmp_path / "token").read_text().strip()
            yield Client(sidecar.addresses[0], token, http, sidecar)


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """Another process's connection holding the write lock (released at the end)."""
    conn = sqlite3.connect(tmp_path / "state.db", isolation_level=None, timeout=0)
    yield conn
    if conn.in_transaction:
        conn.execute("ROLLBACK")
    conn.close()


async def test_a_locked_database_answers_503_to_writes_and_still_serves_reads(
    client: Client, locked: sqlite3.Connection
) -> None:
    client.sidecar.kernel.store.write_timeout = 0.3
    locked.execute("BEGIN IMMEDIATE")
    answers = await asyncio.gather(*(client.call("POST", "/v1/events", EVENT) for _ in range(16)))
    assert {503} == {status for status, _ in answers}
    assert all(body["recorded"] is False for _, body in answers)
    assert 200 == (await client.call("GET", f"/v1/sessions/{CHILD}/status"))[0]
    assert 200 == (await client.call("GET", "/v1/links"))[0]
    assert 200 == (await client.call("GET", "/v1/sessions"))[0]
    assert 200 == (await client.call("GET", "/v1/watchers/agent:main:main/notices"))[0]
    locked.execute("ROLLBACK")
    status, body = await client.call("POST", "/v1/events", EVENT)
    assert (200, 1) == (status, body["sequence"])  # nothing was half-written before


async def test_a_503_says_when_to_retry(client: Client, locked: sqlite3.Connection) -> None:
    client.sidecar.kernel.store.write_timeout = 0.2
    locked.execute("BEGIN IMMEDIATE")
    headers = {"Authorization": f"Bearer {client.token}", "Content-Type": "application/json"}
    async with client.http.post(
        client.base + "/v1/spawns",
        json={"parent": "agent:main:main", "child": CHILD, "runId": "r1"},
        headers=headers,
    ) as resp:
        assert (503, "1") == (resp.status, resp.headers.get("Retry-After"))


async def test_ticks_behind_a_tick_waiting_for_a_lock_are_skipped_and_said_once(
    tmp_path: Path, locked: sqlite3.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """While another process holds the lock, each scheduled tick waits its bounded time in
    vain. The ticks that come while one waits are skipped; that, and the tick's findings
    waiting, are each said once for the whole outage, not once per tick."""
    config = make_config(tmp_path)
    config = config._replace(monitor=config.monitor._replace(watch_files=False))
    os.chmod(tmp_path / "state.db", 0o600)  # made by the other process's connection
    async with running(config, tmp_path / "state.db") as sidecar:
        assert sidecar is not None
        sidecar.kernel.store.write_timeout = 0.3
        path = tmp_path / "claude" / "s.jsonl"
        path.write_bytes(b"")
        wire.adopted(
            await sidecar.monitor.adoption.adopt(kind="claude", path=str(path), session_key=CHILD)
        )
        assert await sidecar.kernel.watch(watcher="agent:main:main", target=CHILD)
        with path.open("ab") as f:
            f.write(user_line("typed while the database was locked"))
        caplog.set_level(logging.WARNING)
        locked.execute("BEGIN IMMEDIATE")
        for _ in range(3):
            waiting = asyncio.ensure_future(sidecar.ticks.scheduled_tick())
            while not sidecar.monitor.ticker.busy:
                await asyncio.sleep(0.01)
            await sidecar.ticks.scheduled_tick()  # skipped: the one before still waits
            await waiting
        said = [r.getMessage() for r in caplog.records]
        assert 1 == sum("skipping ticks" in m for m in said), said
        assert 1 == sum("the tick's writes wait" in m for m in said), said
        locked.execute("ROLLBACK")
        await sidecar.ticks.scheduled_tick()
        events = (wire.status(await sidecar.kernel.status(CHILD, changes_since=0)))["stateChanges"][
            "events"
        ]
        assert ["adopted", "human_direct_message"] == [e["kind"] for e in events]


def test_serve_waits_for_a_locked_database_and_says_so_once(
    tmp_path: Path, locked: sqlite3.Connection
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n'
        "[monitor]\ninitial_delay_s = 3600\ninterval_s = 3600\nwatch_files = false\n"
    )
    db = tmp_path / "state.db"
    os.chmod(db, 0o600)
    locked.execute("BEGIN EXCLUSIVE")
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "--db", str(db), "--config", str(config), "serve"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        said = []
        for line in proc.stderr:
            if "locked by another process" in line:
                said.append(line)
                break
        assert said and "retrying" in said[0]
        locked.execute("ROLLBACK")
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "serving" in line:
                break
        assert "http://127.0.0.1:" in lines[-1]
        assert not [x for x in lines if "locked by another process" in x]  # said once
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert 0 == proc.returncode


async def test_group_commit_a_failing_write_rolls_back_alone(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "g.db")
    try:
        await store.write(lambda c: c.execute("CREATE TABLE t (v INTEGER)"))

        def insert(v: int) -> Any:
            def fn(c: sqlite3.Connection) -> int:
                c.execute("INSERT INTO t VALUES (?)", (v,))
                if v == 3:
                    raise BadInput("three is refused")
                return v

            return fn

        results = await asyncio.gather(
            *(store.write(insert(v)) for v in range(6)), return_exceptions=True
        )
        assert [0, 1, 2, "three is refused", 4, 5] == [
            str(r) if isinstance(r, Exception) else r for r in results
        ]
        rows = await store.read(lambda c: c.execute("SELECT v FROM t ORDER BY v").fetchall())
        assert [(0,), (1,), (2,), (4,), (5,)] == rows
    finally:
        await store.close()


async def test_a_write_waits_for_a_lock_once_then_fails(
    tmp_path: Path, locked: sqlite3.Connection
) -> None:
    store = await Store.open(tmp_path / "state.db")
    store.write_timeout = 0.2
    try:
        locked.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreLocked, match="locked by another process"):
            await store.write(lambda c: c.execute("CREATE TABLE x (v INTEGER)"))
    finally:
        await store.close()


def test_cli_reads_answer_while_another_process_holds_the_write_lock(
    tmp_path: Path, locked: sqlite3.Connection
) -> None:
    """Opening reads the schema and writes only when it must change, so a one-shot read
    never waits for a lock; a write waits its bounded time and says why."""
    db = tmp_path / "state.db"
    assert 0 == sw(db, "status", CHILD).returncode  # created and migrated
    locked.execute("BEGIN IMMEDIATE")
    for args in (("status", CHILD), ("sessions",), ("notices", "--watcher", "agent:main:main")):
        answer = sw(db, *args)
        assert (0, b"") == (answer.returncode, answer.stderr), args
    write = sw(
        db, "record", "--session", CHILD, "--kind", "human_direct_message", "--actor", "human"
    )
    assert 1 == write.returncode
    assert b"locked by another process" in write.stderr


@pytest.mark.parametrize(
    "path",
    [
        f"/v1/sessions/{CHILD}/status?changesSince=9223372036854775808",
        f"/v1/sessions/{CHILD}/status?changesSince=99999999999999999999999",
    ],
)
async def test_integers_beyond_sqlite_are_400(client: Client, path: str) -> None:
    status, body = await client.call("GET", path)
    assert (400, "bad_request") == (status, body["error"]["code"])


async def test_an_occurred_at_beyond_sqlite_is_400_and_writes_nothing(client: Client) -> None:
    status, _ = await client.call("POST", "/v1/events", {**EVENT, "occurredAt": 2**63})
    assert 400 == status
    assert 0 == (await client.call("GET", f"/v1/sessions/{CHILD}/status"))[1]["stateVersion"]


def test_cli_integers_beyond_sqlite_exit_2(tmp_path: Path) -> None:
    proc = sw(tmp_path / "s.db", "status", CHILD, "--changes-since", str(2**63))
    assert 2 == proc.returncode
    assert b"Traceback" not in proc.stderr and b"at most" in proc.stderr


def test_cli_arguments_that_are_not_utf8_exit_2(tmp_path: Path) -> None:
    proc = sw(tmp_path / "s.db", "status", b"agent:main:\xff\xfe")
    assert 2 == proc.returncode
    assert b"not valid UTF-8" in proc.stderr and b"Traceback" not in proc.stderr


@pytest.mark.parametrize("header", [b"Bearer \xff\xfe\xfd", "Bearer ünïcödé".encode(), b"\x80"])
async def test_a_non_ascii_authorization_is_401(client: Client, header: bytes) -> None:
    host, port = client.base.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"GET /v1/sessions HTTP/1.1\r\nHost: localhost\r\nAuthorization: "
        + header
        + b"\r\nConnection: close\r\n\r\n"
    )
    await writer.drain()
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 401"), answer[:80]
    assert b'"unauthorized"' in answer


async def half_closed(client: Client, request: bytes) -> bytes:
    """Send ``request``, shut the sending side, and read until the server closes."""
    host, port = client.base.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    writer.write_eof()
    answer = await asyncio.wait_for(reader.read(), 30)  # read() returns: the server closed
    writer.close()
    return answer


def post_event(client: Client, body: bytes, length: int) -> bytes:
    return (
        b"POST /v1/events HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer "
        + client.token.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(length).encode()
        + b"\r\n\r\n"
        + body
    )


async def test_a_client_that_half_closes_after_its_request_gets_the_answer(
    client: Client,
) -> None:
    """A client may shut its sending side once the request is out (``nc -N``): the event
    is recorded, and the answer still comes back before the connection closes."""
    body = orjson.dumps(EVENT)
    answer = await half_closed(client, post_event(client, body, len(body)))
    assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
    assert b'"recorded":true' in answer


async def test_a_body_cut_short_by_a_half_close_is_refused_not_taken_whole(
    client: Client,
) -> None:
    """The close ends the body before its Content-Length: 400, and nothing is recorded
    (a JSON prefix is never taken for the whole)."""
    body = orjson.dumps(EVENT)
    answer = await half_closed(client, post_event(client, body, len(body) + 40))
    assert answer.startswith(b"HTTP/1.1 400"), answer[:80]
    assert b"cut short" in answer
    status, state = await client.call("GET", f"/v1/sessions/{CHILD}/status")
    assert (200, 0) == (status, state["stateVersion"])


async def test_a_half_close_with_no_request_closes_at_once(client: Client) -> None:
    assert b"" == await half_closed(client, b"")
    assert b"" == await half_closed(client, b"POST /v1/ev")  # a request line cut short


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /v1/sessions\x00 HTTP/1.1\r\nHost: localhost\r\n\r\n",  # a bad request line
        b"GET /v1/sessions HTTP/1.1\r\nHost: localhost\r\nX: " + b"a" * 9000 + b"\r\n\r\n",
        b"POST /v1/events HTTP/1.1\r\nHost: localhost\r\nContent-Length: -1\r\n\r\n",
    ],
    ids=["request-line", "long-header", "bad-length"],
)
async def test_protocol_level_errors_are_answered_in_the_api_error_shape(
    client: Client, request_bytes: bytes
) -> None:
    answer = await half_closed(client, request_bytes)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith((b"HTTP/1.0 4", b"HTTP/1.1 4")), head[:80]
    assert b"application/json" in head
    error = orjson.loads(body)["error"]
    assert isinstance(error["code"], str) and error["message"]


async def test_a_spawn_of_itself_is_refused(client: Client, kernel: Kernel) -> None:
    body = {"parent": CHILD, "child": CHILD, "runId": "r1"}
    status, answer = await client.call("POST", "/v1/spawns", body)
    assert (400, "bad_request") == (status, answer["error"]["code"])
    with pytest.raises(BadInput, match="cannot spawn itself"):
        await kernel.spawn(parent=CHILD, child=CHILD.upper(), run_id="r2")


def test_serve_makes_its_state_directory_private(tmp_path: Path) -> None:
    state = tmp_path / "home" / "state"
    config = tmp_path / "c.toml"
    config.write_text(f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{state / "token"}"\n')
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "monitor",
            "--db",
            str(state / "state.db"),
            "--config",
            str(config),
            "serve",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "serving" in line:
                break
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    for directory in (state, state.parent):  # the parents it made too, not only the last
        assert 0o700 == stat.S_IMODE(directory.stat().st_mode), directory
    for name in ("state.db", "state.db.lock", "token"):
        assert 0o600 == stat.S_IMODE((state / name).stat().st_mode), name


async def test_state_files_are_private_from_the_start(tmp_path: Path) -> None:
    db = tmp_path / "new" / "state.db"
    kernel = await Kernel.open(db)
    await kernel.close()
    assert 0o700 == stat.S_IMODE(db.parent.stat().st_mode)
    for suffix in ("", "-wal", "-shm"):
        path = Path(f"{db}{suffix}")
        if path.exists():
            assert 0o600 == stat.S_IMODE(path.stat().st_mode), path


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_database_path_that_is_not_a_file_is_refused_and_nothing_is_made(
    tmp_path: Path, kind: str
) -> None:
    """SQLite would open a FIFO or a device and write its journal beside it (for
    ``/dev/null``, ``/dev/null-journal``); the path is refused before it opens."""
    db = tmp_path / "state.db"
    if kind == "fifo":
        os.mkfifo(db)
    else:
        db.mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    answer = sw(db, "status", CHILD)
    assert 1 == answer.returncode
    assert b"is not a regular file" in answer.stderr
    assert b"Traceback" not in answer.stderr
    assert before == sorted(p.name for p in tmp_path.iterdir())


@pytest.mark.parametrize("which", ["token", "state.db"])
def test_serve_refuses_state_files_others_can_read(tmp_path: Path, which: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n')
    target = tmp_path / which
    target.write_bytes(b"secret-token\n" if which == "token" else b"")
    os.chmod(target, 0o644)
    proc = sw(tmp_path / "state.db", "--config", str(config), "serve")
    assert 1 == proc.returncode
    message = proc.stderr.decode()
    assert str(target) in message and f"chmod 600 {target}" in message


def test_serve_refuses_a_token_path_that_is_not_a_file(tmp_path: Path) -> None:
    (tmp_path / "token").mkdir(mode=0o755)
    config = tmp_path / "c.toml"
    config.write_text(f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n')
    proc = sw(tmp_path / "state.db", "--config", str(config), "serve")
    assert 1 == proc.returncode
    assert f"the token file {tmp_path / 'token'} is not a regular file" in proc.stderr.decode()


def test_a_unix_socket_path_holding_a_file_is_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "api.sock"
    path.write_text("precious")
    config = tmp_path / "c.toml"
    config.write_text(f'[api]\nlisten = "unix:{path}"\ntoken_file = "{tmp_path / "token"}"\n')
    proc = sw(tmp_path / "state.db", "--config", str(config), "serve")
    assert 1 == proc.returncode
    assert b"not a socket" in proc.stderr
    assert "precious" == path.read_text()


def test_a_stale_unix_socket_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "api.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # bound, nobody listening: stale
    from monitor.web.common import clear_stale_socket

    clear_stale_socket(str(path))
    assert not path.exists()


async def test_a_path_naming_an_unknown_users_home_is_refused_not_a_500(client: Client) -> None:
    nobody = "~no_such_user_sessionwatch"
    status, answer = await client.call(
        "POST", "/v1/links", {"kind": "claude", "path": f"{nobody}/a.jsonl", "sessionKey": CHILD}
    )
    assert (403, "outside_roots") == (status, answer["error"]["code"])
    watch = {"watcher": "agent:main:main", "target": CHILD, "storePath": f"{nobody}/s.json"}
    status, answer = await client.call("POST", "/v1/watches", watch)  # not absolute: said
    assert 400 == status and "absolute path" in answer["error"]["message"], answer
    assert 400 == (await client.call("GET", f"/v1/catalog?cwd={nobody}"))[0]


def test_cli_db_under_an_unknown_users_home_fails_cleanly(tmp_path: Path) -> None:
    command = ["--db", "~no_such_user_sessionwatch/s.db", "status", "agent:main:main"]
    proc = subprocess.run(
        [sys.executable, "-m", "monitor", *command],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert 2 == proc.returncode
    assert "no home directory for user 'no_such_user_sessionwatch'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert [] == list(tmp_path.iterdir())  # no directory literally named ~user


async def test_whole_numbers_written_as_floats_are_integers(client: Client) -> None:
    event = {"sessionKey": CHILD, "kind": "human_direct_message", "actorType": "human"}
    status, answer = await client.call(
        "POST", "/v1/events", {**event, "occurredAt": 1.0e12, "payload": {"turns": 2.0}}
    )
    assert (200, 2) == (status, answer["payload"]["turns"])
    status, answer = await client.call("POST", "/v1/events", {**event, "occurredAt": 1.5})
    assert (400, "bad_request") == (status, answer["error"]["code"])


SHAPE = "--listen must be HOST:PORT (port 0-65535, [ADDR] for IPv6) or unix:PATH"


@pytest.mark.parametrize(
    ("listen", "said"),
    [
        ("127.0.0.1:99999", SHAPE),
        ("127.0.0.1:http", SHAPE),
        ("nowhere", SHAPE),
        ("unix:", SHAPE),
        ("unix:/nonexistent/dir/node.sock", "cannot listen on unix:/nonexistent/dir/node.sock"),
        ("unix:{tmp}/a-file/node.sock", "cannot listen on unix:{tmp}/a-file/node.sock"),
    ],
)
def test_a_bad_node_listen_is_refused_with_a_message(
    tmp_path: Path, listen: str, said: str
) -> None:
    (tmp_path / "a-file").write_text("")  # a parent directory that is a file
    listen, said = listen.format(tmp=tmp_path), said.format(tmp=tmp_path)
    command = ["node", "--listen", listen, "--token-file", str(tmp_path / "token")]
    proc = subprocess.run(
        [sys.executable, "-m", "monitor", *command],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert 1 == proc.returncode
    assert said in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("localhost", 200),
        ("127.0.0.1:8765", 200),
        ("[::1]:8765", 200),
        ("LOCALHOST", 200),
        ("attacker.example", 421),
        ("attacker.example:8765", 421),
        ("127.0.0.1.attacker.example", 421),
    ],
)
async def test_only_the_host_names_the_listener_implies_are_answered(
    client: Client, host: str, status: int
) -> None:
    """A page whose DNS name was rebound to loopback sends its own name as ``Host``: 421,
    health check included, before the token is even looked at."""
    address, port = client.base.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(address, int(port))
    writer.write(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    answer = await reader.read()
    writer.close()
    assert answer.startswith(f"HTTP/1.1 {status}".encode()), answer[:120]
    if status == 421:
        assert b'"misdirected_request"' in answer and b"allowed_hosts" in answer


def test_allowed_hosts_adds_names_and_is_checked() -> None:
    from monitor.config import parse_config
    from monitor.errors import ConfigError
    from monitor.web.common import implied_hosts

    config = parse_config({"api": {"allowed_hosts": ["Sidecar.LAN:8765"]}})
    assert "sidecar.lan" in implied_hosts("127.0.0.1", config.api.allowed_hosts)
    with pytest.raises(ConfigError, match="list of strings"):
        parse_config({"api": {"allowed_hosts": "sidecar.lan"}})
