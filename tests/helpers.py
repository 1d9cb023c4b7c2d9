"""What the tests share that is not a fixture: a manual clock and timers, event and
notice builders, waiting, a client of a sidecar on loopback, the store's refusals.
Fixtures live in conftest.py."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from monitor.config import ApiConfig, Config, HostConfig, MonitorConfig, RootsConfig
from monitor.kernel import Kernel, NewEvent
from monitor.kernel.drafts import Recorded
from monitor.kernel.events import ActorType, EventKind
from monitor.serve.root import Sidecar
from monitor.testing import T0, ManualClock, ManualTimers, settle_loop  # noqa: F401  (the tests import them from here too)
from tests.contract import check_answer

REPO = Path(__file__).resolve().parent.parent  # the repository's root


class WakeLog:
    """A delivery sender (:class:`monitor.delivery.ledger.Sender`) that records whom it was
    asked to wake, once per notice a pass found, and leaves every notice pending, as a
    gateway that takes nothing would (with no retries). ``open_kernel(wake=...)`` hands it
    the kernel's delivery, on the test's manual timers."""

    retry_s = 30.0

    def __init__(self) -> None:
        self.woken: list[str] = []
        self.delivery: Any = None  # the Delivery it is the sender of
        self.timers: ManualTimers | None = None

    async def wake(
        self, watcher: str, text: str, *, still: Callable[[], Awaitable[bool]] | None = None
    ) -> None:
        if still is None or await still():
            self.woken.append(watcher)

    def quiet_s(self) -> float:
        return 0.0

    async def settled(self) -> None:
        assert self.timers is not None
        await self.timers.quiesce()
        await self.delivery.settled()


async def kernel_waking(
    target: Path | str, clock: ManualClock, wakes: WakeLog, **kwargs: Any
) -> Kernel:
    """A kernel whose delivery sends to ``wakes``, on manual timers of ``clock``."""
    from monitor.delivery.ledger import Delivery
    from monitor.kernel.store import open_store

    store = await open_store(target, clock=clock)
    wakes.timers = ManualTimers(clock)
    wakes.timers.stores.append(store)
    kernel = await Kernel.on_store(store, **kwargs)
    wakes.delivery = Delivery(kernel, wakes, timers=wakes.timers, others=False)
    await wakes.delivery.start(contextlib.AsyncExitStack(), kernel.bus)
    return kernel


@dataclass
class PgServer:
    url: str | None  # the admin URL of a server, or None with the reason
    reason: str = ""
    cluster: Any = None  # the throwaway cluster the suite started (None for an outside one)


_databases = itertools.count(1)


def pg_database(server: PgServer) -> str:
    """A fresh, empty database on the suite's server (skips when there is none)."""
    if server.url is None:
        pytest.skip(f"PostgreSQL half skipped: {server.reason}")
    from tests.pg_cluster import fresh_database

    return fresh_database(server.url, f"t{os.getpid()}_{next(_databases)}")


KernelFactory = Callable[..., Any]


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
        match = re.search(r"serving .* on (https?://\S+)", line)
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


def refusing_gateway() -> Any:
    """A gateway whose hooks refuse every token (401), on loopback (a ThreadingHTTPServer:
    ``server_port``, ``shutdown()``)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Refuse(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'{"ok":false,"error":"unauthorized"}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
