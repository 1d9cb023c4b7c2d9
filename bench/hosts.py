"""Several hosts on one PostgreSQL: two ``sessionwatch serve`` processes (hosts ``a`` and
``b``) on one throwaway cluster (or ``--url``), three figures.

Run: python bench/hosts.py [--events 2000] [--clients 8] [--rows 50000] [--samples 200]
     [--only abc|b|d]

(a) Recording throughput: ``--events`` events POSTed to the two sidecars at once (``--clients``
    connections each, half to each host), against a plain psycopg loop on one connection
    running the same transaction (the kernel's ``record_event`` body, with ten watchers).
(b) ``changesSince`` at ``--rows`` rows, 20 events back, on the PostgreSQL store: p50/p99
    as the API asks it (``Kernel.changes_answer``) and as the Python object
    (``Kernel.status``), against two floors: ``SELECT 1`` the API's way (a thread hop, a
    pooled connection, a round trip) and the API's statement on a bare connection in this
    thread (target p99 under 2 ms, as on SQLite).
(c) The latency from an event recorded through sidecar A to its notice on sidecar B's SSE
    stream: p50/p99 over ``--samples`` notices (target p99 under one second).
(d) What hosts cost: 1, 2, 4 and 8 sidecars (``--hosts``) on one database, each waking a
    hooks stand-in (tests/wake_sink.py), while turns flow: one turn every 0.25 s for
    ``--seconds``, on 10 targets each watched by its own main session, recorded through
    the sidecars' APIs in turn. For each count: the CPU each host used (a share of one
    core), the database's committed transactions per turn and per wake
    (``pg_stat_database``), the lease writes per second (``sessionwatch_leases``' row
    updates, ``pg_stat_user_tables``), and a turn's time to its wake (p50, max).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psycopg

sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).parent.resolve()]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.trees import source_of  # noqa: E402
from monitor.clock import now_ms  # noqa: E402
from monitor.kernel import Kernel  # noqa: E402
from monitor.kernel.drafts import make_draft  # noqa: E402
from monitor.kernel.events import ActorType, EventKind  # noqa: E402
from monitor.kernel.signal_log import record_event, status_answer  # noqa: E402
from monitor.kernel.store.pg_schema import migrate  # noqa: E402
from monitor.kernel.store.postgres import PgConn  # noqa: E402
from tests.helpers import served_address  # noqa: E402
from tests.pg_cluster import Cluster, fresh_database  # noqa: E402

TARGET = "agent:main:subagent:target"
WATCHERS = [f"agent:w{i}:main" for i in range(10)]
MAIN = "agent:main:main"


def seed_watchers(url: str) -> None:
    with psycopg.connect(url) as conn:
        migrate(PgConn(conn), now_ms())
        for w in WATCHERS:
            conn.execute(
                "INSERT INTO session_watch_cursors (watcher_session_key, watcher_store_path,"
                " target_session_key, updated_at) VALUES (%s, 'default', %s, 0)"
                " ON CONFLICT DO NOTHING",
                (w, TARGET),
            )


def baseline(url: str, n: int) -> float:
    """Events per second of a plain psycopg loop running the recording transaction."""
    seed_watchers(url)
    with psycopg.connect(url) as conn:
        start = time.perf_counter()
        for _ in range(n):
            now = now_ms()
            draft = make_draft(
                session_key=TARGET,
                kind=EventKind.HUMAN_DIRECT_MESSAGE,
                actor_type=ActorType.HUMAN,
                payload={"channel": "bench"},
                now=now,
            )
            with conn.transaction():
                record_event(PgConn(conn), draft, now)
        return n / (time.perf_counter() - start)


def start_sidecar(
    url: str,
    root: Path,
    host: str,
    extra: str = "",
    interval_s: float = 3600,
    tree: Path | None = None,
) -> tuple[subprocess.Popen[str], str, str]:
    """``tree``: a release's source to run it from (its ``monitor``), else this one's."""
    home = root / host
    (home / "claude").mkdir(parents=True)
    config = home / "sessionwatch.toml"
    config.write_text(
        f'[host]\nid = "{host}"\n[roots]\nclaude = "{home / "claude"}"\n'
        f"[monitor]\ninitial_delay_s = 3600\ninterval_s = {interval_s}\nwatch_files = false\n"
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{home / "token"}"\n{extra}'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "--db", url, "--config", str(config), "serve"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=tree,  # where ``-m monitor`` is found first
        env={**os.environ, "PYTHONPATH": str(tree)} if tree else None,
    )
    base = served_address(proc)
    return proc, base, (home / "token").read_text().strip()


async def sidecar_throughput(
    sidecars: list[tuple[str, str]], n: int, clients: int
) -> tuple[float, float]:
    """Events per second through the two sidecars' APIs at once, and the p99 (ms)."""
    body = orjson.dumps({"sessionKey": TARGET, "kind": "goal_changed", "actorType": "agent"})
    latencies: list[float] = []
    counter = iter(range(n))

    async def worker(http: aiohttp.ClientSession, base: str, token: str) -> None:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        for _ in counter:
            t = time.perf_counter()
            async with http.post(f"{base}/v1/events", data=body, headers=headers) as r:
                assert r.status == 200, await r.text()
                await r.read()
            latencies.append(time.perf_counter() - t)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        start = time.perf_counter()
        await asyncio.gather(
            *(worker(http, base, token) for base, token in sidecars for _ in range(clients // 2))
        )
        elapsed = time.perf_counter() - start
    return n / elapsed, statistics.quantiles(latencies, n=100)[98] * 1000


async def changes_since(url: str, rows: int, samples: int) -> dict[str, tuple[float, float]]:
    """p50/p99 (ms) of a 20-events-back ``changesSince`` at ``rows`` rows: as the API asks
    it (``Kernel.changes_answer``: one statement builds the answer's JSON), as the Python
    object (``Kernel.status``), and the API's statement on a bare autocommit connection
    in this thread (the floor: no pool, no thread hop)."""
    with psycopg.connect(url) as conn:
        migrate(PgConn(conn), now_ms())
        conn.execute(
            "INSERT INTO session_state_events (session_key, agent_id, kind, actor_type,"
            " occurred_at, summary) SELECT 'agent:main:subagent:s' || (g %% 50), 'main',"
            " 'goal_changed', 'agent', %s, 'goal changed' FROM generate_series(1, %s) AS g",
            (now_ms(), rows),
        )
        conn.execute(
            "INSERT INTO session_state_heads (session_key, agent_id, last_sequence, updated_at)"
            " SELECT session_key, agent_id, max(sequence), 0 FROM session_state_events"
            " GROUP BY session_key, agent_id ON CONFLICT DO NOTHING"
        )
        conn.execute(  # a session with two events, the newest of the log
            "INSERT INTO session_state_events (session_key, agent_id, kind, actor_type,"
            " occurred_at, summary) SELECT 'agent:main:sparse', 'main', 'goal_changed',"
            " 'agent', %s, 'goal changed' FROM generate_series(1, 2)",
            (now_ms(),),
        )
        conn.execute("ANALYZE")
    key = "agent:main:subagent:s7"
    kernel = await Kernel.open(url)
    floor = psycopg.connect(url, autocommit=True)
    try:
        head = (await kernel.status(key)).state_version
        since = head - 20 * 50
        ways: dict[str, Any] = {
            "API (changes_answer)": lambda: kernel.changes_answer(key, agent_id=None, since=since),
            "Python object (status)": lambda: kernel.status(key, changes_since=since),
            "API, a session of two events, from 0": lambda: kernel.changes_answer(
                "agent:main:sparse", agent_id=None, since=0
            ),
            "Python object, the same": lambda: kernel.status("agent:main:sparse", changes_since=0),
            "floor: SELECT 1 the API's way": lambda: kernel.store.peek(
                lambda conn: conn.execute("SELECT 1").fetchone(), single=True
            ),
        }
        out: dict[str, tuple[float, float]] = {}
        for name, call in ways.items():
            times = []
            for _ in range(samples):
                t = time.perf_counter()
                await call()
                times.append((time.perf_counter() - t) * 1000)
            out[name] = (statistics.median(times), statistics.quantiles(times, n=100)[98])
        times = []
        for _ in range(samples):
            t = time.perf_counter()
            status_answer(PgConn(floor), key, "main", since)
            times.append((time.perf_counter() - t) * 1000)
        out["its statement, bare connection"] = (
            statistics.median(times),
            statistics.quantiles(times, n=100)[98],
        )
    finally:
        floor.close()
        await kernel.close()
    return out


async def notice_latency(a: tuple[str, str], b: tuple[str, str], samples: int) -> list[float]:
    """Seconds from an event POSTed to A to its notice on B's stream, ``samples`` times."""
    (base_a, token_a), (base_b, token_b) = a, b
    out: list[float] = []
    async with aiohttp.ClientSession() as http:
        headers_a = {"Authorization": f"Bearer {token_a}"}
        headers_b = {"Authorization": f"Bearer {token_b}"}
        spawn = {"parent": MAIN, "child": "agent:main:subagent:lat", "runId": "r"}
        async with http.post(f"{base_a}/v1/spawns", json=spawn, headers=headers_a) as r:
            assert r.status == 200
        url = f"{base_b}/v1/watchers/{MAIN}/notices/stream"
        async with http.get(url, headers=headers_b, timeout=aiohttp.ClientTimeout()) as stream:
            body = {"sessionKey": spawn["child"], "kind": "goal_changed", "actorType": "agent"}
            for _ in range(samples):
                sent = time.perf_counter()
                async with http.post(f"{base_a}/v1/events", json=body, headers=headers_a) as r:
                    assert r.status == 200
                async for raw in stream.content:
                    if raw.startswith(b"data: "):
                        out.append(time.perf_counter() - sent)
                        break
                drain = f"{base_b}/v1/watchers/{MAIN}/notices/drain"
                async with http.post(drain, headers=headers_b) as r:
                    assert r.status == 200
    return out


def cpu_s(pid: int) -> float:
    """User and system CPU seconds a process used so far (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Counts:
    """The database's committed transactions and rows read (``pg_stat_database``), the
    lease table's row writes, and the CPU seconds the sidecars used, at one moment."""

    xacts: int
    rows: int
    leases: int
    cpu: float

    def __sub__(self, other: Counts) -> Counts:
        return Counts(
            self.xacts - other.xacts,
            self.rows - other.rows,
            self.leases - other.leases,
            self.cpu - other.cpu,
        )


def counts(url: str, pids: list[int]) -> Counts:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        db = conn.execute(
            "SELECT xact_commit, tup_returned + tup_fetched FROM pg_stat_database"
            " WHERE datname = current_database()"
        ).fetchone()
        leases = conn.execute(
            "SELECT n_tup_upd + n_tup_ins FROM pg_stat_user_tables"
            " WHERE relname = 'sessionwatch_leases'"
        ).fetchone()
    return Counts(
        int(db[0]) if db else 0,
        int(db[1]) if db else 0,
        int(leases[0]) if leases else 0,
        sum(cpu_s(pid) for pid in pids),
    )


@dataclass(frozen=True)
class Cost:
    """(d) for one count of hosts: an idle window (the upkeep: leases, ticks) and a window
    of turns of the same length."""

    hosts: int
    seconds: float
    idle: Counts
    busy: Counts
    turns: int
    wakes: int
    to_wake_ms: tuple[float, float]  # a turn's time to its wake: p50, max

    def per_turn(self, field: str) -> float:
        """``field`` per turn, the idle window's rate taken out (upkeep apart)."""
        return max(0.0, getattr(self.busy, field) - getattr(self.idle, field)) / max(self.turns, 1)

    def line(self) -> str:
        s = self.seconds
        return (
            f"{self.hosts} hosts: per turn {self.per_turn('xacts'):.1f} transactions,"
            f" {self.per_turn('rows'):.0f} rows read, {self.per_turn('cpu') * 1000:.0f} ms CPU"
            f" (all hosts, upkeep apart); raw {self.busy.xacts / max(self.turns, 1):.1f}"
            f" transactions per turn, {self.busy.xacts / max(self.wakes, 1):.1f} per wake"
            f" ({self.turns} turns, {self.wakes} wakes); upkeep {self.idle.xacts / s:.1f}"
            f" transactions/s, {self.idle.leases / s:.2f} lease writes/s,"
            f" CPU {self.idle.cpu / s / self.hosts * 100:.1f} % of a core per host; first turn"
            f" to its wake p50 {self.to_wake_ms[0]:.0f} ms, max {self.to_wake_ms[1]:.0f} ms"
        )


async def hosts_cost(admin: str, count: int, seconds: float, tree: Path | None) -> Cost:
    """(d) for ``count`` sidecars, run from ``tree`` (a release's source; None: this one)."""
    from tests.wake_sink import HOOKS_TOKEN, WakeSink

    url = fresh_database(admin, f"bench_hosts_{count}")
    with psycopg.connect(url) as conn:
        migrate(PgConn(conn), now_ms())
    sink = WakeSink()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        token_file = root / "hooks-token"
        token_file.write_text(HOOKS_TOKEN + "\n")
        token_file.chmod(0o600)
        procs: list[subprocess.Popen[str]] = []
        try:
            apis = []
            for n in range(count):
                gateway = (
                    f'[gateway]\nhooks_url = "{sink.url_for(f"h{n}")}"\n'
                    f'hooks_token_file = "{token_file}"\n'
                )
                proc, base, token = start_sidecar(url, root, f"h{n}", gateway, 10, tree)
                procs.append(proc)
                apis.append((base, {"Authorization": f"Bearer {token}"}))
            pids = [p.pid for p in procs]
            targets = [f"agent:main:subagent:t{i}" for i in range(10)]
            async with aiohttp.ClientSession() as http:
                base, headers = apis[0]
                for i, target in enumerate(targets):
                    watch = {"watcher": f"agent:w{i}:main", "target": target}
                    async with http.post(f"{base}/v1/watches", json=watch, headers=headers) as r:
                        assert r.status == 200, await r.text()
                await asyncio.sleep(3)  # the leases and the shares settle
                before = counts(url, pids)
                await asyncio.sleep(seconds)  # the upkeep alone
                idle = counts(url, pids) - before
                sent: dict[str, float] = {}
                before = counts(url, pids)
                start, turns = time.monotonic(), 0
                while time.monotonic() - start < seconds:
                    target = targets[turns % len(targets)]
                    base, headers = apis[turns % len(apis)]
                    body = {"sessionKey": target, "kind": "human_direct_message",
                            "actorType": "human"}  # fmt: skip
                    sent.setdefault(target, time.monotonic())
                    async with http.post(f"{base}/v1/events", json=body, headers=headers) as r:
                        assert r.status == 200, await r.text()
                    turns += 1
                    await asyncio.sleep(0.25)
                await asyncio.sleep(max(0.0, seconds - (time.monotonic() - start)))
                busy = counts(url, pids) - before
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=30)
            sink.close()
    calls = [c for c in sink.calls if c.answer == 200 and c.at >= start]
    first_call: dict[str, float] = {}
    for c in calls:
        first_call.setdefault(c.watcher, c.at)
    to_wake = sorted(
        first_call[f"agent:w{i}:main"] - sent[t]
        for i, t in enumerate(targets)
        if f"agent:w{i}:main" in first_call and t in sent
    )
    ms = (
        (statistics.median(to_wake) * 1000, max(to_wake) * 1000)
        if to_wake
        else (float("nan"), float("nan"))
    )
    return Cost(count, seconds, idle, busy, turns, len(calls), ms)


def cost_table(costs: dict[str, list[Cost]]) -> str:
    """A markdown table: per turn, upkeep apart, for each tree and count of hosts, with the
    ratio to the tree's own 1-host figure."""
    lines = [
        "| tree | hosts | transactions per turn | x 1 host | rows read per turn | x 1 host"
        " | CPU ms per turn (all hosts) | upkeep transactions/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in costs.items():
        one = runs[0]
        for c in runs:
            tx, rows = c.per_turn("xacts"), c.per_turn("rows")
            lines.append(
                f"| {name} | {c.hosts} | {tx:.1f} | {tx / max(one.per_turn('xacts'), 1e-9):.2f}"
                f" | {rows:.0f} | {rows / max(one.per_turn('rows'), 1e-9):.2f}"
                f" | {c.per_turn('cpu') * 1000:.0f} | {c.idle.xacts / c.seconds:.1f} |"
            )
    return "\n".join(lines)


async def through_two_sidecars(admin: str, args: argparse.Namespace) -> None:
    """(a) and (c): events recorded through two sidecars, and a notice from one to the other."""
    plain = baseline(fresh_database(admin, "bench_plain"), args.events)
    url = fresh_database(admin, "bench_hosts")
    seed_watchers(url)
    with tempfile.TemporaryDirectory() as tmp:
        started = [start_sidecar(url, Path(tmp), host) for host in ("a", "b")]
        try:
            sidecars = [(base, token) for _, base, token in started]
            rate, p99 = await sidecar_throughput(sidecars, args.events, args.clients)
            print(
                f"(a) recording through two sidecars ({args.clients} clients): {rate:,.0f}"
                f" events/s, p99 {p99:.1f} ms; plain psycopg loop {plain:,.0f} events/s;"
                f" ratio {rate / plain:.2f}"
            )
            lat = await notice_latency(sidecars[0], sidecars[1], args.samples)
            q = statistics.quantiles(lat, n=100)
            print(
                f"(c) event on A to notice on B's stream: p50 {statistics.median(lat) * 1000:.0f}"
                f" ms, p99 {q[98] * 1000:.0f} ms over {len(lat)} notices (target p99 < 1000 ms)"
            )
        finally:
            for proc, _, _ in started:
                proc.terminate()
                proc.wait(timeout=30)


async def what_hosts_cost(admin: str, args: argparse.Namespace) -> None:
    """(d) on this tree, and on ``--against`` in the same run, each count in turn."""
    with tempfile.TemporaryDirectory() as tmp:
        trees: dict[str, Path | None] = {"this tree": None}
        if args.against:
            trees[args.against] = source_of(args.against, Path(tmp) / "release")
        costs: dict[str, list[Cost]] = {name: [] for name in trees}
        for count in (int(n) for n in args.hosts.split(",")):
            for name, tree in trees.items():
                cost = await hosts_cost(admin, count, args.seconds, tree)
                costs[name].append(cost)
                print(f"(d) {name}: {cost.line()}", flush=True)
        print(cost_table(costs), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a PostgreSQL server to use (default: a throwaway one)")
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--hosts", default="1,2,4,8,16,32", help="(d): the sidecar counts")
    parser.add_argument("--seconds", type=float, default=20, help="(d): turns flow this long")
    parser.add_argument("--against", default="", help="(d): a release's git ref, run alongside")
    parser.add_argument("--only", choices=("abc", "b", "d"), help="run only these parts")
    args = parser.parse_args()
    cluster = None
    if args.url is None:
        cluster = Cluster(options="-c max_connections=1000")  # 32 sidecars' pools
        cluster.start()
    admin = args.url or (cluster.url if cluster else "")
    try:
        if args.only in (None, "d"):
            await what_hosts_cost(admin, args)
        if args.only == "d":
            return
        if args.only != "b":
            await through_two_sidecars(admin, args)
        ways = await changes_since(fresh_database(admin, "bench_changes"), args.rows, args.samples)
        for name, (p50, p99c) in ways.items():
            print(
                f"(b) changesSince at {args.rows:,} rows, {name}: p50 {p50:.2f} ms,"
                f" p99 {p99c:.2f} ms (target p99 < 2 ms)"
            )
    finally:
        if cluster is not None:
            cluster.destroy()


if __name__ == "__main__":
    asyncio.run(main())
