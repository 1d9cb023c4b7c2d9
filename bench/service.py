"""Service speed: requests/s and p99 under 50 concurrent clients, and append-to-wake time.

Run: python bench/service.py [--requests 5000] [--samples 30] [--rounds 3] [--compare DIR]

``--compare DIR`` also runs the sessionwatch whose ``monitor`` and ``adapters`` packages are
in DIR (say ``git archive <commit> monitor adapters | tar -x -C DIR``) in the same rounds,
so a change is measured against the code before it at the same moments of the machine: the
two take turns going first, and the rate of one over the other in each round is printed
too (this shared machine moves more between rounds than within one), with each server's
CPU time per request (its process's, from /proc), which a busy neighbour moves far less.

The sidecar runs as a real ``sessionwatch serve`` process; the baseline is a bare aiohttp
server process answering a constant JSON body; the load comes from this process over
loopback with a lean keep-alive HTTP/1.1 client (asyncio streams), 50 connections.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

CONCURRENCY = 50
BASELINE = """
import sys
from aiohttp import web
async def handler(request):
    return web.Response(body=b'{"ok":true,"stateVersion":1}', content_type="application/json")
app = web.Application()
app.router.add_route("*", "/{tail:.*}", handler)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


async def _one_connection(
    host: str, port: int, requests: list[bytes], latencies: list[float]
) -> None:
    """A keep-alive HTTP/1.1 connection sending its requests one after another."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for request in requests:
            start = time.perf_counter()
            writer.write(request)
            status = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            assert status.split()[1] == b"200", status
            latencies.append(time.perf_counter() - start)
    finally:
        writer.close()


async def load(
    url: str, method: str, bodies: list[bytes | None], token: str
) -> tuple[float, float]:
    """Requests/s and p99 latency (ms) with CONCURRENCY keep-alive connections in flight.

    The client is a lean one over asyncio streams: aiohttp's client spends so much CPU of
    its own on this 2-core machine that it caps the baseline and flatters the ratio."""
    host_port, _, path = url.removeprefix("http://").partition("/")
    host, _, port = host_port.rpartition(":")
    head = f"{method} /{path} HTTP/1.1\r\nHost: {host_port}\r\nAuthorization: Bearer {token}\r\n"
    requests = []
    for body in bodies:
        if body is None:
            requests.append((head + "\r\n").encode())
        else:
            extra = f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            requests.append((head + extra).encode() + body)
    shares = [requests[i::CONCURRENCY] for i in range(CONCURRENCY)]
    latencies: list[float] = []
    start = time.perf_counter()
    await asyncio.gather(*(_one_connection(host, int(port), sh, latencies) for sh in shares))
    elapsed = time.perf_counter() - start
    latencies.sort()
    return len(bodies) / elapsed, latencies[int(len(latencies) * 0.99) - 1] * 1000


HOOKS_TOKEN = "bench-hooks-token"


async def hooks_gateway(
    woken: asyncio.Queue[tuple[str, float]],
) -> tuple[web.AppRunner, str]:
    """The gateway's hooks API on loopback, answering as OpenClaw does: each accepted wake
    is put on ``woken`` as (watcher, when). Its runner and its hooks base URL."""

    async def wake(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {HOOKS_TOKEN}":
            return web.Response(status=401)
        body = await request.json()
        await woken.put((body["sessionKey"], time.perf_counter()))
        return web.json_response({"ok": True, "mode": "now", "eventOutcome": "queued"})

    gateway = web.Application()
    gateway.router.add_post("/hooks/wake", wake)
    runner = web.AppRunner(gateway, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}/hooks"


def start_serve(
    tmp: Path,
    hooks_url: str | None,
    code: Path | None = None,
    *,
    more_roots: str = "",
    interval_s: float = 3600,
    more: str = "",
) -> tuple[subprocess.Popen[str], str, str]:
    """``sessionwatch serve`` on a fresh database in ``tmp``: its process, URL and token;
    it wakes the hooks API at ``hooks_url`` (none when None). ``code``: a directory holding
    another build's packages, run instead of this one. ``more_roots``: ``[roots]`` lines
    besides Claude's. ``interval_s``: the tick's (an hour: no tick in a run). ``more``:
    further sections (``[nodes.NAME]``)."""
    config = tmp / "sessionwatch.toml"
    gateway = ""
    if hooks_url:
        token_file = tmp / "hooks-token"
        token_file.write_text(HOOKS_TOKEN + "\n")
        token_file.chmod(0o600)
        gateway = f'[gateway]\nhooks_url = "{hooks_url}"\nhooks_token_file = "{token_file}"\n'
    config.write_text(
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp / "token"}"\n'
        f'[roots]\nclaude = "{tmp / "claude"}"\n{more_roots}{gateway}'
        f"[monitor]\ninitial_delay_s = {interval_s}\ninterval_s = {interval_s}\n{more}"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "monitor",
            "--db",
            str(tmp / "state.db"),
            "--config",
            str(config),
            "serve",
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=code,  # ``-m monitor`` finds the build in the working directory first
        env={**os.environ, "PYTHONPATH": str(code)} if code else None,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        match = re.search(r"serving .* on (http://\S+)", line)
        if match:
            return proc, match.group(1), (tmp / "token").read_text().strip()
    raise RuntimeError("serve did not start")


def sw(tmp: Path, *args: str) -> Any:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "monitor",
            "--db",
            str(tmp / "state.db"),
            "--config",
            str(tmp / "sessionwatch.toml"),
            *args,
        ],
        capture_output=True,
        check=True,
    )
    return orjson.loads(out.stdout)


def cpu_s(pid: int) -> float:
    """CPU seconds the process has used, its threads together (user and system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bench_requests(
    servers: list[tuple[str, str, str, int]], baseline: str, n: int, rounds: int
) -> None:
    """Each route on each server (label, URL, token, pid) against the baseline, alternating
    for ``rounds`` rounds so that all see the same moments of this shared machine; the ratio
    printed is the median round's. Each server's CPU time per request is printed too: the
    work a request costs, which a busy neighbour moves far less than the rate."""
    key = "agent:main:subagent:bench"
    events: list[bytes | None] = [
        orjson.dumps(
            {
                "sessionKey": key,
                "kind": "human_direct_message",
                "actorType": "human",
                "payload": {"channel": "bench"},
            }
        )
    ] * n
    routes: list[tuple[str, str, str, list[bytes | None]]] = [
        ("POST /v1/events", "POST", "/v1/events", events),
        # 20 events back: the events of the earlier rounds, less 20
        ("GET status?changesSince", "GET", f"/v1/sessions/{key}/status?changesSince=", [None] * n),
    ]
    for label, method, path, bodies in routes:
        runs: dict[str, list[tuple[float, float, float, float, float]]] = {}
        paired: list[float] = []  # this tree's rate over the compared one's, round by round
        cpu_us: dict[str, list[float]] = {}  # each server's CPU per request, each round
        for r in range(rounds):
            base_rps, base_p99 = await load(f"{baseline}/x", method, bodies, "")
            rates = {}
            for name, url, token, pid in servers if r % 2 == 0 else servers[::-1]:
                since = str(rounds * n - 20) if path.endswith("=") else ""
                before = cpu_s(pid)
                rps, p99 = await load(f"{url}{path}{since}", method, bodies, token)
                cpu_us.setdefault(name, []).append((cpu_s(pid) - before) / n * 1e6)
                rates[name] = rps
                runs.setdefault(name, []).append((rps / base_rps, rps, p99, base_rps, base_p99))
            if len(servers) > 1:
                paired.append(rates[servers[0][0]] / rates[servers[1][0]])
        for name, each in runs.items():
            each.sort()
            ratio, rps, p99, base_rps, base_p99 = each[len(each) // 2]
            ratios = ", ".join(f"{r[0]:.2f}" for r in each)
            print(
                f"{label}{name}: {rps:,.0f} req/s, p99 {p99:.1f} ms; constant-JSON aiohttp"
                f" baseline {base_rps:,.0f} req/s, p99 {base_p99:.1f} ms; ratio {ratio:.2f}"
                f" (median of {rounds} rounds: {ratios}); CPU per request"
                f" {statistics.median(cpu_us[name]):.0f} µs"
            )
        if paired:
            in_turn = ", ".join(f"{x:.2f}" for x in sorted(paired))
            mine, theirs = (statistics.median(cpu_us[name]) for name, *_ in servers[:2])
            print(
                f"{label}: this tree over{servers[1][0]}, round by round (the two run in"
                f" turn, first one then the other): median {statistics.median(paired):.2f}"
                f" ({in_turn}); CPU per request, theirs over ours {theirs / mine:.2f}"
            )


async def bench_wake(
    tmp: Path, base: str, token: str, samples: int, woken: asyncio.Queue[tuple[str, float]]
) -> None:
    root = tmp / "claude"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    latencies = []
    async with aiohttp.ClientSession(headers=headers) as http:
        for i in range(samples):
            path = root / f"s{i}.jsonl"
            path.write_bytes(b"")
            key = f"agent:main:adopted:{i}"
            async with http.post(
                f"{base}/v1/links",
                data=orjson.dumps(
                    {"kind": "claude", "path": str(path), "sessionKey": key, "sessionId": f"s{i}"}
                ),
            ) as r:
                assert r.status == 200
            async with http.post(
                f"{base}/v1/watches",
                data=orjson.dumps({"watcher": f"agent:w{i}:main", "target": key}),
            ) as r:
                assert r.status == 200
            await asyncio.sleep(1.0)  # the watcher re-arms on the new link
            start = time.perf_counter()
            with path.open("ab") as f:
                f.write(b'{"type":"user","uuid":"u","message":{"role":"user","content":"hi"}}\n')
            watcher, at = await asyncio.wait_for(woken.get(), 30)
            assert watcher == f"agent:w{i}:main"
            latencies.append(at - start)
    latencies.sort()
    p99 = latencies[max(int(len(latencies) * 0.99) - 1, 0)]
    print(
        f"append to wake call, {samples} samples: median {statistics.median(latencies) * 1000:.0f}"
        f" ms, p99 {p99 * 1000:.0f} ms (target p99 < 2000 ms)"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare", type=Path, help="another build's packages, run alongside")
    args = parser.parse_args()
    woken: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
    runner, hooks_url = await hooks_gateway(woken)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "claude").mkdir()
        proc, base, token = start_serve(tmp, hooks_url)
        procs: list[subprocess.Popen[Any]] = [proc]
        procs.append(subprocess.Popen([sys.executable, "-c", BASELINE, "18765"]))
        servers = [("", base, token, proc.pid)]
        try:
            if args.compare:
                (tmp / "compared").mkdir()
                other, other_base, other_token = start_serve(
                    tmp / "compared", None, args.compare.resolve()
                )
                procs.append(other)
                servers.append((f" [{args.compare}]", other_base, other_token, other.pid))
            await asyncio.sleep(1.0)
            await bench_requests(servers, "http://127.0.0.1:18765", args.requests, args.rounds)
            await bench_wake(tmp, base, token, args.samples, woken)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait()
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
