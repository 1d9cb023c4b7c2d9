"""Hosts as hosts: three ``serve`` processes on one PostgreSQL, each in its own network
namespace, under random faults in combination (tests/hosts_chaos.py, tests/netns.py).

The short run goes in every suite run; the long one is behind the ``long`` marker
(``pytest -m long tests/delivery/test_hosts_netns.py``; ``SESSIONWATCH_CHAOS_S`` sets its
length, 1200 s unless set). ``SESSIONWATCH_CHAOS_SEED`` replays a run: each run prints its
seed, its faults and its figures."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netns
from tests.hosts_chaos import FAKETIME, HOSTS, Chaos, violations
from tests.pg_cluster import Cluster, fresh_database
from tests.pg_cluster import why_unavailable as pg_unavailable


def _why_not() -> str | None:
    return (
        netns.why_unavailable()
        or pg_unavailable()
        or (None if Path(FAKETIME).exists() else "libfaketime is not installed (faketime)")
    )


def _skip_unless_possible() -> None:
    reason = _why_not()
    if reason:
        if os.environ.get("SESSIONWATCH_REQUIRE_NETNS"):  # CI: it must run
            raise RuntimeError(f"SESSIONWATCH_REQUIRE_NETNS is set, but {reason}")
        pytest.skip(reason)


@pytest.fixture
def chaos(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Chaos]:
    """Three hosts, or as many as the test's ``hosts`` mark says."""
    _skip_unless_possible()
    seed = int(os.environ.get("SESSIONWATCH_CHAOS_SEED") or random.randrange(1 << 30))
    mark = request.node.get_closest_marker("hosts")
    hosts = tuple(f"h{n}" for n in range(mark.args[0])) if mark else HOSTS
    made = Chaos(tmp_path, seed, hosts)
    try:
        yield made
    finally:
        made.close()


def _run(chaos: Chaos, seconds: float) -> None:
    try:
        chaos.run(seconds)
        chaos.settle()
    finally:
        print(f"seed {chaos.record.seed}")
        for at, what in chaos.record.faults:
            print(f"  {at:10.1f} {what}")
    problems, figures = violations(chaos)
    print(figures)
    assert problems == [], problems


def test_three_hosts_under_random_faults_keep_every_promise(chaos: Chaos) -> None:
    _run(chaos, float(os.environ.get("SESSIONWATCH_CHAOS_SHORT_S") or 75))


LONG_S = float(os.environ.get("SESSIONWATCH_CHAOS_S") or 1200)


@pytest.mark.long
@pytest.mark.timeout(LONG_S + 600)
def test_three_hosts_under_random_faults_for_twenty_minutes(chaos: Chaos) -> None:
    _run(chaos, LONG_S)


@pytest.mark.long
@pytest.mark.hosts(16)
@pytest.mark.timeout(LONG_S + 900)
def test_sixteen_hosts_under_random_faults_keep_every_promise(chaos: Chaos) -> None:
    """Each watcher woken by one owner of sixteen (delivery/shares.py), while hosts are cut,
    paused, killed and their clocks stepped: the shares move, and every promise holds."""
    _run(chaos, LONG_S)


# Host a's write: it takes the one write lock, says so, and sits in its transaction (a
# host cut off mid-write sends nothing more, whatever it does meanwhile).
CUT_MID_WRITE = """
import asyncio, sys, time
from monitor.kernel.store.postgres import PgStore
async def main():
    store = await PgStore.open(sys.argv[1])
    def write(conn):
        conn.execute("SELECT 1")
        print("locked", flush=True)
        time.sleep(40)
    await store.write(write)
asyncio.run(main())
"""


def test_a_host_cut_off_mid_write_holds_no_other_hosts_writes_for_long() -> None:
    """Host a takes the one write lock and is cut off from PostgreSQL (its link down: no
    FIN, no RST). Host b's first write goes through once the server has ended a's session
    idle in its transaction (``IDLE_IN_TRANSACTION_MS``), within b's one lock wait
    (``WRITE_TIMEOUT_MS``), while the cut still lasts; an earlier release held every host's
    writes for as long as the cut (and a cut that never heals until the server's TCP gave
    up, hours)."""
    _skip_unless_possible()
    net = netns.Net()
    cluster = Cluster(netns=net.bridge, listen=net.pg_address)
    writer: subprocess.Popen[str] | None = None
    try:
        cluster.start()
        with netns.inside(net.bridge):
            url = fresh_database(cluster.url, "cut")
        for host in ("a", "b"):
            net.add_host(host)
        inside = ["ip", "netns", "exec"]
        writer = subprocess.Popen(
            [*inside, net.ns("a"), sys.executable, "-c", CUT_MID_WRITE, url],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "locked"
        net.cut("a", ("pg",))
        cut_at = time.monotonic()
        record = [sys.executable, "-m", "monitor", "--db", url, "record", "--session"]
        record += ["agent:main:main", "--kind", "goal_changed", "--actor", "agent"]
        done = subprocess.run([*inside, net.ns("b"), *record], capture_output=True, text=True)
        answers = [(round(time.monotonic() - cut_at, 1), done.returncode, done.stderr)]
        assert answers[-1][1] == 0, answers  # one lock wait, never a coin flip
        assert time.monotonic() - cut_at < 25, answers  # a's link is still down (40 s)
        print(f"b's write went through {answers[-1][0]} s after a was cut: {answers}")
    finally:
        if writer is not None:
            writer.kill()
            writer.wait()
        cluster.destroy()
        net.close()


# A wake call from host a: ready() says "connected" and waits for the test (which cuts the
# link meanwhile), then the request goes into the cut link, and the call is given up after
# read_s. GRACEFUL: ended as an earlier release did (a plain close): the control.
GIVEN_UP = """
import asyncio, sys
from monitor.delivery import transport
from monitor.delivery.transport import CallFailed, OneShotTransport
if sys.argv[2] == "graceful":
    transport._end = lambda writer, whole: writer.close()
async def main():
    async def ready():
        print("connected", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        return True
    try:
        await OneShotTransport(read_s=2).post(sys.argv[1], b'{"text": "x"}', {}, ready)
    except CallFailed as exc:
        print(f"gave up: {exc}", flush=True)
asyncio.run(main())
"""


@pytest.mark.parametrize("ending", ["reset", "graceful"])
def test_a_call_given_up_on_a_cut_link_never_reaches_the_gateway_once_it_heals(
    ending: str,
) -> None:
    """Host a's link to the gateway is cut while its request is in flight; the call is
    given up (no answer in 2 s) and the link heals a second later (the drain meanwhile).
    Reset, nothing of the call reaches the gateway, then or later. The control, a plain
    close as before: the kernel kept retransmitting, and the gateway received the whole
    request after the heal (seen 26.6 s after the call in the chaos runs)."""
    _skip_unless_possible()
    net = netns.Net()
    received: list[tuple[float, bytes]] = []
    client: subprocess.Popen[str] | None = None
    try:
        net.add_host("a")
        with netns.inside(net.bridge):
            server = socket.create_server((net.gateway_address, 0))
        port = server.getsockname()[1]

        def take() -> None:  # the gateway: reads whatever comes, answers nothing
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                while data := conn.recv(65536):
                    received.append((time.monotonic(), data))

        threading.Thread(target=take, daemon=True).start()
        url = f"http://{net.gateway_address}:{port}/hooks/wake"
        client = subprocess.Popen(
            ["ip", "netns", "exec", net.ns("a"), sys.executable, "-c", GIVEN_UP, url, ending],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert client.stdin is not None and client.stdout is not None
        assert client.stdout.readline().strip() == "connected"
        net.cut("a", ("gw",))
        client.stdin.write("\n")  # the request goes into the cut link
        client.stdin.flush()
        assert client.stdout.readline().startswith("gave up: no answer in time")
        time.sleep(1.0)  # a drain through another host takes the notice meanwhile
        net.cut("a", ("gw",), down=False)
        healed = time.monotonic()
        time.sleep(10.0)  # TCP retransmits 3.0, 6.2 and 12.6 s after the send
        late = [round(at - healed, 1) for at, _ in received if at >= healed]
        if ending == "reset":
            assert received == [], late
        else:
            assert b"POST /hooks/wake" in b"".join(data for _, data in received), late
            print(f"a plain close: the request arrived {late} s after the heal")
    finally:
        if client is not None:
            client.kill()
            client.wait()
        net.close()
