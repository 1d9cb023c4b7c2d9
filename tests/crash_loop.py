"""The crash loop: ``serve`` SIGKILLed at random moments while a person types.

A writer appends prompts to adopted Claude, Codex and Pi transcripts; ``serve`` runs with a
short tick and file watching, and is killed with SIGKILL at moments spread over start-up,
mid-tick, right after an append and during a burst of appends. At the end a last tick
settles what is left, and every prompt must be recorded exactly once (the sum of
``payload.turns`` of each session's ``human_direct_message`` events equals the prompts
written), and ``PRAGMA integrity_check`` must say ok.

Wakes flow all along: every ``serve`` wakes a hooks endpoint on loopback
(:class:`~tests.wake_sink.WakeSink`, which answers in 0 to 80 ms, so that a kill often lands
mid-call). A last clean ``serve`` runs until nothing is left pending, and then every notice
the outbox opened must have reached the endpoint, none more than twice (the one repeat a
call cut by a crash allows).

``tests/upstream/test_crash_loop.py`` runs a few dozen cycles; ``bench/crash.py`` runs a thousand.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.wake_sink import HOOKS_TOKEN, WakeSink

MOMENTS = ("start-up", "mid-tick", "after-append", "burst")
WATCHER = "agent:main:main"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Transcript:
    kind: str
    path: Path
    key: str
    written: int = 0

    def prompt(self, n: int) -> bytes:
        text = f"{self.kind} prompt {n} {random.random()}"
        at = _now()
        if self.kind == "claude":
            record: dict[str, Any] = {
                "type": "user",
                "uuid": f"c{n}",
                "timestamp": at,
                "message": {"role": "user", "content": text},
            }
        elif self.kind == "codex":
            record = {
                "timestamp": at,
                "type": "event_msg",
                "payload": {"type": "user_message", "message": text},
            }
        else:
            record = {
                "type": "message",
                "id": f"p{n:07d}",
                "timestamp": at,
                "message": {"role": "user", "content": [{"type": "text", "text": text}]},
            }
        return json.dumps(record).encode() + b"\n"

    def append(self, count: int = 1) -> None:
        data = b"".join(self.prompt(self.written + i) for i in range(count))
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self.written += count


@dataclass
class CrashLoop:
    root: Path
    seed: int = 0
    transcripts: list[Transcript] = field(default_factory=list)
    moments: Counter[str] = field(default_factory=Counter)
    sink: WakeSink | None = None

    @property
    def db(self) -> Path:
        return self.root / "state.db"

    @property
    def config(self) -> Path:
        return self.root / "sessionwatch.toml"

    def command(self, *args: str) -> list[str]:
        base = ["-m", "monitor", "--db", str(self.db), "--config", str(self.config)]
        return [sys.executable, *base, *args]

    def cli(self, *args: str) -> Any:
        proc = subprocess.run(
            self.command(*args),
            capture_output=True,
            check=False,
            timeout=120,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"sessionwatch {' '.join(args)}: {proc.stderr.decode()}")
        return json.loads(proc.stdout)

    def set_up(self) -> None:
        heads = {
            "claude": b"",
            "codex": json.dumps(
                {
                    "timestamp": _now(),
                    "type": "session_meta",
                    "payload": {"id": "th-1", "cwd": "/w", "cli_version": "0.140.0"},
                }
            ).encode()
            + b"\n",
            "pi": json.dumps(
                {"type": "session", "version": 3, "id": "pi-1", "timestamp": _now(), "cwd": "/w"}
            ).encode()
            + b"\n",
        }
        names = {
            "claude": "proj/3f2a.jsonl",
            "codex": "2026/11/30/rollout-2026-11-30T00-00-00-th-1.jsonl",
            "pi": "--w--/2026-11-30T00-00-00-000Z_pi-1.jsonl",
        }
        lines = [f'token_file = "{self.root / "token"}"', 'listen = "127.0.0.1:0"']
        roots = []
        for kind in ("claude", "codex", "pi"):
            path = self.root / kind / names[kind]
            path.parent.mkdir(parents=True)
            path.write_bytes(heads[kind])
            roots.append(f'{kind} = "{self.root / kind}"')
            self.transcripts.append(Transcript(kind, path, f"agent:main:adopted:{kind}"))
        gateway = ""
        if self.sink is not None:
            token = self.root / "hooks-token"
            token.write_text(HOOKS_TOKEN + "\n")
            token.chmod(0o600)
            gateway = (
                f'[gateway]\nhooks_url = "{self.sink.url}"\nhooks_token_file = "{token}"\n'
                "retry_interval_s = 1\n"
            )
        self.config.write_text(
            "[api]\n" + "\n".join(lines) + "\n[roots]\n" + "\n".join(roots) + "\n"
            "[monitor]\ninterval_s = 0.3\ninitial_delay_s = 0\n" + gateway
        )
        for t in self.transcripts:
            self.cli("adopt", "--kind", t.kind, "--path", str(t.path), "--session-key", t.key)
            self.cli("watch", "--watcher", WATCHER, "--target", t.key)

    def cycle(self, rng: random.Random) -> str:
        moment = rng.choice(MOMENTS)
        proc = subprocess.Popen(
            self.command("serve"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            if moment == "start-up":
                self._type(rng, 1)
                time.sleep(rng.uniform(0, 0.8))
            else:
                self._wait_started(proc)
                if moment == "mid-tick":
                    self._type(rng, rng.randint(1, 3))
                    time.sleep(rng.uniform(0.05, 0.6))
                elif moment == "after-append":
                    time.sleep(rng.uniform(0, 0.4))
                    self._type(rng, 1)
                else:
                    for _ in range(rng.randint(3, 12)):
                        self._type(rng, rng.randint(1, 20))
                        time.sleep(rng.uniform(0, 0.02))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
            if proc.stderr:
                proc.stderr.close()
        self.moments[moment] += 1
        return moment

    def _type(self, rng: random.Random, count: int) -> None:
        rng.choice(self.transcripts).append(count)

    @staticmethod
    def _wait_started(proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if b"serving" in line:
                return
        raise RuntimeError("serve exited before it started")

    def settle(self) -> None:
        """The last word: ticks until every link is quiet."""
        for _ in range(20):
            outcomes = self.cli("tick")["outcomes"]
            if all(o["outcome"] == "quiet" for o in outcomes):
                return
        raise RuntimeError(f"links never settled: {outcomes}")

    def deliver(self, timeout: float = 90) -> None:
        """A last clean ``serve`` until no notice is left pending for the watcher (the
        window and the leases the killed ones left run out meanwhile)."""
        proc = subprocess.Popen(
            self.command("serve"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + timeout
            while self.cli("notices", "--watcher", WATCHER)["notices"]:
                if time.monotonic() > deadline:
                    raise RuntimeError("notices still pending after the last serve")
                time.sleep(0.5)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)

    def verdict(self) -> dict[str, Any]:
        with sqlite3.connect(self.db) as conn:
            integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
            rows = conn.execute(
                "SELECT session_key, payload_json FROM session_state_events"
                " WHERE kind = 'human_direct_message'"
            ).fetchall()
        recorded: Counter[str] = Counter()
        for key, payload in rows:
            recorded[key] += int(json.loads(payload or "{}").get("turns", 1))
        written = {t.key: t.written for t in self.transcripts}
        with sqlite3.connect(self.db) as conn:
            opened = [
                f'Session "{target}" changed (other actor). Reconcile before acting:'
                f' session_status sessionKey "{target}" changesSince {seen}.'
                for target, seen in conn.execute(
                    "SELECT target_session_key, last_seen_sequence FROM"
                    " sessionwatch_notice_outbox WHERE watcher_session_key = ?",
                    (WATCHER,),
                )
            ]
        woken = self.sink.texts if self.sink is not None else Counter()
        return {
            "opened": len(opened),
            "never_woken": [t for t in opened if t not in woken],
            "woken_more_than_twice": {t: n for t, n in woken.items() if n > 2},
            "repeated": sum(1 for n in woken.values() if n == 2),
            "integrity": integrity,
            "written": written,
            "recorded": {t.key: recorded[t.key] for t in self.transcripts},
            "moments": dict(self.moments),
        }


def run(root: Path, cycles: int, seed: int = 0, *, wakes: bool = True) -> dict[str, Any]:
    rng = random.Random(seed)
    random.seed(seed)
    loop = CrashLoop(root=root, seed=seed, sink=WakeSink(jitter=0.08) if wakes else None)
    try:
        loop.set_up()
        for _ in range(cycles):
            loop.cycle(rng)
        loop.settle()
        if wakes:
            loop.deliver()
        return loop.verdict()
    finally:
        if loop.sink is not None:
            loop.sink.close()
