"""Ten thousand sessions: what each answer costs when a person has a year of sessions.

Run: python bench/ten_thousand.py [--sessions 10000] [--against REF] [--samples 20]

Lays out ``--sessions`` native sessions across the four harnesses (Claude projects, Codex
rollouts and Pi sessions as bench/catalog.py writes them, and an OpenCode database with a
quarter of them), starts ``sessionwatch serve`` on them, adopts every one through the API
(eight clients, by kind and path), and prints:

- ``catalog``, the table and ``--json``, as a person runs them (a process each; target:
  the table under 1 s);
- adoption by catalog id against adoption by kind and path, through the API, one at a time
  (target: by id costs what by path costs, not what the whole catalog costs);
- the status page's first paint: its bytes (target under 200 KB) and time;
- ``links`` (a process) and ``GET /v1/links`` (target: each under 0.5 s);
- with one session in ten waiting for a person (the sidecar's own columns set as a check
  that read their turns' ends writes them), ``GET /v1/sessions?state=waiting`` (target:
  under 100 ms and 200 KB) and the status page with its "needs you" panel (target: under
  200 ms and 200 KB), beside ``GET /v1/links`` of the same run (this release only: an
  earlier one has neither).

With ``--against REF`` the same is measured on that release's code (its ``monitor`` and
``adapters``, run from a scratch directory) on the same tree, one after the other, and each
figure is printed beside its own with the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.catalog import generate
from bench.service import start_serve
from bench.trees import source_of
from tests.opencode_db import OpenCodeDB

CLIENTS = 8


def lay_out(root: Path, n: int) -> str:
    """``n`` sessions: a quarter in an OpenCode database, the rest as files; the
    ``[roots]`` lines that name them."""
    files = n - n // 4
    generate(root, files)
    oc = OpenCodeDB(root / "opencode.db", events=False)
    for i in range(n // 4):
        oc.session(f"ses_{i:06d}", title=f"opencode task {i}")
    opencode = root / "opencode.db"
    return f'codex = "{root / "codex"}"\npi = "{root / "pi"}"\nopencode_db = "{opencode}"\n'


def timed_cli(tmp: Path, code: Path | None, *args: str) -> tuple[float, bytes]:
    """Wall time of ``sessionwatch ARGS`` on the tree's database, and what it printed."""
    argv = [sys.executable, "-m", "monitor", "--db", str(tmp / "state.db")]
    argv += ["--config", str(tmp / "sessionwatch.toml"), *args]
    env = {**os.environ, "PYTHONPATH": str(code)} if code else None
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, cwd=code, env=env, check=True)
    return time.perf_counter() - start, done.stdout


class Api:
    def __init__(self, base: str, token: str, http: aiohttp.ClientSession) -> None:
        self.base, self.http = base, http
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes, float]:
        data = None if body is None else orjson.dumps(body)
        start = time.perf_counter()
        async with self.http.request(
            method, self.base + path, data=data, headers=self.headers
        ) as r:
            raw = await r.read()
            return r.status, raw, time.perf_counter() - start


async def adopt_all(api: Api, sources: list[dict[str, Any]]) -> None:
    queue = list(enumerate(sources))

    async def client() -> None:
        while queue:
            i, body = queue.pop()
            status, raw, _ = await api.call(
                "POST", "/v1/links", {**body, "sessionKey": f"agent:main:s{i}"}
            )
            assert status == 200, raw[:300]

    await asyncio.gather(*(client() for _ in range(CLIENTS)))


def source(entry: dict[str, Any]) -> dict[str, Any]:
    body = {"kind": entry["kind"], "path": entry["path"]}
    if entry["kind"] == "opencode":
        body["thread"] = entry["nativeId"]
    return body


async def measure(tmp: Path, roots: str, code: Path | None, samples: int) -> dict[str, float]:
    proc, base, token = start_serve(tmp, None, code, more_roots=roots)
    found: dict[str, float] = {}
    try:
        table = min(timed_cli(tmp, code, "catalog")[0] for _ in range(3))
        json_s, listed = min(timed_cli(tmp, code, "catalog", "--json") for _ in range(3))
        found["catalog table s"], found["catalog --json s"] = table, json_s
        entries = orjson.loads(listed)["sessions"]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            api = Api(base, token, http)
            by_id, by_path = [], []
            for i, entry in enumerate(entries[:samples]):  # one at a time, alternating
                _, _, took = await api.call(
                    "POST",
                    "/v1/links",
                    {"catalogId": entry["catalogId"], "sessionKey": f"agent:main:id{i}"},
                )
                by_id.append(took)
                _, _, took = await api.call(
                    "POST", "/v1/links", {**source(entry), "sessionKey": f"agent:main:path{i}"}
                )
                by_path.append(took)
            found["adopt by id p50 ms"] = statistics.median(by_id) * 1000
            found["adopt by path p50 ms"] = statistics.median(by_path) * 1000
            started = time.perf_counter()
            await adopt_all(api, [source(e) for e in entries])
            found["adopt all, 8 clients s"] = time.perf_counter() - started
            pages = [await api.call("GET", "/") for _ in range(3)]
            found["status page KB"] = len(pages[-1][1]) / 1024
            found["status page s"] = min(p[2] for p in pages[1:])
            listings = [await api.call("GET", "/v1/links") for _ in range(3)]
            found["GET /v1/links s"] = min(took for _, _, took in listings)
            found["GET /v1/links KB"] = len(listings[-1][1]) / 1024
            if code is None:
                found |= await doing(api, tmp / "state.db")
        found["links s"] = min(timed_cli(tmp, code, "links")[0] for _ in range(3))
    finally:
        proc.terminate()
        proc.wait(30)
    return found


async def doing(api: Api, db: Path) -> dict[str, float]:
    """One session in ten waiting for a person, the rest working: what the panel and
    ``?state=waiting`` cost then."""
    found: dict[str, float] = {}
    found["page, none waiting s"] = await steady_page(api)
    seed_doing(db, every=10)
    answers = [await api.call("GET", "/v1/sessions?state=waiting") for _ in range(5)]
    assert all(status == 200 for status, _, _ in answers)
    found["?state=waiting s"] = min(took for _, _, took in answers)
    found["?state=waiting KB"] = len(answers[-1][1]) / 1024
    found["?state=waiting sessions"] = len(orjson.loads(answers[-1][1])["sessions"])
    found["page with panel s"] = await steady_page(api)
    found["page with panel KB"] = len((await api.call("GET", "/"))[1]) / 1024
    found["the panel s"] = found["page with panel s"] - found["page, none waiting s"]
    return found


async def steady_page(api: Api) -> float:
    """The page's time once the titles its first paint asked for were read (in the
    background, from the catalog): the best of three."""
    await api.call("GET", "/")
    await asyncio.sleep(3)
    return min([(await api.call("GET", "/"))[2] for _ in range(3)])


def seed_doing(db: Path, every: int) -> None:
    """What a check writes of a session it read the end of a turn of (every ``every``th)
    or a turn in progress (the others), in the sidecar's own columns."""
    from monitor.upstream.links import source_key

    conn = sqlite3.connect(db, timeout=30)
    with conn:
        rows = conn.execute(
            "SELECT session_key, agent_id, host_id, thread_id, upstream_ref_json, updated_at"
            " FROM session_upstream_links ORDER BY session_key"
        ).fetchall()
        now = int(time.time() * 1000)
        conn.executemany(
            "INSERT INTO sessionwatch_link_state (session_key, agent_id, source_key,"
            " link_updated_at, doing, doing_since, doing_source, doing_seen_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (session_key, agent_id) DO UPDATE"
            " SET doing = excluded.doing, doing_since = excluded.doing_since,"
            " doing_source = excluded.doing_source, doing_seen_at = excluded.doing_seen_at",
            [
                (key, agent, src, at, "waiting" if i % every == 0 else "working", now - i, src, now)
                for i, (key, agent, host, thread, ref, at) in enumerate(rows)
                for src in [source_key(host, thread, orjson.loads(ref))]
            ],
        )
    conn.close()


def beside(tmp: Path, name: str) -> Path:
    """A sidecar's own directory (its database and configuration) on the shared sessions:
    serve's Claude root is its ``claude``."""
    where = tmp / name
    where.mkdir()
    (where / "claude").symlink_to(tmp / "sessions" / "claude")
    return where


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--against", help="a release to measure too (a git ref)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        roots = lay_out(tmp / "sessions", args.sessions)
        ours = await measure(beside(tmp, "now"), roots, None, args.samples)
        theirs: dict[str, float] = {}
        if args.against:
            code = source_of(args.against, tmp / "code")
            theirs = await measure(beside(tmp, "then"), roots, code, args.samples)
    print(f"{args.sessions:,} sessions across Claude, Codex, Pi and OpenCode")
    for name, value in ours.items():
        line = f"  {name:<26} {value:9.3f}"
        if name in theirs:
            line += f"   {args.against}: {theirs[name]:9.3f}   ratio {value / theirs[name]:.2f}"
        print(line)
    print(
        "  adoption by id / by path (p50): "
        f"{ours['adopt by id p50 ms'] / ours['adopt by path p50 ms']:.1f}x"
    )


if __name__ == "__main__":
    asyncio.run(main())
