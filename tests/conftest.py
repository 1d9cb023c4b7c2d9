"""Shared test helpers: a manual clock and kernels over real SQLite files in a temp dir."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from monitor.config import ApiConfig, Config, HostConfig, MonitorConfig, RootsConfig
from monitor.kernel import Kernel, KernelSettings, NewEvent
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.signal_log import Recorded
from monitor.service import Sidecar, running
from tests.contract import check_answer
from tests.hooks_gateway import hooks_gateway  # noqa: F401  (a fixture for every test)

T0 = 1_790_000_000_000
REPO = Path(__file__).resolve().parent.parent  # the repository's root


class ManualClock:
    """A clock the test moves by hand."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def roots(tmp_path: Path) -> RootsConfig:
    """Claude, Codex and Pi roots under the test's temp dir."""
    for name in ("claude", "codex", "pi"):
        (tmp_path / name).mkdir()
    return RootsConfig(
        claude=str(tmp_path / "claude"), codex=str(tmp_path / "codex"), pi=str(tmp_path / "pi")
    )


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """The SQLite file. A test that asks for it reads the file itself: SQLite only."""
    return tmp_path / "state.db"


@dataclass
class PgServer:
    url: str | None  # the admin URL of a server, or None with the reason
    reason: str = ""
    cluster: Any = None  # the throwaway cluster the suite started (None for an outside one)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A PostgreSQL server for the suite's PostgreSQL half: ``$SESSIONWATCH_TEST_PG``, else a
    throwaway cluster (tests/pg_cluster.py), else none, with the reason."""
    outside = os.environ.get("SESSIONWATCH_TEST_PG", "").strip()
    if outside:
        _PG_SAID.append("ran on $SESSIONWATCH_TEST_PG")
        yield PgServer(url=outside)
        return
    from tests.pg_cluster import Cluster, why_unavailable

    reason = why_unavailable()
    if reason:
        if os.environ.get("SESSIONWATCH_REQUIRE_PG"):  # CI: the half must run
            raise RuntimeError(f"SESSIONWATCH_REQUIRE_PG is set, but {reason}")
        _PG_SAID.append(f"was skipped: {reason}")
        yield PgServer(url=None, reason=reason)
        return
    try:
        cluster = Cluster()
        cluster.start()
    except (OSError, subprocess.SubprocessError) as exc:
        if os.environ.get("SESSIONWATCH_REQUIRE_PG"):
            raise
        reason = f"the throwaway cluster did not start: {exc}"
        _PG_SAID.append(f"was skipped: {reason}")
        yield PgServer(url=None, reason=reason)
        return
    _PG_SAID.append("ran on a throwaway cluster")
    try:
        yield PgServer(url=cluster.url, cluster=cluster)
    finally:
        cluster.destroy()


_databases = itertools.count(1)
_PG_SAID: list[str] = []  # what the end of the run says of the PostgreSQL half


def pg_database(server: PgServer) -> str:
    """A fresh, empty database on the suite's server (skips when there is none)."""
    if server.url is None:
        pytest.skip(f"PostgreSQL half skipped: {server.reason}")
    from tests.pg_cluster import fresh_database

    return fresh_database(server.url, f"t{os.getpid()}_{next(_databases)}")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where the state lives: the kernel, upstream and API tests run on both stores. A test
    that also asks for ``db_path`` reads the SQLite file and runs on SQLite only."""
    if request.param == "sqlite":
        return tmp_path / "state.db"
    if "db_path" in request.fixturenames:
        pytest.skip("SQLite only: the test reads the database file")
    server: PgServer = request.getfixturevalue("pg_server")
    return pg_database(server)


KernelFactory = Callable[..., Any]


@pytest.fixture
async def open_kernel(store_target: Path | str, clock: ManualClock) -> AsyncIterator[KernelFactory]:
    opened: list[Kernel] = []

    async def factory(**kwargs: Any) -> Kernel:
        settings = kwargs.pop("settings", KernelSettings())
        kernel = await Kernel.open(store_target, settings, clock=clock, **kwargs)
        opened.append(kernel)
        return kernel

    yield factory
    for kernel in opened:
        await kernel.close()


@pytest.fixture
async def kernel(open_kernel: KernelFactory) -> Kernel:
    k: Kernel = await open_kernel()
    return k


async def human(kernel: Kernel, key: str, **kw: Any) -> Recorded:
    """Record a human turn on ``key``."""
    return await kernel.record(
        NewEvent(
            session_key=key, kind=EventKind.HUMAN_DIRECT_MESSAGE, actor_type=ActorType.HUMAN, **kw
        )
    )


async def texts(kernel: Kernel, watcher: str, *, drain: bool = False, **kw: Any) -> list[str]:
    return [n.text for n in await kernel.notices(watcher=watcher, drain=drain, **kw)]


def user_line(text: str, uuid: str = "u") -> bytes:
    """A Claude Code transcript line: a prompt a person typed."""
    record = {"type": "user", "uuid": uuid, "message": {"role": "user", "content": text}}
    return orjson.dumps(record) + b"\n"


def notice(target: str, since: int) -> str:
    return (
        f'Session "{target}" changed (other actor). Reconcile before acting: '
        f'session_status sessionKey "{target}" changesSince {since}.'
    )


async def until(
    what: str, check: Callable[[], Awaitable[bool] | bool], timeout: float = 20
) -> None:
    """Wait until ``check()`` (or the awaitable it gives) is true; fail naming ``what``."""

    async def loop() -> None:
        while True:
            result = check()
            if isinstance(result, Awaitable):
                result = await result
            if result:
                return
            await asyncio.sleep(0.05)

    try:
        await asyncio.wait_for(loop(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def run_ok(argv: list[str]) -> str:
    """Run a command from the repository's root and return what it printed; it must
    succeed (its error output is the failure's message)."""
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def served_address(proc: subprocess.Popen[str], said: list[str] | None = None) -> str:
    """The http:// address a ``serve`` or ``node`` process names in its start-up line; the
    lines read on the way are kept in ``said`` when given."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if said is not None:
            said.append(line)
        match = re.search(r"serving .* on (http://\S+)", line)
        if match:
            return match.group(1)
    raise AssertionError("the process exited without naming its address")


# -- a sidecar on loopback, called with aiohttp's client ---------------------------------


@dataclass
class Client:
    base: str
    token: str
    http: aiohttp.ClientSession
    sidecar: Sidecar

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        raw: bytes | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token if token is None else token}"}
        data = raw if raw is not None else (orjson.dumps(body) if body is not None else None)
        if data is not None:
            headers["Content-Type"] = content_type
        async with self.http.request(method, self.base + path, data=data, headers=headers) as r:
            text = await r.read()
            try:
                answer = orjson.loads(text)
            except orjson.JSONDecodeError:
                return r.status, text.decode()
        check_answer(method, path, r.status, answer)
        return r.status, answer


def make_config(tmp_path: Path, **extra: Any) -> Config:
    """A sidecar's configuration under ``tmp_path``; its host id is ``local`` (explicit,
    so that it also starts on a shared PostgreSQL store)."""
    root = tmp_path / "claude"
    root.mkdir(exist_ok=True)
    extra.setdefault("host", HostConfig(id="local"))
    return Config(
        roots=RootsConfig(claude=str(root), codex=str(tmp_path / "codex"), pi=str(tmp_path / "pi")),
        api=ApiConfig(listen="127.0.0.1:0", token_file=str(tmp_path / "token")),
        monitor=MonitorConfig(initial_delay_s=3600, interval_s=3600, watch_files=True),
        **extra,
    )


@pytest.fixture
async def client(tmp_path: Path, store_target: Path | str) -> AsyncIterator[Client]:
    config = make_config(tmp_path)
    async with running(config, store_target) as sidecar, aiohttp.ClientSession() as http:
        token = (tmp_path / "token").read_text().strip()
        yield Client(sidecar.addresses[0], token, http, sidecar)


def refuse_event_inserts(conn: Any, only: str | None = None) -> None:
    """Make every insert into the signal log fail, on either store, with a trigger (every
    write failing alike: the whole store refusing, as a full disk would); with ``only``,
    just the inserts of that session (one write's own failure, a constraint)."""
    import sqlite3

    if isinstance(conn, sqlite3.Connection):
        when = f" WHEN NEW.session_key = '{only}'" if only else ""
        conn.execute(
            f"CREATE TRIGGER refuse BEFORE INSERT ON session_state_events{when}"
            " BEGIN SELECT RAISE(ABORT, 'disk full'); END"
        )
        return
    check = f"IF NEW.session_key = '{only}' THEN " if only else ""
    end = " END IF;" if only else ""
    conn.execute(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql"
        f" AS $$ BEGIN {check}RAISE EXCEPTION 'disk full';{end} RETURN NEW; END $$"
    )
    conn.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON session_state_events"
        " FOR EACH ROW EXECUTE FUNCTION refuse()"
    )


def allow_event_inserts(conn: Any) -> None:
    import sqlite3

    if isinstance(conn, sqlite3.Connection):
        conn.execute("DROP TRIGGER refuse")
    else:
        conn.execute("DROP TRIGGER refuse ON session_state_events")
        conn.execute("DROP FUNCTION refuse()")


SLOW = (  # a module each, seconds to minutes
    "tests/test_upgrade.py",
    "tests/upstream/test_crash_loop.py",
    "tests/web/test_api_fuzz.py",
    "tests/web/test_contract.py",
    "tests/test_drift_report.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by what it needs (pyproject's markers); the rest are ``quick``."""
    for item in items:
        path = Path(str(item.fspath)).relative_to(REPO).as_posix()
        marks = []
        if path.startswith("tests/interop/"):
            marks.append("interop")
        if path.startswith("tests/harnesses/"):
            marks.append("harness")
        if path in SLOW:
            marks.append("slow")
        code = getattr(getattr(item, "obj", None), "__code__", None)
        if code is not None and "skip_without_browser" in code.co_names:
            marks.append("browser")
        callspec = getattr(item, "callspec", None)
        if "pg_server" in getattr(item, "fixturenames", ()) or (
            callspec is not None and callspec.params.get("store_target") == "postgresql"
        ):
            marks.append("postgres")
        for mark in marks or ["quick"]:
            item.add_marker(mark)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say, at the end of a run that had PostgreSQL tests, whether that half ran, and if
    not, why."""
    if _PG_SAID:
        terminalreporter.write_line(f"sessionwatch: the PostgreSQL half {_PG_SAID[-1]}")
