"""Several sidecars on one PostgreSQL store, in one test process each with its own host id:
host ids, notices across sidecars (the SSE stream, the peek route and the wake call), wakes
coalesced across sidecars, file links ticked by their own host only, the shared lease, no
turn recorded twice, and the store stopped and started under them."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from monitor.config import Config, HostConfig, MonitorConfig
from monitor.errors import AlreadyRunning, ConfigError, StoreError
from monitor.kernel.bus import OwnershipChanged
from monitor.serve.root import Sidecar, running
from monitor.upstream.host_leases import SHARED
from monitor.web import wire
from tests.helpers import Client, PgServer, make_config, notice, pg_database, until, user_line
from tests.hooks_gateway import HooksGateway

MAIN = "agent:main:main"
CHILD = "agent:main:subagent:c1"


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    return pg_database(pg_server)


def host_config(tmp_path: Path, host: str, **extra: Any) -> Config:
    """A sidecar of host ``host``: its own token, roots and API port."""
    home = tmp_path / host
    home.mkdir(parents=True, exist_ok=True)
    monitor = extra.pop("monitor", None)
    config = make_config(home, host=HostConfig(id=host), **extra)
    return config._replace(monitor=monitor) if monitor else config


async def start(
    stack: AsyncExitStack, config: Config, url: Path | str, http: aiohttp.ClientSession
) -> Client:
    sidecar = await stack.enter_async_context(running(config, url))
    assert sidecar is not None
    token = Path(config.api.token_file).read_text().strip()
    return Client(sidecar.addresses[0], token, http, sidecar)


async def test_a_shared_store_needs_an_explicit_unique_host_id(pg_url: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[host\] id"):
        async with running(make_config(tmp_path, host=HostConfig()), pg_url):
            pass
    async with AsyncExitStack() as stack, aiohttp.ClientSession() as http:
        await start(stack, host_config(tmp_path, "a"), pg_url, http)
        with pytest.raises(AlreadyRunning, match="host id 'a'"):
            async with running(host_config(tmp_path / "x", "a"), pg_url):
                pass
        await start(stack, host_config(tmp_path, "b"), pg_url, http)  # another id is fine


async def _acknowledged(client: Client) -> bool:
    _, peeked = await client.call("GET", f"/v1/watchers/{MAIN}/notices")
    return not peeked["notices"]


async def _next_notice(response: aiohttp.ClientResponse) -> Any:
    async def first() -> Any:
        event = None
        async for raw in response.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: ") and event == "notice":
                return orjson.loads(line.removeprefix("data: "))
        raise AssertionError("the stream ended")

    return await asyncio.wait_for(first(), 20)


async def test_a_notice_opened_on_one_sidecar_reaches_the_other(
    pg_url: str, tmp_path: Path, hooks_gateway: HooksGateway
) -> None:
    """Recorded through A: B's stream pushes it, B's peek route shows it (its own stream is
    not a delivery), and the gateway is woken once in all: A woke it, and B, seeing the same
    notice, does not wake it again."""
    gateway = hooks_gateway
    gateway.status = 503  # the gateway is down until the stream and the peek have seen it
    wake = gateway.config(tmp_path, retry_interval_s=0.5)
    async with AsyncExitStack() as stack, aiohttp.ClientSession() as http:
        a = await start(stack, host_config(tmp_path, "a", gateway=wake), pg_url, http)
        b = await start(stack, host_config(tmp_path, "b", gateway=wake), pg_url, http)
        await a.call("POST", "/v1/spawns", {"parent": MAIN, "child": CHILD, "runId": "r"})
        headers = {"Authorization": f"Bearer {b.token}"}
        url = f"{b.base}/v1/watchers/{MAIN}/notices/stream"
        async with http.get(url, headers=headers) as stream:
            body = {"sessionKey": CHILD, "kind": "human_direct_message", "actorType": "human"}
            assert 200 == (await a.call("POST", "/v1/events", body))[0]
            expected = {"target": CHILD, "text": notice(CHILD, 1)}
            assert expected == await _next_notice(stream)
        _, peeked = await b.call("GET", f"/v1/watchers/{MAIN}/notices")
        assert [expected] == peeked["notices"]
        gateway.status = None
        await asyncio.wait_for(gateway.woken.wait(), 20)
        await until("the acknowledgement", lambda: _acknowledged(a))
        for sidecar in (a.sidecar, b.sidecar):  # whatever either had in flight has ended
            assert sidecar.delivery is not None
            await sidecar.delivery.settled()
        assert [notice(CHILD, 1)] == gateway.texts


async def test_a_notice_opened_by_another_process_wakes_through_the_sidecar(
    store_target: Path | str, tmp_path: Path, hooks_gateway: HooksGateway
) -> None:
    """Recorded by a second kernel (as a CLI process would), on either store: the sidecar
    wakes the watcher."""
    from monitor.kernel import Kernel, NewEvent
    from monitor.kernel.events import ActorType, EventKind

    gateway = hooks_gateway
    wake = gateway.config(tmp_path)
    async with AsyncExitStack() as stack, aiohttp.ClientSession() as http:
        await start(stack, host_config(tmp_path, "b", gateway=wake), store_target, http)
        other = await Kernel.open(store_target)
        try:
            await other.spawn(parent=MAIN, child=CHILD, run_id="r")
            human = NewEvent(
                session_key=CHILD, kind=EventKind.HUMAN_DIRECT_MESSAGE, actor_type=ActorType.HUMAN
            )
            await other.record(human)
        finally:
            await other.close()
        await asyncio.wait_for(gateway.woken.wait(), 20)
        assert [MAIN] == [w["sessionKey"] for w in gateway.wakes]


async def _adopt(client: Client, path: Path, key: str) -> None:
    body = {"kind": "claude", "path": str(path), "sessionKey": key, "sessionId": "s"}
    status, answer = await client.call("POST", "/v1/links", body)
    assert 200 == status, answer
    assert answer["link"]["hostId"] == f"gateway:{client.sidecar.config.host.id}"
    status, _ = await client.call("POST", "/v1/watches", {"watcher": MAIN, "target": key})
    assert 200 == status


async def test_each_host_ticks_only_its_own_files(pg_url: str, tmp_path: Path) -> None:
    async with AsyncExitStack() as stack, aiohttp.ClientSession() as http:
        a = await start(stack, host_config(tmp_path, "a"), pg_url, http)
        b = await start(stack, host_config(tmp_path, "b"), pg_url, http)
        transcripts = {}
        for client, name in ((a, "a"), (b, "b")):
            path = tmp_path / name / "claude" / "p" / f"{name}.jsonl"
            path.parent.mkdir(parents=True)
            path.write_bytes(b"")
            await _adopt(client, path, f"agent:main:adopted:{name}")
            transcripts[name] = path
        for name, path in transcripts.items():
            with path.open("ab") as f:
                f.write(user_line(f"typed on {name}"))
        ticked_a = {r.session_key for r in await a.sidecar.monitor.ticker.tick()}
        ticked_b = {r.session_key for r in await b.sidecar.monitor.ticker.tick()}
        assert ({"agent:main:adopted:a"}, {"agent:main:adopted:b"}) == (ticked_a, ticked_b)
        for name in ("a", "b"):
            status = wire.status(
                await a.sidecar.kernel.status(f"agent:main:adopted:{name}", changes_since=0)
            )
            kinds = [e["kind"] for e in status["stateChanges"]["events"]]
            assert ["adopted", "human_direct_message"] == kinds


def _holders(sidecars: list[Sidecar]) -> list[bool]:
    leases = [s.monitor.ticker.holds_shared() for s in sidecars]
    return leases


async def test_the_shared_lease_is_held_once_and_taken_over(pg_url: str, tmp_path: Path) -> None:
    """One sidecar ticks the links without a host; when it stops renewing (as if killed),
    another takes them over within one tick interval."""
    fast = MonitorConfig(interval_s=2, initial_delay_s=3600, watch_files=False)
    async with AsyncExitStack() as stack, aiohttp.ClientSession() as http:
        a = await start(stack, host_config(tmp_path, "a", monitor=fast), pg_url, http)
        b = await start(stack, host_config(tmp_path, "b", monitor=fast), pg_url, http)
        sidecars = [a.sidecar, b.sidecar]
        assert 1 == sum(_holders(sidecars))
        holder = sidecars[_holders(sidecars).index(True)]
        other = sidecars[1 - sidecars.index(holder)]
        assert holder.leases is not None and holder.leases.keeper is not None
        async with other.kernel.bus.listen((OwnershipChanged,)) as heard:
            holder.leases.keeper.cancel()  # it stops renewing, never releases: as a SIGKILL
            change = await heard.next(timeout=30)  # one tick interval here; bench/hosts.py
        assert isinstance(change, OwnershipChanged) and change.shared
        assert other.monitor.ticker.holds_shared()
        lease = await other.kernel.read(
            lambda c: c.execute(
                "SELECT holder FROM sessionwatch_leases WHERE name = ?", (SHARED,)
            ).fetchone()
        )
        assert other.config.host.id is not None and lease is not None


async def test_two_monitors_ticking_the_same_links_record_each_turn_once(
    pg_url: str, tmp_path: Path
) -> None:
    """Even without the lease (two hosts configured alike tick at once), dedupe keys and the
    link's compare-and-set record each turn once."""
    from monitor.kernel import Kernel
    from monitor.upstream import UpstreamMonitor

    config = host_config(tmp_path, "a")
    root = Path(config.roots.claude)
    first, second = await Kernel.open(pg_url), await Kernel.open(pg_url)
    try:
        monitors = [UpstreamMonitor.from_config(k, config) for k in (first, second)]
        path = root / "p" / "s.jsonl"
        path.parent.mkdir(parents=True)
        path.write_bytes(b"")
        key = "agent:main:adopted:s"
        await monitors[0].adoption.adopt(
            kind="claude", path=str(path), session_key=key, session_id="s"
        )
        await first.watch(watcher=MAIN, target=key)
        for turn in range(10):
            with path.open("ab") as f:
                f.write(user_line(f"turn {turn}", f"u{turn}"))
            await asyncio.gather(*(m.ticker.tick() for m in monitors))
        events = (wire.status(await first.status(key, changes_since=0)))["stateChanges"]["events"]
        turns = sum((e.get("payload") or {}).get("turns", 1) for e in events[1:])
        assert 10 == turns
    finally:
        await first.close()
        await second.close()


async def test_a_stopped_store_answers_503_and_the_tick_catches_up(
    pg_server: PgServer, pg_url: str, tmp_path: Path
) -> None:
    if pg_server.cluster is None:
        pytest.skip("the server is not ours to stop ($SESSIONWATCH_TEST_PG)")
    async with AsyncExitStack() as stack, aiohttp.ClientSession() as http:
        a = await start(stack, host_config(tmp_path, "a"), pg_url, http)
        path = tmp_path / "a" / "claude" / "p" / "s.jsonl"
        path.parent.mkdir(parents=True)
        path.write_bytes(b"")
        key = "agent:main:adopted:s"
        await _adopt(a, path, key)
        await asyncio.to_thread(pg_server.cluster.stop)
        try:
            with path.open("ab") as f:
                f.write(user_line("typed while the store was down"))
            body = {"sessionKey": CHILD, "kind": "goal_changed", "actorType": "human"}
            status, answer = await a.call("POST", "/v1/events", body)
            assert (503, False) == (status, answer["recorded"])
            with pytest.raises(StoreError):  # the service logs it; the marker stays
                await a.sidecar.monitor.ticker.tick()
        finally:
            await asyncio.to_thread(pg_server.cluster.start)
        for _ in range(50):  # the pool reconnects with backoff
            status, answer = await a.call("POST", "/v1/events", body)
            if status == 200:
                break
            await asyncio.sleep(0.2)
        assert (200, True) == (status, answer["recorded"])
        # This tick, or file watching's catch-up check once the store is back (whichever runs
        # first), records the turn typed meanwhile: once, never lost.
        await a.sidecar.monitor.ticker.tick()
        found = wire.status(await a.sidecar.kernel.status(key, changes_since=0))
        kinds = [e["kind"] for e in found["stateChanges"]["events"]]
        assert ["adopted", "human_direct_message"] == kinds


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda url: url.rsplit("/", 1)[0] + "/no_such_database", "does not exist"),
        (lambda url: _with_user(url, "no_such_role"), 'role "no_such_role"'),
        (lambda url: "postgresql://sw:s3cretpw@127.0.0.1:1/x", "Connection refused"),
    ],
)
async def test_postgresql_says_why_it_cannot_connect_at_once(
    pg_url: str, change: Any, said: str
) -> None:
    """PostgreSQL's own reason, in one line, without the password, and without waiting for a
    pool to time out."""
    from monitor.kernel import Kernel

    with pytest.raises(StoreError) as caught:
        await Kernel.open(change(pg_url))
    assert said in str(caught.value)
    assert "s3cretpw" not in str(caught.value)
    assert "pool initialization incomplete" not in str(caught.value)


def _with_user(url: str, user: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))
