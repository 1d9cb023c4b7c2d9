"""Fixtures: a manual clock, kernels over real SQLite files in a temp dir (and PostgreSQL
databases on a throwaway cluster), a sidecar on loopback; and the suite's markers. What
tests share that is not a fixture is in tests/helpers.py."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from monitor.config import RootsConfig
from monitor.kernel import Kernel, KernelSettings
from monitor.serve.root import running
from tests.helpers import (
    REPO,
    Client,
    KernelFactory,
    ManualClock,
    PgServer,
    WakeLog,
    kernel_waking,
    make_config,
    pg_database,
)
from tests.hooks_gateway import hooks_gateway  # noqa: F401  (a fixture for every test)

# No test reaches a port it did not open: OpenClaw's gateway port, wherever a test reads it
# from this environment (doctor's probe of the hooks, say), is one this suite holds bound
# and never listens on, so a call there is refused here, never counted by a real gateway
# on the developer's machine toward its failed-login lockout.
_UNANSWERED = socket.socket()
_UNANSWERED.bind(("127.0.0.1", 0))
os.environ["OPENCLAW_GATEWAY_PORT"] = str(_UNANSWERED.getsockname()[1])


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


_PG_SAID: list[str] = []  # what the end of the run says of the PostgreSQL half


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


@pytest.fixture
async def open_kernel(store_target: Path | str, clock: ManualClock) -> AsyncIterator[KernelFactory]:
    opened: list[Kernel] = []

    async def factory(**kwargs: Any) -> Kernel:
        """``wake``: a :class:`WakeLog` that the kernel's delivery sends to."""
        settings = kwargs.pop("settings", KernelSettings())
        wakes: WakeLog | None = kwargs.pop("wake", None)
        if wakes is None:
            kernel = await Kernel.open(store_target, settings, clock=clock, **kwargs)
        else:
            kernel = await kernel_waking(store_target, clock, wakes, settings=settings, **kwargs)
        opened.append(kernel)
        return kernel

    yield factory
    for kernel in opened:
        await kernel.close()


@pytest.fixture
async def kernel(open_kernel: KernelFactory) -> Kernel:
    k: Kernel = await open_kernel()
    return k


@pytest.fixture
async def client(tmp_path: Path, store_target: Path | str) -> AsyncIterator[Client]:
    config = make_config(tmp_path)
    async with running(config, store_target) as sidecar, aiohttp.ClientSession() as http:
        token = (tmp_path / "token").read_text().strip()
        yield Client(sidecar.addresses[0], token, http, sidecar)


SLOW = (  # a module each, seconds to minutes
    "tests/test_upgrade.py",
    "tests/upstream/test_crash_loop.py",
    "tests/web/test_api_fuzz.py",
    "tests/web/test_contract.py",
    "tests/test_drift_report.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by what it needs (pyproject's markers); the rest are ``quick``. A
    ``long`` test runs only when ``-m`` names it."""
    asked_long = "long" in (config.getoption("markexpr", "") or "")
    for item in items:
        if item.get_closest_marker("long") and not asked_long:
            item.add_marker(pytest.mark.skip(reason="a long run: pytest -m long runs it"))
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


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In a worker process (pytest-xdist): hand what the PostgreSQL half did to the main one."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None and _PG_SAID:
        output["pg_said"] = _PG_SAID[-1]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    said = getattr(node, "workeroutput", {}).get("pg_said")
    if said:
        _PG_SAID.append(said)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say, at the end of a run that had PostgreSQL tests, whether that half ran, and if
    not, why."""
    if _PG_SAID:
        terminalreporter.write_line(f"sessionwatch: the PostgreSQL half {_PG_SAID[-1]}")
