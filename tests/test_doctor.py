"""``sessionwatch doctor``: one line per check, the fix with each problem, and no wake."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from monitor import doctor
from monitor.cli import main
from monitor.config import GatewayConfig, NodeConfig
from tests.helpers import make_config
from tests.hooks_gateway import HooksGateway


def lines(found: list[doctor.Finding], level: str) -> list[str]:
    return [f.line() for f in found if f.level == level]


async def test_a_good_setup_is_all_ok_and_wakes_no_one(
    tmp_path: Path, hooks_gateway: HooksGateway
) -> None:
    config = make_config(tmp_path, gateway=hooks_gateway.config(tmp_path))
    found = await doctor.run(config, tmp_path / "state.db")
    assert [] == lines(found, "PROBLEM")
    assert any("accept the token" in line for line in lines(found, "ok"))
    assert 1 == hooks_gateway.calls
    assert [] == hooks_gateway.wakes


async def test_a_wrong_hooks_token_is_one_problem_with_its_fix(
    tmp_path: Path, hooks_gateway: HooksGateway
) -> None:
    gateway = hooks_gateway.config(tmp_path)
    Path(gateway.hooks_token_file).write_text("wrong\n")
    found = await doctor.run(make_config(tmp_path, gateway=gateway), tmp_path / "state.db")
    (line,) = lines(found, "PROBLEM")
    assert "refused the token" in line
    assert "fix: put the gateway's hooks.token in that file" in line


async def test_an_endpoint_that_takes_a_wake_with_no_text_is_not_openclaws(
    tmp_path: Path, hooks_gateway: HooksGateway
) -> None:
    """Something at the hooks URL answers 200 to the probe's empty wake: OpenClaw's hooks
    never do (400 text required), so the URL is said to point elsewhere, with its fix."""
    hooks_gateway.status = 200
    config = make_config(tmp_path, gateway=hooks_gateway.config(tmp_path))
    (line,) = lines(await doctor.run(config, tmp_path / "state.db"), "PROBLEM")
    assert "took a wake with no text (200" in line and "not them" in line, line
    assert "fix: set [gateway] hooks_url to the gateway's own address" in line, line


async def test_a_gateway_that_is_down_and_a_node_that_is_down(tmp_path: Path) -> None:
    token = tmp_path / "t"
    token.write_text("x\n")
    token.chmod(0o600)
    config = make_config(
        tmp_path,
        gateway=GatewayConfig(hooks_url="http://127.0.0.1:9/hooks", hooks_token_file=str(token)),
    )
    config = config._replace(
        nodes={"laptop": NodeConfig(url="http://127.0.0.1:9", token_file=str(token))}
    )
    found = await doctor.run(config, tmp_path / "state.db")
    problems = lines(found, "PROBLEM")
    assert 2 == len(problems)
    assert "hooks at http://127.0.0.1:9/hooks/wake do not answer" in problems[0]
    assert "node laptop at http://127.0.0.1:9 does not answer" in problems[1]
    for line in problems:  # plain words, not aiohttp's "ssl:default [...]"
        assert "(cannot connect to 127.0.0.1:9 (Connection refused))" in line
        assert "ssl:default" not in line


async def test_a_node_is_called_through_its_pin(tmp_path: Path) -> None:
    """A TLS node answers through the pinned certificate, and says what it serves; a wrong
    pin is one problem naming both fingerprints, with its fix."""
    from aiohttp import web

    from monitor.serve.node_tls import server_context
    from monitor.web.node import build_node_app

    token = tmp_path / "node.token"
    token.write_text("node-secret\n")
    token.chmod(0o600)
    context, pin = server_context(tmp_path / "node-tls.pem")
    (tmp_path / "codex").mkdir()
    runner = web.AppRunner(build_node_app({"codex": str(tmp_path / "codex")}, "node-secret"))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    url = f"https://127.0.0.1:{runner.addresses[0][1]}"
    try:
        for fingerprint, level in ((pin, "ok"), ("cd" * 32, "PROBLEM")):
            node = NodeConfig(url=url, token_file=str(token), fingerprint=f"sha256:{fingerprint}")
            found = await doctor.run(
                make_config(tmp_path, nodes={"laptop": node}), tmp_path / "s.db"
            )
            (line,) = [f.line() for f in found if "node laptop" in f.line()]
            assert line.startswith(level), line
            if level == "ok":
                assert "certificate pin holds" in line and "it serves codex" in line
            else:
                assert f"sha256:{'cd' * 32}" in line and f"sha256:{pin}" in line
                assert "pin the one it logs at start" in line
    finally:
        await runner.cleanup()


async def test_an_older_node_answers_with_what_it_serves(tmp_path: Path) -> None:
    """A node from before the change feed answers at ``/v1/threads`` only: it is reachable,
    serves Claude Code, and the line says to upgrade it."""
    from aiohttp import web

    from monitor.web.common import make_guard

    key = web.AppKey("token", str)
    older = web.Application(middlewares=[make_guard(key)])
    older[key] = "node-secret"

    async def threads(request: web.Request) -> web.Response:
        return web.json_response({"threads": []})

    older.router.add_get("/v1/threads", threads)
    token = tmp_path / "node.token"
    token.write_text("node-secret\n")
    token.chmod(0o600)
    runner = web.AppRunner(older)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        node = NodeConfig(url=f"http://127.0.0.1:{runner.addresses[0][1]}", token_file=str(token))
        found = await doctor.run(make_config(tmp_path, nodes={"old": node}), tmp_path / "s.db")
        (line,) = [f.line() for f in found if "node old" in f.line()]
        assert line.startswith("ok") and "serves claude" in line and "upgrade it" in line, line
    finally:
        await runner.cleanup()


async def test_a_shared_state_file_is_a_problem(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    db.write_bytes(b"")
    db.chmod(0o644)
    found = await doctor.run(make_config(tmp_path), db)
    (line,) = lines(found, "PROBLEM")
    assert "readable by others" in line and "chmod 600" in line


@pytest.mark.parametrize("good", [True, False])
async def test_the_command_exits_1_on_a_problem(
    tmp_path: Path, hooks_gateway: HooksGateway, good: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway = hooks_gateway.config(tmp_path)
    if not good:
        Path(gateway.hooks_token_file).write_text("wrong\n")
    config = tmp_path / "sw.toml"
    config.write_text(
        f'[api]\ntoken_file = "{tmp_path / "token"}"\n'
        f'[gateway]\nhooks_url = "{gateway.hooks_url}"\n'
        f'hooks_token_file = "{gateway.hooks_token_file}"\n'
    )
    argv = ["--db", str(tmp_path / "state.db"), "--config", str(config), "doctor"]
    code = await asyncio.to_thread(main, argv)
    assert (0 if good else 1) == code
    out = capsys.readouterr().out
    assert ("PROBLEM" in out) is not good


async def test_each_problem_is_one_line_whatever_the_server_answered(tmp_path: Path) -> None:
    """A hooks URL that points at a plain web server: one line, not its HTML page; and a
    database readable by others is said once, with its fix."""
    from aiohttp import web

    page = "<html>\n<head><title>It works</title></head>\n" + "<p>line</p>\n" * 8 + "</html>"

    async def html(request: web.Request) -> web.Response:
        return web.Response(status=405, text=page, content_type="text/html")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", html)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        token = tmp_path / "t"
        token.write_text("x\n")
        token.chmod(0o600)
        gateway = GatewayConfig(
            hooks_url=f"http://{host}:{port}/hooks", hooks_token_file=str(token)
        )
        db = tmp_path / "state.db"
        db.write_bytes(b"")
        db.chmod(0o644)
        found = await doctor.run(make_config(tmp_path, gateway=gateway), db)
    finally:
        await runner.cleanup()
    problems = lines(found, "PROBLEM")
    assert all("\n" not in line for line in problems)
    (hooks,) = [line for line in problems if "answered 405" in line]
    assert len(hooks) < 300, hooks
    (shared,) = [line for line in problems if "readable by others" in line]
    assert shared.count(str(db)) == 2  # once in what, once in the fix
    assert "see the message" not in shared


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Any:
    """A directory on a read-only mount (as root), else one without write permission."""
    import os
    import subprocess

    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() == 0:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)],
                              capture_output=True, check=False)  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs here: {done.stderr.decode().strip()}")
        yield path
        subprocess.run(["umount", str(path)], check=False)
        return
    path.chmod(0o555)
    yield path
    path.chmod(0o755)


async def test_doctor_finds_what_serve_could_not_create(tmp_path: Path, read_only_dir: Any) -> None:
    """A state directory on a read-only mount, a token file in a read-only directory: a
    problem each, where doctor used to say "serve creates it" and exit 0."""
    config = make_config(tmp_path)
    config = config._replace(api=config.api._replace(token_file=str(read_only_dir / "token")))
    found = await doctor.run(config, read_only_dir / "state" / "state.db")
    problems = lines(found, "PROBLEM")
    assert any("state database" in p and "cannot be created" in p for p in problems), problems
    assert any("API token file" in p and "cannot be created" in p for p in problems), problems


async def test_a_short_api_token_is_a_problem_not_private(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    token = Path(config.api.token_file)
    token.write_text("x\n")
    token.chmod(0o600)
    found = await doctor.run(config, tmp_path / "state.db")
    (line,) = [f.line() for f in found if "API token" in f.what]
    assert line.startswith("PROBLEM") and "is 1 long, easy to guess" in line


async def test_doctor_names_openclaws_own_settings_that_refuse_the_wakes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "oc"
    state.mkdir()
    (state / "openclaw.json").write_text(
        '{hooks: {enabled: true, token: "t0123456789abcdef", allowRequestSessionKey: false,'
        ' allowedSessionKeyPrefixes: ["hook:"], allowedAgentIds: ["ops"]}}'
    )
    monkeypatch.setenv("OPENCLAW_STATE_DIR", str(state))
    db = state / "state" / "openclaw.sqlite"  # the install's own database: its hooks apply
    db.parent.mkdir()
    sqlite3.connect(db).close()
    db.chmod(0o600)
    found = await doctor.run(make_config(tmp_path), db)
    problems = "\n".join(lines(found, "PROBLEM"))
    assert "hooks.allowRequestSessionKey is off" in problems
    assert '"allowRequestSessionKey": true' in problems
    assert "hooks.allowedSessionKeyPrefixes in" in problems and '"hook:", "agent:"' in problems
    assert "hooks.allowedAgentIds in" in problems and '"ops", "main"' in problems
    (state / "openclaw.json").write_text("{hooks: {enabled: false}}")
    found = await doctor.run(make_config(tmp_path), db)
    off = [line for line in lines(found, "PROBLEM") if "hooks are off" in line]
    assert len(off) == 1 and "OpenClaw's hooks are off (hooks.enabled" in off[0], off


async def test_next_to_openclaw_a_broken_file_is_said_once_and_fixes_name_its_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typo in openclaw.json is one line, whose fix says what to do (not "fix <file>");
    a gateway that does not answer points at gateway.port in that file and
    $OPENCLAW_GATEWAY_PORT, never at a [gateway] hooks_url nobody set."""
    state = tmp_path / "oc"
    (state / "state").mkdir(parents=True)
    monkeypatch.setenv("OPENCLAW_STATE_DIR", str(state))
    monkeypatch.delenv("OPENCLAW_GATEWAY_PORT", raising=False)
    db = state / "state" / "openclaw.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE gateway_kv (key TEXT PRIMARY KEY, value TEXT)")
    conn.close()
    db.chmod(0o600)
    config = state / "openclaw.json"
    config.write_text('{gateway: {port: 1}, hooks: {enabled: true, token: "t0123456789abcdef"}')
    found = [f.line() for f in await doctor.run(make_config(tmp_path), db)]
    broken = [line for line in found if "openclaw.json" in line]
    assert 1 == len(broken) and "is not JSON5" in broken[0], found
    assert "fix: fix" not in broken[0] and "last good configuration" in broken[0]
    config.write_text('{gateway: {port: 1}, hooks: {enabled: true, token: "t0123456789abcdef"}}')
    found = [f.line() for f in await doctor.run(make_config(tmp_path), db)]
    (down,) = [line for line in found if "do not answer" in line]
    assert "gateway.port in" in down and "$OPENCLAW_GATEWAY_PORT" in down, down
    assert "[gateway] hooks_url" not in "\n".join(found)


async def test_doctor_flags_a_serve_left_on_its_own_database_next_to_openclaw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A serve that started before the gateway had made its database, under an earlier
    release, runs on sessionwatch's own default database: doctor, on OpenClaw's, says so."""
    home = tmp_path / "home"
    own = home / ".local" / "state" / "sessionwatch" / "state.db"
    own.parent.mkdir(parents=True)
    own.with_name("state.db.lock").write_text(f"{os.getpid()}\nhttp://127.0.0.1:8765\n")
    monkeypatch.setenv("HOME", str(home))
    state = tmp_path / "oc"
    (state / "state").mkdir(parents=True)
    db = state / "state" / "openclaw.sqlite"
    found = [f.line() for f in await doctor.run(make_config(tmp_path), db)]
    (elsewhere,) = [line for line in found if "a serve runs on" in line]
    assert str(own) in elsewhere and "restart that serve" in elsewhere
    found = [f.line() for f in await doctor.run(make_config(tmp_path), own)]
    assert not [line for line in found if "a serve runs on" in line]
