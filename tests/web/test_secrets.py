"""Secrets never reach a log or an answer: a whole run of ``serve`` with every secret the
sidecar knows (a store URL with a password, the API token, the gateway's hook token, a
paired node's token), every route and the operator commands called, and then every log
line and every answer searched for each secret."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.helpers import REPO, PgServer, pg_database, served_address
from tests.hooks_gateway import TOKEN as HOOK_TOKEN
from tests.hooks_gateway import HooksGateway

PASSWORD = "pg-s3cret-pass"
NODE_TOKEN = "node-s3cret-token"
MAIN = "agent:main:main"
CHILD = "agent:main:subagent:secrets"


def with_password(url: str, where: str) -> str:
    """The URL with the password before the ``@``, in its query, or as a libpq
    ``key=value`` string: every form the driver accepts."""
    scheme, rest = url.split("://", 1)
    user_host = rest.split("/", 1)
    user, host = user_host[0].rsplit("@", 1)
    if where == "query":
        return f"{scheme}://{host}/{user_host[1]}?user={user}&password={PASSWORD}"
    if where == "dsn":
        name, port = host.rsplit(":", 1)
        return f"host={name} port={port} dbname={user_host[1]} user={user} password={PASSWORD}"
    return f"{scheme}://{user}:{PASSWORD}@{host}/{user_host[1]}"


@pytest.mark.parametrize("where", ["userinfo", "query", "dsn"])
async def test_no_secret_reaches_a_log_line_or_an_answer(
    tmp_path: Path, pg_server: PgServer, hooks_gateway: HooksGateway, where: str
) -> None:
    url = with_password(pg_database(pg_server), where)  # the suite's server trusts loopback
    gateway = hooks_gateway.config(tmp_path)
    node_token = tmp_path / "node-token"
    node_token.write_text(NODE_TOKEN + "\n")
    node_token.chmod(0o600)
    config = tmp_path / "sw.toml"
    config.write_text(
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n'
        f'[roots]\nclaude = "{tmp_path}"\n[host]\nid = "secrets"\n'
        f'[gateway]\nhooks_url = "{gateway.hooks_url}"\n'
        f'hooks_token_file = "{gateway.hooks_token_file}"\n'
        f'[nodes.laptop]\nurl = "http://127.0.0.1:9"\ntoken_file = "{node_token}"\n'
    )
    base = [sys.executable, "-m", "monitor", "--db", url, "--config", str(config)]
    proc = subprocess.Popen([*base, "serve"], cwd=REPO, stderr=subprocess.PIPE, text=True)
    answers: list[str] = []
    said: list[str] = []  # every log line, the first ones included
    try:
        address = await asyncio.to_thread(served_address, proc, said)
        token = (tmp_path / "token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        calls = [
            ("GET", "/healthz", None),
            ("GET", "/openapi.json", None),
            ("GET", "/metrics", None),
            ("POST", "/v1/spawns", {"parent": MAIN, "child": CHILD, "runId": "r"}),
            (
                "POST",
                "/v1/events",
                {"sessionKey": CHILD, "kind": "goal_changed", "actorType": "human"},
            ),
            ("GET", f"/v1/sessions/{CHILD}/status?changesSince=0", None),
            ("GET", "/v1/sessions", None),
            ("GET", "/v1/links", None),
            ("GET", "/v1/catalog", None),
            ("GET", f"/v1/watchers/{MAIN}/notices", None),
            ("GET", "/v1/sessions/bare/status", None),  # an error answer
        ]
        async with aiohttp.ClientSession(headers=headers) as http:
            for method, path, body in calls:
                data = None if body is None else orjson.dumps(body)
                async with http.request(method, f"{address}{path}", data=data) as resp:
                    answers.append(await resp.text())
            await asyncio.wait_for(hooks_gateway.woken.wait(), 20)  # a wake went out
        for command in (["config"], ["doctor"], ["links"], ["status", CHILD]):
            done = subprocess.run(
                [*base, *command], cwd=REPO, capture_output=True, text=True, check=False
            )
            answers += [done.stdout, done.stderr]
    finally:
        proc.terminate()
        said.append(proc.communicate(timeout=30)[1])
    log = "".join(said)
    assert "serving postgresql://" in log or "serving host=" in log
    for secret in (PASSWORD, token, HOOK_TOKEN, NODE_TOKEN):
        assert secret not in log, f"a secret in the log: {secret}"
        for answer in answers:
            assert secret not in answer, f"a secret in an answer: {answer[:200]}"
