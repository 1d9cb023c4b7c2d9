"""Concurrent ``sessionwatch tick`` processes beside a running ``serve`` (its tick every
second and its early checks on each append), on SQLite and on PostgreSQL: every prompt is
recorded once.

To make the checks overlap on purpose, the test holds the store's write lock (SQLite's
``BEGIN IMMEDIATE``, the PostgreSQL store's advisory lock) while a prompt is typed and a
tick reads it, then a second prompt and a second tick: both have read from one marker and
wait to settle, as ticks held open by a slow source do.
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from monitor.kernel.store.postgres import WRITE_LOCK
from tests.helpers import PgServer, pg_database, served_address, user_line
from tests.test_cli import sw

KEY = "agent:main:adopted:x"
MAIN = "agent:main:main"
PROMPTS = 12


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "state.db")
    server: PgServer = request.getfixturevalue("pg_server")
    return pg_database(server)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    (tmp_path / "claude").mkdir()
    path = tmp_path / "sessionwatch.toml"
    path.write_text(
        f'[host]\nid = "local"\n[roots]\nclaude = "{tmp_path / "claude"}"\n'
        "[monitor]\ninterval_s = 1\ninitial_delay_s = 0\n"
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n'
    )
    return path


@pytest.fixture
def serving(db: str, config: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "--db", db, "--config", str(config), "serve"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        served_address(proc)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def turns(db: str, config: Path) -> int:
    status = sw(db, "--config", str(config), "status", KEY, "--changes-since", "0")
    return sum(
        int((e.get("payload") or {}).get("turns", 1))
        for e in status["stateChanges"]["events"]
        if e["kind"] == "human_direct_message"
    )


def waits_to_write(db: str, tick: subprocess.Popen[bytes], waiting: int) -> bool:
    """Whether ``tick`` waits for the write lock, having read: on SQLite, one of its
    threads sleeps in SQLite's busy handler (the kernel says where a thread waits, in
    ``/proc``); on PostgreSQL, more than ``waiting`` sessions wait for the advisory lock
    (``serve``'s own early check may be one of them)."""
    if db.startswith("postgresql://"):
        with psycopg.connect(db, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()
        return row is not None and int(row[0]) > waiting
    tasks = Path(f"/proc/{tick.pid}/task")
    try:
        return any((t / "wchan").read_text() == "hrtimer_nanosleep" for t in tasks.iterdir())
    except OSError:  # it ended: nothing to wait for
        return True


def until_waiting(db: str, tick: subprocess.Popen[bytes], waiting: int) -> None:
    deadline = time.monotonic() + 60
    while not waits_to_write(db, tick, waiting):
        assert time.monotonic() < deadline, "the tick never waited for the write lock"
        time.sleep(0.01)


@contextlib.contextmanager
def write_lock(db: str) -> Iterator[None]:
    """The store's write lock, held by this test until the block ends."""
    if db.startswith("postgresql://"):
        with psycopg.connect(db) as conn, conn.transaction():
            conn.execute(f"SELECT pg_advisory_xact_lock({WRITE_LOCK})")
            yield
        return
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_ticks_beside_serve_record_each_prompt_once(
    db: str, config: Path, tmp_path: Path, serving: subprocess.Popen[str]
) -> None:
    transcript = tmp_path / "claude" / "s.jsonl"
    transcript.write_bytes(b"")
    c = ("--config", str(config))
    sw(db, *c, "adopt", "--kind", "claude", "--path", str(transcript), "--session-key", KEY)
    sw(db, *c, "watch", "--watcher", MAIN, "--target", KEY)
    base = [sys.executable, "-m", "monitor", "--db", db, *c, "tick"]
    for i in range(0, PROMPTS, 2):
        with write_lock(db):
            ticks: list[subprocess.Popen[bytes]] = []
            for n in (i, i + 1):
                with transcript.open("ab") as f:
                    f.write(user_line(f"prompt {n}", f"u{n}"))
                ticks.append(subprocess.Popen(base, stdout=subprocess.DEVNULL))
                until_waiting(db, ticks[-1], len(ticks) - 1)  # it has read, and waits
        assert [0, 0] == [t.wait(timeout=60) for t in ticks]
        assert turns(db, config) <= i + 2
    deadline = time.monotonic() + 20
    while turns(db, config) < PROMPTS and time.monotonic() < deadline:
        time.sleep(0.2)
    assert PROMPTS == turns(db, config)
    assert serving.poll() is None
