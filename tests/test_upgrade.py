"""An upgrade from every earlier release needs no manual step and loses nothing: today's
``serve``, with the gateway's hooks configured, starts on the state database each earlier
release left (built from the project's history, see tests/releases.py), keeps every row,
wakes the gateway once for each notice that release left pending, and wakes it again for a
turn typed afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from monitor.kernel import NewEvent
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.notices import notice_text
from monitor.kernel.store.sqlite_schema import SCHEMA_VERSION
from tests.helpers import REPO, ManualClock, WakeLog, kernel_waking, served_address, until
from tests.hooks_gateway import HooksGateway, running_hooks_gateway
from tests.releases import (
    ADOPTED,
    CHILD,
    MAIN,
    RELEASES,
    THIRD,
    build,
    database,
    has_history,
    release_deps,
    transcript,
)

TABLES = (
    "session_state_events",
    "session_watch_cursors",
    "session_upstream_links",
    "sessionwatch_sessions",
)


def counts(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
    finally:
        conn.close()


def cli(db: Path, config: Path, *argv: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "monitor", "--db", str(db), "--config", str(config), *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = orjson.loads(done.stdout)
    return answer


@contextlib.asynccontextmanager
async def serving(workdir: Path, db: Path, gw: HooksGateway) -> AsyncIterator[list[str]]:
    """Today's ``serve`` on ``db``; yields the log lines read so far (all of them after)."""
    gateway = gw.config(workdir)
    config = workdir / "sw.toml"
    config.write_text(
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{workdir / "token"}"\n'
        f'[roots]\nclaude = "{workdir / "claude"}"\n'
        f'[gateway]\nhooks_url = "{gateway.hooks_url}"\n'
        f'hooks_token_file = "{gateway.hooks_token_file}"\n'
    )
    argv = [sys.executable, "-m", "monitor", "--db", str(db), "--config", str(config), "serve"]
    proc = subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    try:
        await asyncio.to_thread(served_address, proc, said)
        drain = asyncio.ensure_future(asyncio.to_thread(lambda: said.extend(proc.stderr or ())))
        yield said
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        await drain


async def upgrade(commit: str, workdir: Path) -> None:
    db = database(commit, workdir)
    before = counts(db)
    async with running_hooks_gateway() as gw, serving(workdir, db, gw) as said:
        left = {notice_text(CHILD, 1), notice_text(ADOPTED, 3)}
        await until(f"{commit}: the notices it left woken", lambda: set(gw.texts) >= left)
        with transcript(workdir).open("ab") as f:  # the person types again
            f.write(THIRD)
        fresh = notice_text(ADOPTED, 4)
        await until(f"{commit}: the new turn woken", lambda: fresh in gw.texts, timeout=60)
        status = cli(db, workdir / "sw.toml", "status", ADOPTED, "--changes-since", "4")
        changes = status["stateChanges"]
        assert isinstance(changes, dict)
        assert [e["kind"] for e in changes["events"]] == ["human_direct_message"], changes
        assert sorted(gw.texts) == sorted(left | {fresh}), f"{commit}: each once: {gw.texts}"
        assert all(w["sessionKey"] == MAIN for w in gw.wakes)
    after = counts(db)
    assert after == {**before, "session_state_events": before["session_state_events"] + 1}
    assert db.stat().st_mode & 0o777 == 0o600
    fixed = [line for line in said if "made by an earlier sessionwatch" in line]
    assert len(fixed) == (1 if commit == "865cf60" else 0), fixed


@pytest.mark.timeout(300)
async def test_an_upgrade_from_each_earlier_release_keeps_and_wakes_what_it_left(
    tmp_path: Path,
) -> None:
    # All at once: each waits out one 20 s wake window for the turn typed after its start.
    await asyncio.gather(*(upgrade(commit, tmp_path / commit) for commit in RELEASES))


def sessionwatch(db: Path, home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``sessionwatch --db DB ARGV`` with ``home`` as its HOME and no other environment."""
    return subprocess.run(
        [sys.executable, "-m", "monitor", "--db", str(db), *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
    )


def test_a_database_another_program_made_keeps_its_refusal(tmp_path: Path) -> None:
    """Only a file sessionwatch made is brought to 0600: a gateway's database readable by
    others (it holds tables of the gateway's own) is still refused, and left as it was."""
    db = tmp_path / "openclaw.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE gateway_own (id INTEGER)")
    conn.close()
    db.chmod(0o644)
    done = sessionwatch(db, tmp_path, "serve")
    assert done.returncode != 0
    assert "readable by others (mode 0644); run: chmod 600" in done.stderr
    assert db.stat().st_mode & 0o777 == 0o644


def test_a_newer_schema_is_refused_naming_both_versions_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    db = tmp_path / "state.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE sessionwatch_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO sessionwatch_meta VALUES ('schema_version', '99')")
    conn.commit()
    conn.close()
    db.chmod(0o600)
    image = db.read_bytes()
    for argv in (["status", ADOPTED], ["record", "--session", ADOPTED, "--kind", "goal_changed",
                 "--actor", "human"], ["serve"]):  # fmt: skip
        done = sessionwatch(db, tmp_path, *argv)
        assert done.returncode != 0, argv
        assert "schema version 99" in done.stderr and f"({SCHEMA_VERSION})" in done.stderr, (
            done.stderr
        )
        assert "Traceback" not in done.stderr
    assert db.read_bytes() == image


async def test_notices_left_on_a_database_the_gateway_shares_are_counted_not_woken(
    tmp_path: Path,
) -> None:
    """Where a gateway shares the database, an earlier sidecar's unmarked notices cannot be
    told from the gateway's own: none is woken at start, they are counted (log, metrics,
    status page), and a change recorded on such a pair wakes it."""
    db = database("74efb9a", tmp_path / "shared")
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE gateway_own (id INTEGER)")  # the gateway's own table
    conn.close()
    wakes = WakeLog()
    kernel = await kernel_waking(db, ManualClock(), wakes)
    try:
        assert len(await kernel.sweep()) == 2
        await wakes.settled()
        assert (wakes.woken, kernel.undecided_notices) == ([], 2)
        human = NewEvent(CHILD, kind=EventKind.HUMAN_DIRECT_MESSAGE, actor_type=ActorType.HUMAN)
        await kernel.record(human)
        await wakes.settled()
        assert wakes.woken == [MAIN]
        await kernel.sweep()
        assert kernel.undecided_notices == 1
    finally:
        await kernel.close()


# -- a newer release installed beside a running older serve --------------------------------

SCHEMA_5 = "d4ce48e"  # the last release at schema 5, before the wake ledger (schema 6)


def _schema_of(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT value FROM sessionwatch_meta WHERE key = 'schema_version'")
        return int(row.fetchone()[0])
    finally:
        conn.close()


@pytest.mark.skipif(not has_history(SCHEMA_5), reason="a shallow clone: no release to build")
def test_a_newer_release_beside_a_running_older_serve_leaves_its_database_alone(
    tmp_path: Path,
) -> None:
    """The release before schema 6, built from history, serves its database; today's
    one-shot commands each refuse in one line naming that serve, and migrate nothing: the
    running release's own commands keep working. Once it stops, today's serve upgrades the
    database and says so once."""
    src = build(SCHEMA_5)
    db, config = tmp_path / "state.db", tmp_path / "sw.toml"
    config.write_text(
        f'[roots]\nclaude = "{tmp_path / "claude"}"\n[api]\nlisten = "127.0.0.1:0"\n'
        f'token_file = "{tmp_path / "token"}"\n'
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path / "home"),
        "SESSIONWATCH_DB": str(db),
        "SESSIONWATCH_CONFIG": str(config),
    }
    old_env = {**env, "PYTHONPATH": f"{src}{os.pathsep}{release_deps()}"}
    old = subprocess.Popen(
        [sys.executable, "-m", "monitor", "serve"],
        cwd=src, env=old_env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        served_address(old)
        assert _schema_of(db) == 5
        old_status = subprocess.run(
            [sys.executable, "-m", "monitor", "status", ADOPTED],
            cwd=src, env=old_env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert old_status.returncode == 0, old_status.stderr
        for argv in (["status", ADOPTED], ["links"], ["notices", "--watcher", MAIN],
                     ["catalog"], ["doctor"], ["record", "--session", ADOPTED, "--kind",
                     "goal_changed", "--actor", "human"]):  # fmt: skip
            done = subprocess.run(
                [sys.executable, "-m", "monitor", *argv],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            said = done.stderr + (done.stdout if argv == ["doctor"] else "")
            assert done.returncode != 0, (argv, done.stdout)
            assert "Traceback" not in said, said
            assert "is at schema 5, and a running serve uses it" in said, (argv, said)
            assert f"pid {old.pid}" in said or f":{old.pid}" in said, said
            if argv != ["doctor"]:
                assert len(done.stderr.strip().splitlines()) == 1, done.stderr
            assert _schema_of(db) == 5, argv
        again = subprocess.run(
            [sys.executable, "-m", "monitor", "status", ADOPTED],
            cwd=src, env=old_env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr  # the running release is not refused
    finally:
        old.terminate()
        old.communicate(timeout=30)
    new = subprocess.Popen(
        [sys.executable, "-m", "monitor", "serve"],
        cwd=REPO, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    said: list[str] = []
    try:
        served_address(new, said)
    finally:
        new.terminate()
        _, rest = new.communicate(timeout=30)
    log = "".join(said) + rest
    assert log.count(f"from schema 5 to {SCHEMA_VERSION}") == 1, log
    assert _schema_of(db) == SCHEMA_VERSION


@pytest.mark.parametrize("lease_left_s", [600, -30, -120])
async def test_a_one_shot_command_leaves_an_older_schema_a_live_serve_holds(
    store_target: Path | str, clock: ManualClock, lease_left_s: int
) -> None:
    """On both stores: a database at an older schema, with a serve's host lease live (or
    ran out less than a minute ago: paused, or between renewals), is refused by a one-shot
    open in one line naming that serve's release, and left at its schema; a lease that ran
    out longer ago is a serve gone, and the open upgrades."""
    from monitor.kernel import Kernel, KernelSettings
    from monitor.kernel.store.protocol import NOW_SQL
    from monitor.kernel.store.upgrade import SchemaInUse

    kernel = await Kernel.open(store_target, KernelSettings(), clock=clock)
    await kernel.store.write(
        lambda c: c.execute("UPDATE sessionwatch_meta SET value = '5' WHERE key = 'schema_version'")
    )
    await kernel.store.write(
        lambda c: c.execute(
            "INSERT INTO sessionwatch_leases (name, holder, expires_at, info)"
            f" VALUES ('host:local', 'box:4242:abcd', {NOW_SQL} + ?, 'sessionwatch 0.5.9')",
            (lease_left_s * 1000,),
        )
    )
    await kernel.close()
    if lease_left_s > -60:
        with pytest.raises(SchemaInUse) as refused:
            await Kernel.open(store_target, KernelSettings(), clock=clock, direct=True)
        said = str(refused.value)
        assert "schema 5, and a running serve uses it (sessionwatch 0.5.9 on box:4242)" in said
        assert "\n" not in said
        assert _recorded_schema(store_target) == 5
    else:
        await (await Kernel.open(store_target, KernelSettings(), clock=clock, direct=True)).close()
        assert _recorded_schema(store_target) == SCHEMA_VERSION


def _recorded_schema(target: Path | str) -> int:
    query = "SELECT value FROM sessionwatch_meta WHERE key = 'schema_version'"
    if isinstance(target, Path):
        return _schema_of(target)
    import psycopg

    with psycopg.connect(target) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])
