"""Three hosts on one PostgreSQL, each in its own network namespace (tests/netns.py), under
faults drawn at random and in combination, with turns, wakes and drains flowing, then
checked from outside: from the hooks stand-in's record, the proxies' and the store.

Faults (Jepsen's nemeses and etcd's robustness tests are the models):

- ``cut``: a host's link to PostgreSQL, to the gateway, or both, taken down for a while;
- ``slow``: a host's proxy adds a delay to every chunk, or trickles the answer a line at a
  time, past the lease (a gateway that sends its headers at once and its body late);
- ``blackhole``: a host's answers from the gateway are lost one way (its requests arrive,
  the gateway's answers never come back, until the caller gives up: the named
  ``unanswered`` repeat);
- ``pause``: SIGSTOP, SIGCONT later, at times past the host's leases;
- ``clock``: the host's wall clock stepped by tens of seconds either way (libfaketime);
- ``restart``: PostgreSQL stopped and started again;
- ``kill``: SIGKILL, started again later.

Invariants, checked once every fault is healed and nothing is pending:

- nothing lost: every notice opened was woken and accepted, or drained;
- nothing woken after a drain;
- no window broken: calls to one watcher come a window apart, but for the one repeat of a
  call that may have reached the gateway (same text);
- nothing received three times;
- no answered call repeated: a call whose whole answer its caller read, while it ran and
  reached the store, is never made again, by it or a peer;
- each human turn on the link without a host (an OpenCode database) recorded once;
- that link carried on within two intervals once some host could carry it.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from monitor.delivery.ledger import WAKE_COALESCE_MS
from tests.netns import Net, Proxy, Relayed, inside
from tests.opencode_db import OpenCodeDB
from tests.pg_cluster import Cluster, fresh_database
from tests.wake_sink import HOOKS_TOKEN, Call, WakeSink

FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
WATCHERS = ("agent:main:main", "agent:ops:main")  # each watches CHILD
PROMPTED = "agent:dev:main"  # watches ADOPTED: one target a watcher, one window each
CHILD = "agent:main:subagent:c1"
ADOPTED = "agent:main:adopted:oc"
INTERVAL_S = 2.0
WINDOW_S = WAKE_COALESCE_MS / 1000
HOSTS = ("a", "b", "c")
FAULTS = ("cut", "slow", "blackhole", "pause", "clock", "restart", "kill")


@dataclass
class Span:
    """A stretch of time (test's monotonic clock) a host, or the store, was not able."""

    what: str
    host: str  # "" for PostgreSQL
    start: float
    end: float = float("inf")


@dataclass
class Host:
    name: str
    ns: str
    home: Path
    proxy: Proxy
    clock: Path  # libfaketime's offset file
    proc: subprocess.Popen[bytes] | None = None
    log_from: int = 0  # where its log stood when it was last started
    paused: bool = False
    cut: tuple[str, ...] = ()


@dataclass
class Record:
    """What the run did, for the invariants."""

    seed: int
    hosts: tuple[str, ...] = HOSTS
    faults: list[tuple[float, str]] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    drains: list[tuple[float, set[str]]] = field(default_factory=list)  # when, texts drained
    typed: list[float] = field(default_factory=list)  # OpenCode prompts, when typed
    seen: list[float] = field(default_factory=list)  # when each turn was first in the store
    turns: int = 0  # CLI turns that committed


class Chaos:
    def __init__(self, root: Path, seed: int, hosts: tuple[str, ...] = HOSTS) -> None:
        self.root, self.rnd = root, random.Random(seed)
        self.record = Record(seed, hosts)
        self.net = Net()
        self.cluster = Cluster(netns=self.net.bridge, listen=self.net.pg_address)
        self.cluster.start()
        with inside(self.net.bridge):
            self.db = fresh_database(self.cluster.url, "chaos")
            self.sink = WakeSink(host=self.net.gateway_address)
        (root / "hooks-token").write_text(HOOKS_TOKEN + "\n")
        (root / "hooks-token").chmod(0o600)
        self.opencode = OpenCodeDB(root / "opencode.db")
        self.opencode.session("ses_1")
        self.hosts: dict[str, Host] = {}
        for name in hosts:
            ns = self.net.add_host(name)
            with inside(self.net.bridge):
                gateway = self.net.gateway_address
                proxy = Proxy(name, gateway, (gateway, self.sink.port))
            host = Host(name, ns, root / name, proxy, root / name / "faketime")
            host.home.mkdir()
            host.clock.write_text("+0 x1\n")
            self.hosts[name] = host
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- processes ---------------------------------------------------------------------

    def config(self, host: Host) -> Path:
        path = host.home / "sessionwatch.toml"
        (host.home / "claude").mkdir(exist_ok=True)
        hooks = f"http://{self.net.gateway_address}:{host.proxy.port}/{host.name}/hooks"
        path.write_text(
            f'[host]\nid = "{host.name}"\n'
            f'[roots]\nclaude = "{host.home / "claude"}"\nopencode_db = "{self.opencode.path}"\n'
            f"[monitor]\ninterval_s = {INTERVAL_S}\ninitial_delay_s = 0\nwatch_files = false\n"
            f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{host.home / "token"}"\n'
            f'[gateway]\nhooks_url = "{hooks}"\n'
            f'hooks_token_file = "{self.root / "hooks-token"}"\nretry_interval_s = 1\n'
            "allow_plain_http = true\n"  # a link inside the test's namespaces
        )
        return path

    def cli(self, *args: str, timeout: float = 30) -> Any:
        """``sessionwatch`` run in the bridge namespace (never cut): its JSON answer, or
        None when it failed (the store restarting)."""
        argv = [sys.executable, "-m", "monitor", "--db", self.db, *args]
        try:
            proc = subprocess.run(
                ["ip", "netns", "exec", self.net.bridge, *argv],
                capture_output=True,
                timeout=timeout,
                cwd=self.root,
            )
        except subprocess.TimeoutExpired:
            return None
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def start(self, host: Host) -> None:
        env = {
            **os.environ,
            "LD_PRELOAD": FAKETIME,
            "FAKETIME_TIMESTAMP_FILE": str(host.clock),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }
        log = host.home / "serve.log"
        host.log_from = log.stat().st_size if log.exists() else 0
        config = str(self.config(host))
        argv = [sys.executable, "-m", "monitor", "--db", self.db, "--config", config]
        with log.open("ab") as out:
            host.proc = subprocess.Popen(
                ["ip", "netns", "exec", host.ns, *argv, "serve"], stderr=out, env=env
            )

    def serving(self, host: Host) -> bool:
        """Whether the host's last start is serving (False while it is down). A start that
        gave up (the store's write lock held past its wait, by a peer cut off mid-write or
        a restarting server: said in one line, exit 1) is started again, as the unit's
        ``Restart=on-failure`` does; any other exit fails the run."""
        if host.proc is None:
            return False
        log = (host.home / "serve.log").read_bytes()[host.log_from :]
        if host.proc.poll() is not None and host.proc.returncode != -signal.SIGKILL:
            tail = log.decode(errors="replace").splitlines()[-5:]
            if host.proc.returncode == 1 and b"sessionwatch serving" not in log:
                self._fault(f"start {host.name} again ({tail[-1] if tail else 'exit 1'})")
                self.start(host)
                return False
            raise AssertionError(f"serve {host.name} exited: {tail}")
        return b"sessionwatch serving" in log

    # -- faults ------------------------------------------------------------------------

    def store_down(self) -> bool:
        return any(s.what == "restart" and s.end == float("inf") for s in self.record.spans)

    def _fault(self, what: str) -> None:
        self.record.faults.append((time.monotonic(), what))

    def _span(self, what: str, host: str) -> Span:
        span = Span(what, host, time.monotonic())
        self.record.spans.append(span)
        return span

    def _later(self, delay: float, action: Any) -> None:
        timer = threading.Timer(delay, action)
        timer.daemon = True
        timer.start()
        self._threads.append(timer)

    def nemesis(self, faults: tuple[str, ...] = FAULTS) -> None:
        """One fault on a random host (or the store), healed after a random while."""
        if not faults:
            return
        kind = self.rnd.choice(faults)
        host = self.hosts[self.rnd.choice(self.record.hosts)]
        hold = self.rnd.uniform(2, 10)
        if kind == "cut" and not host.cut:
            links = self.rnd.choice((("pg",), ("gw",), ("pg", "gw")))
            self.net.cut(host.name, links)
            host.cut = links
            span = self._span("cut", host.name) if "pg" in links else None
            self._fault(f"cut {host.name} from {'+'.join(links)} for {hold:.1f} s")

            def mend() -> None:
                self.net.cut(host.name, links, down=False)
                host.cut = ()
                if span:
                    span.end = time.monotonic()

            self._later(hold, mend)
        elif kind == "slow":
            trickle = self.rnd.random() < 0.4
            if trickle:
                host.proxy.trickle_s = 5.0
            else:
                host.proxy.delay_s = self.rnd.uniform(0.2, 1.0)
            self._fault(f"slow {host.name} ({'trickle' if trickle else host.proxy.delay_s})")

            def fast() -> None:
                host.proxy.trickle_s = host.proxy.delay_s = 0.0

            self._later(hold * (3 if trickle else 1), fast)
        elif kind == "blackhole" and not host.proxy.swallow:
            host.proxy.swallow = True
            self._fault(f"blackhole {host.name}'s answers for {hold:.1f} s")

            def answered() -> None:
                host.proxy.swallow = False

            self._later(hold, answered)
        elif kind == "pause" and host.proc and not host.paused:
            if self.rnd.random() < 0.3:
                hold = self.rnd.uniform(31, 40)  # past the wake ledger's 30 s lease too
            host.proc.send_signal(signal.SIGSTOP)
            host.paused = True
            span = self._span("pause", host.name)
            self._fault(f"pause {host.name} for {hold:.1f} s")
            proc = host.proc

            def go_on() -> None:
                proc.send_signal(signal.SIGCONT)
                host.paused = False
                span.end = time.monotonic()

            self._later(hold, go_on)
        elif kind == "clock":
            step = self.rnd.choice((-90, -45, -10, 10, 45, 90))
            host.clock.write_text(f"{step:+d} x1\n")
            self._fault(f"clock {host.name} {step:+d} s")
        elif kind == "restart" and not self.store_down():
            self.cluster.stop("fast" if self.rnd.random() < 0.5 else "immediate")
            span = self._span("restart", "")
            self._fault(f"restart PostgreSQL after {hold:.1f} s")

            def up() -> None:
                self.cluster.start()
                span.end = time.monotonic()

            self._later(hold, up)
        elif kind == "kill" and host.proc and not host.paused:
            host.proc.send_signal(signal.SIGKILL)
            host.proc.wait(30)
            host.proc = None
            span = self._span("kill", host.name)
            self._fault(f"kill {host.name}, started again after {hold:.1f} s")

            def again() -> None:
                self._fault(f"start {host.name}")
                self.start(host)
                # serving, unless killed again meanwhile (a kill mid-start)
                wait_for(
                    f"{host.name} serving again",
                    lambda: host.proc is None or self.serving(host),
                    60,
                )
                span.end = time.monotonic()

            self._later(hold, again)

    # -- the load ----------------------------------------------------------------------

    def _loop(self, every: tuple[float, float], action: Any) -> None:
        def run() -> None:
            rnd = random.Random(self.rnd.random())
            while not self._stop.wait(rnd.uniform(*every)):
                action(rnd)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._threads.append(thread)

    def turn(self, rnd: random.Random) -> None:
        turn = ["record", "--session", CHILD, "--kind", "human_direct_message", "--actor", "human"]
        if self.cli(*turn) is not None:
            self.record.turns += 1

    def drain(self, rnd: random.Random) -> None:
        watcher = rnd.choice(WATCHERS)
        answer = self.cli("notices", "--watcher", watcher, "--drain")
        if answer is not None and answer["notices"]:
            texts = {str(n["text"]) for n in answer["notices"]}
            self.record.drains.append((time.monotonic(), {f"{watcher} {t}" for t in texts}))

    def prompt(self, rnd: random.Random) -> None:
        self.record.typed.append(time.monotonic())
        self.opencode.prompt("ses_1", f"prompt {len(self.record.typed)}")

    def watch_turns(self) -> None:
        """Polls the store (from the bridge namespace) for the turns recorded on the link
        without a host, noting when each was first there."""

        def run() -> None:
            conn: psycopg.Connection[Any] | None = None
            while not self._stop.is_set():
                try:
                    if conn is None:
                        with inside(self.net.bridge):
                            conn = psycopg.connect(self.db, connect_timeout=2, autocommit=True)
                    recorded = turns(conn)
                except psycopg.Error:
                    conn = None
                    time.sleep(0.2)
                    continue
                while len(self.record.seen) < recorded:
                    self.record.seen.append(time.monotonic())
                time.sleep(0.1)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- the run -----------------------------------------------------------------------

    def run(self, seconds: float, faults: tuple[str, ...] = FAULTS) -> None:
        for host in self.hosts.values():
            self._fault(f"start {host.name}")
            self.start(host)
        wait_for("every host serving", lambda: all(self.serving(h) for h in self.hosts.values()))
        for watcher in WATCHERS:
            assert self.cli("watch", "--watcher", watcher, "--target", CHILD) is not None
        adopt = ["adopt", "--kind", "opencode", "--path", str(self.opencode.path)]
        adopt += ["--thread", "ses_1", "--session-key", ADOPTED, "--session-id", "s1"]
        config = str(self.root / self.record.hosts[0] / "sessionwatch.toml")
        assert self.cli("--config", config, *adopt) is not None
        assert self.cli("watch", "--watcher", PROMPTED, "--target", ADOPTED) is not None
        self.watch_turns()
        self._loop((1.0, 2.5), self.turn)
        self._loop((5.0, 12.0), self.drain)
        self._loop((2.0, 5.0), self.prompt)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(self.rnd.uniform(2, 6))
            self.nemesis(faults)
        self._stop.set()
        self.heal()

    def heal(self) -> None:
        """Every fault ends (each timer fires), every killed host is serving again."""
        for thread in self._threads:
            if isinstance(thread, threading.Timer):
                thread.join(60)
        for host in self.hosts.values():
            host.proxy.trickle_s = host.proxy.delay_s = 0.0
            host.clock.write_text("+0 x1\n")
        wait_for("every host serving", lambda: all(self.serving(h) for h in self.hosts.values()))

    def settle(self, timeout: float = 150) -> None:
        """Until nothing is pending: every notice woken (and acknowledged) or drained, and
        every prompt recorded."""

        def done() -> bool:
            with inside(self.net.bridge), psycopg.connect(self.db, autocommit=True) as conn:
                (pending,) = conn.execute(
                    "SELECT count(*) FROM session_watch_cursors"
                    " WHERE material_sequence > last_seen_sequence"
                ).fetchone() or (1,)
                return pending == 0 and turns(conn) >= len(self.record.typed)

        try:
            wait_for("nothing pending", done, timeout)
        except AssertionError:
            cursors = self.store(
                "SELECT watcher_session_key, last_seen_sequence, material_sequence"
                " FROM session_watch_cursors WHERE material_sequence > last_seen_sequence"
            )
            rows = self.store(
                "SELECT watcher_session_key, last_seen_sequence, state, unanswered"
                " FROM sessionwatch_notice_outbox ORDER BY id DESC LIMIT 6"
            )
            raise AssertionError(
                f"still pending: {cursors}; the last outbox rows {rows}; the last calls"
                f" {self.sink.calls[-6:]}; {turns_in(self)} of {len(self.record.typed)} prompts"
            ) from None

    def store(self, sql: str) -> list[tuple[Any, ...]]:
        with inside(self.net.bridge), psycopg.connect(self.db, autocommit=True) as conn:
            return conn.execute(sql).fetchall()  # type: ignore[arg-type]

    def close(self) -> None:
        self._stop.set()
        for host in self.hosts.values():
            if host.proc is not None:
                if host.paused:
                    host.proc.send_signal(signal.SIGCONT)
                host.proc.send_signal(signal.SIGTERM)
        for host in self.hosts.values():
            if host.proc is not None:
                try:
                    host.proc.wait(30)
                except subprocess.TimeoutExpired:
                    host.proc.kill()
            host.proxy.close()
        self.sink.close()
        self.cluster.destroy()
        self.net.close()


def turns(conn: psycopg.Connection[Any]) -> int:
    rows = conn.execute(
        "SELECT payload_json FROM session_state_events"
        " WHERE session_key = %s AND kind = 'human_direct_message'",
        (ADOPTED,),
    ).fetchall()
    return sum(int(json.loads(p or "{}").get("turns", 1)) for (p,) in rows)


def wait_for(what: str, probe: Any, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


SLACK_S = 2.5  # a call leaves a moment after its window began; the proxy delays up to 1 s a way
BOUND_S = 2 * INTERVAL_S + 3  # two intervals, and time for a loaded machine


def able(record: Record, host: str, at: float) -> bool:
    """Whether ``host`` ran, reached the store, and the store was up, at ``at``."""
    return not any(s.start <= at < s.end for s in record.spans if s.host in (host, ""))


def able_throughout(record: Record, host: str, start: float, end: float) -> bool:
    """Whether ``host`` was able all along from ``start`` to ``end`` (looked at every 0.1 s)."""
    return all(able(record, host, start + d / 10) for d in range(int((end - start) * 10) + 1))


def carried_from(record: Record, typed: float, until: float) -> float:
    """The first moment from ``typed`` on that some host stayed able for a whole bound."""
    at = typed
    while at < until:
        if any(able_throughout(record, h, at, at + BOUND_S) for h in record.hosts):
            return at
        at += 0.1
    return until


def named(call: Call) -> str:
    """A call as ``<watcher> <notice text>`` (as :attr:`tests.netns.Relayed.key`)."""
    return f"{call.watcher} {call.text}"


def violations(chaos: Chaos) -> tuple[list[str], dict[str, Any]]:
    """What broke, by invariant (empty when all held), and the run's figures."""
    from monitor.kernel.notices import notice_text

    record, problems = chaos.record, []
    calls = sorted(chaos.sink.calls, key=lambda c: c.at)
    reached = Counter(named(c) for c in calls)
    accepted = {named(c) for c in calls if c.answer == 200}
    drained = {key: when for when, keys in record.drains for key in keys}
    rows = chaos.store(
        "SELECT watcher_session_key, target_session_key, last_seen_sequence, state"
        " FROM sessionwatch_notice_outbox"
    )
    for watcher, target, last_seen, state in rows:
        key = f"{watcher} {notice_text(target, last_seen)}"
        if key not in accepted and key not in drained and state != "gone":
            problems.append(f"lost: {key} ({state})")
    for key, when in drained.items():
        late = [c.at - when for c in calls if named(c) == key and c.at > when + SLACK_S]
        if late:
            problems.append(f"woken after its drain: {key} ({late[0]:.1f} s after)")
    problems += [f"received {n} times: {key}" for key, n in reached.items() if n > 2]
    by_watcher: dict[str, list[Any]] = defaultdict(list)
    for c in calls:
        by_watcher[c.watcher].append(c)
    for watcher, theirs in by_watcher.items():
        for before, after in itertools.pairwise(theirs):
            if after.text != before.text and after.at - before.at < WINDOW_S - SLACK_S:
                problems.append(f"window broken for {watcher}: {after.at - before.at:.1f} s")
    relayed: list[Relayed] = [r for h in chaos.hosts.values() for r in h.proxy.relayed]
    for r in relayed:
        if r.delivered is None:
            continue
        sound = able_throughout(record, r.host, r.opened, r.delivered + 1)
        again = [c for c in calls if named(c) == r.key and c.at > r.delivered]
        if sound and again:
            problems.append(f"an answered call repeated: {r.key} by {again[0].who}")
    recorded = turns_in(chaos)
    if recorded != len(record.typed):
        problems.append(f"{len(record.typed)} prompts typed, {recorded} turns recorded")
    end = record.faults[-1][0] + 60 if record.faults else 0
    lateness = []
    for typed, seen in zip(record.typed, record.seen, strict=False):
        could = carried_from(record, typed, end)
        lateness.append(seen - could)
        if seen - could > BOUND_S:
            problems.append(
                f"a prompt typed at {typed:.1f} recorded at {seen:.1f}, {seen - could:.1f} s"
                f" after some host could ({could:.1f})"
            )
    figures = {
        "seed": record.seed,
        "faults": len([f for f in record.faults if not f[1].startswith("start")]),
        "calls": len(calls),
        "accepted": len(accepted),
        "repeats": sum(1 for n in reached.values() if n == 2),
        "drains": len(record.drains),
        "turns": record.turns,
        "prompts": len(record.typed),
        "worst prompt lateness s": round(max(lateness, default=0), 2),
    }
    return problems, figures


def turns_in(chaos: Chaos) -> int:
    with inside(chaos.net.bridge), psycopg.connect(chaos.db, autocommit=True) as conn:
        return turns(conn)
