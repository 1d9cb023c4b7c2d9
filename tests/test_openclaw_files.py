"""Next to OpenClaw with no configuration of its own: the sidecar finds the gateway's state
database, its hooks URL and its hook token in OpenClaw's files, by the gateway's own rules
(its environment variables, profiles, JSON5 with ${VAR}), and follows a rotated token."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from monitor.errors import ConfigError
from monitor.openclaw import files as openclaw
from tests.helpers import REPO, served_address, until
from tests.hooks_gateway import TOKEN, running_hooks_gateway

MAIN = "agent:main:main"
CHILD = "agent:main:subagent:zero"


def test_the_install_follows_the_gateways_variables(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".openclaw").mkdir(parents=True)
    plain = openclaw.locate({"HOME": str(home)})
    assert (plain.state_dir, plain.config_path, plain.db) == (
        home / ".openclaw",
        home / ".openclaw" / "openclaw.json",
        home / ".openclaw" / "state" / "openclaw.sqlite",
    )
    moved = openclaw.locate({"HOME": str(home), "OPENCLAW_STATE_DIR": "~/elsewhere"})
    assert (moved.state_dir, moved.found_by) == (home / "elsewhere", "$OPENCLAW_STATE_DIR")
    profiled = openclaw.locate({"HOME": str(home), "OPENCLAW_PROFILE": "work"})
    assert profiled.state_dir == home / ".openclaw-work"
    other_home = openclaw.locate({"HOME": str(home), "OPENCLAW_HOME": str(tmp_path / "oc")})
    assert other_home.state_dir == tmp_path / "oc" / ".openclaw"
    config = openclaw.locate({"HOME": str(home), "OPENCLAW_CONFIG_PATH": "~/cfg.json5"})
    assert config.config_path == home / "cfg.json5"
    legacy_home = tmp_path / "legacy"
    (legacy_home / ".clawdbot").mkdir(parents=True)
    assert openclaw.locate({"HOME": str(legacy_home)}).state_dir == legacy_home / ".clawdbot"


def test_a_watchs_default_store_lies_where_the_install_does(tmp_path: Path) -> None:
    """One module knows where OpenClaw keeps its state: with ``OPENCLAW_PROFILE=work`` (and
    each other variable), the store path a watch names by default lies under the state
    directory ``config`` names, from a ``watch`` run as a user would run it."""
    home = tmp_path / "home"
    home.mkdir()
    for extra in ({"OPENCLAW_PROFILE": "work"}, {"OPENCLAW_STATE_DIR": "~/elsewhere"}, {}):
        env = {**os.environ, "HOME": str(home), **extra}
        env.pop("OPENCLAW_HOME", None)
        env.pop("SESSIONWATCH_CONFIG", None)
        state = openclaw.locate(env).state_dir
        db = tmp_path / f"state-{len(extra)}-{sorted(extra)}.db"
        argv = [sys.executable, "-m", "monitor", "--db", str(db), "watch"]
        done = subprocess.run(
            [*argv, "--watcher", "agent:ops:main", "--target", "agent:ops:subagent:c"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert 0 == done.returncode, done.stderr
        with sqlite3.connect(db) as conn:
            (path,) = conn.execute(
                "SELECT watcher_store_path FROM session_watch_cursors"
            ).fetchone()
        expected = state / "agents" / "ops" / "agent" / "openclaw-agent.sqlite"
        assert str(expected) == path, extra


def test_json5_variables_ports_and_secret_references(tmp_path: Path) -> None:
    path = tmp_path / "openclaw.json"
    path.write_text(
        "{\n  // the gateway's own file: JSON5, comments and trailing commas\n"
        '  gateway: {port: 19001, bind: "loopback",},\n'
        '  hooks: {enabled: true, path: "hooks/", token: "${HOOK_TOKEN}-$${LITERAL}"},\n}\n'
    )
    config = openclaw.read_config(path)
    env = {"HOOK_TOKEN": "abc"}
    assert openclaw.hooks_url(config, env) == "http://127.0.0.1:19001/hooks"
    assert openclaw.hooks_token(config, env, path) == "abc-${LITERAL}"
    with pytest.raises(ConfigError, match=r"\$\{HOOK_TOKEN\}, which is not set"):
        openclaw.hooks_token(config, {}, path)
    assert openclaw.gateway_port({}, {"OPENCLAW_GATEWAY_PORT": "127.0.0.1:18800"})[0] == 18800
    assert openclaw.gateway_port({}, {}) == (18789, "the default")
    assert 20000 <= openclaw.gateway_port({}, {"OPENCLAW_PROFILE": "work"})[0] < 60000
    assert openclaw.gateway_port({}, {"OPENCLAW_PROFILE": "dev"}) == (19001, "the dev profile")
    assert openclaw.gateway_port({}, {"OPENCLAW_PROFILE": "dev"}, 19555)[0] == 19555
    ref = {"hooks": {"enabled": True, "token": {"source": "file", "provider": "x", "id": "/t"}}}
    with pytest.raises(ConfigError, match=r"hooks\.token in .* is a secret reference"):
        openclaw.hooks_token(ref, {}, path)
    by_env = {"hooks": {"token": {"source": "env", "provider": "default", "id": "T"}}}
    assert openclaw.hooks_token(by_env, {"T": "from-env"}, path) == "from-env"


def an_openclaw_install(state: Path, port: int, token: str = TOKEN) -> None:
    """The files an OpenClaw install keeps: its configuration and its state database."""
    (state / "state").mkdir(parents=True, exist_ok=True)
    db = state / "state" / "openclaw.sqlite"
    if not db.exists():
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE gateway_kv (key TEXT PRIMARY KEY, value TEXT)")  # its own
        conn.close()
        db.chmod(0o600)
    (state / "openclaw.json").write_text(
        "{\n  // written by the gateway's onboarding\n"
        f"  gateway: {{port: {port}}},\n"
        f'  hooks: {{enabled: true, token: "{token}", allowRequestSessionKey: true,\n'
        '          allowedSessionKeyPrefixes: ["agent:", "hook:"]},\n}\n'
    )


def serve_process(env: dict[str, str]) -> subprocess.Popen[str]:
    """``sessionwatch serve`` with ``env``, its log on a pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "monitor", "serve"],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )


def sw(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "monitor", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("moved", [False, True])
async def test_serve_with_no_configuration_uses_openclaws_files(
    tmp_path: Path, moved: bool
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    own = tmp_path / "sw.toml"  # only where to listen: nothing of the store or the gateway
    own.write_text('[api]\nlisten = "127.0.0.1:0"\n')
    env = {
        "HOME": str(home),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "SESSIONWATCH_CONFIG": str(own),
    }
    state = home / ".openclaw"
    if moved:
        state = tmp_path / "gateway-state"
        env["OPENCLAW_STATE_DIR"] = str(state)
    async with running_hooks_gateway() as gw:
        port = int(gw.url.rsplit(":", 1)[1].split("/")[0])
        an_openclaw_install(state, port)

        def run(*args: str) -> asyncio.Future[subprocess.CompletedProcess[str]]:
            return asyncio.ensure_future(asyncio.to_thread(sw, env, *args))  # the loop serves

        shown = orjson.loads((await run("config")).stdout)
        assert shown["store"]["effective"] == str(state / "state" / "openclaw.sqlite")
        assert shown["store"]["from"].startswith(f"OpenClaw's state directory {state}")
        assert shown["gateway"]["hooks_url"] == f"http://127.0.0.1:{port}/hooks"
        assert TOKEN not in orjson.dumps(shown).decode()
        doctor = (await run("doctor")).stdout
        assert "accept the token in OpenClaw's hooks.token" in doctor, doctor
        proc = serve_process(env)
        said: list[str] = []
        try:
            await asyncio.to_thread(served_address, proc, said)
            start = [line for line in said if "next to OpenClaw at" in line]
            assert len(start) == 1 and f"wakes go to http://127.0.0.1:{port}/hooks/wake" in start[0]
            assert TOKEN not in "".join(said)
            spawn = ["spawn", "--parent", MAIN, "--child", CHILD, "--run-id", "r"]
            assert (await run(*spawn)).returncode == 0
            record = ["record", "--session", CHILD, "--kind", "human_direct_message"]
            assert (await run(*record, "--actor", "human")).returncode == 0
            await until("the gateway woken", lambda: len(gw.wakes) == 1)
            # the gateway's token is rotated: the next wake carries the new one, no restart
            an_openclaw_install(state, port, token="rotated-" + TOKEN)
            assert (await run("notices", "--watcher", MAIN, "--drain")).returncode == 0
            assert (await run(*record, "--actor", "human", "--dedupe-key", "b")).returncode == 0
            await until("a refusal of the old token", lambda: gw.calls >= 2)
        finally:
            proc.terminate()
            proc.wait(30)
    assert len(gw.wakes) == 1  # the stand-in knows only the old token: the new one was sent


async def test_serve_started_before_the_gateways_first_start_follows_its_database(
    tmp_path: Path,
) -> None:
    """An OpenClaw install whose gateway has not run yet (its configuration, no state
    database): serve waits for the database, said once; doctor flags it and a one-shot
    write refuses to make it; once the gateway makes it, serve runs on it and wakes."""
    home = tmp_path / "home"
    home.mkdir()
    own = tmp_path / "sw.toml"
    own.write_text('[api]\nlisten = "127.0.0.1:0"\n')
    env = {
        "HOME": str(home),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "SESSIONWATCH_CONFIG": str(own),
    }
    state = home / ".openclaw"
    db = state / "state" / "openclaw.sqlite"
    async with running_hooks_gateway() as gw:
        port = int(gw.url.rsplit(":", 1)[1].split("/")[0])
        an_openclaw_install(state, port)
        db.unlink()  # the configuration onboarding wrote; the gateway has not started yet

        def run(*args: str) -> asyncio.Future[subprocess.CompletedProcess[str]]:
            return asyncio.ensure_future(asyncio.to_thread(sw, env, *args))

        proc = serve_process(env)
        said: list[str] = []
        try:
            assert proc.stderr is not None
            line = await asyncio.to_thread(proc.stderr.readline)
            assert "has not made its state database yet: waiting for" in line, line
            doctor = await run("doctor")
            assert 1 == doctor.returncode and "has not made its state database" in doctor.stdout
            spawn = ["spawn", "--parent", MAIN, "--child", CHILD, "--run-id", "r"]
            refused = await run(*spawn)
            assert 2 == refused.returncode and "start the gateway" in refused.stderr
            assert not db.exists() and not (home / ".local").exists()  # nothing made anywhere
            an_openclaw_install(state, port)  # the gateway's first start makes its database
            await asyncio.to_thread(served_address, proc, said)
            assert 1 == sum("made its state database" in line for line in said), said
            assert (await run(*spawn)).returncode == 0
            record = ["record", "--session", CHILD, "--kind", "human_direct_message"]
            assert (await run(*record, "--actor", "human")).returncode == 0
            await until("the gateway woken", lambda: len(gw.wakes) == 1)
            assert 0 == (await run("doctor")).returncode
        finally:
            proc.terminate()
            proc.wait(30)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the sidecar as another user")
def test_a_state_database_another_user_owns_says_whose_user_to_run_as(tmp_path: Path) -> None:
    """The gateway's database, 0600 and owned by the gateway's user (root here): the sidecar
    run as another user (nobody) says to run it as the owner, for serve and for a command."""
    import shutil

    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed")
    shared = Path(f"/tmp/sessionwatch-owner-{os.getpid()}")
    shared.mkdir(mode=0o755)
    try:
        db = shared / "openclaw.sqlite"
        sqlite3.connect(db).close()
        db.chmod(0o600)
        home = shared / "home"
        home.mkdir(mode=0o777)
        for command in (["serve"], ["status", MAIN]):
            done = subprocess.run(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                 sys.executable, "-m", "monitor", "--db", str(db), *command],
                cwd=REPO, env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode != 0, command
            assert "belongs to root (uid 0), and this sidecar runs as" in done.stderr, done.stderr
            assert "run the sidecar as root (uid 0)" in done.stderr
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_store_that_is_not_the_installs_own_is_not_the_gateways_to_wake_for(
    tmp_path: Path,
) -> None:
    """Next to an OpenClaw install, a sidecar on another database (the README's scratch
    walkthrough, say) must not wake the gateway for notices the gateway never knew."""
    home = tmp_path / "home"
    an_openclaw_install(home / ".openclaw", 9)
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    scratch = orjson.loads(sw({**env, "SESSIONWATCH_DB": str(tmp_path / "s.db")}, "config").stdout)
    assert scratch["store"]["from"] == "$SESSIONWATCH_DB"
    assert "from" not in scratch["gateway"] and scratch["gateway"]["hooks_url"] == ""
    own = orjson.loads(sw(env, "config").stdout)
    assert own["gateway"]["hooks_url"] == "http://127.0.0.1:9/hooks"


def test_the_gateways_recent_user_texts_are_read_as_it_reads_them(tmp_path: Path) -> None:
    """From the agent database's tables the gateway writes (the columns read here, as in
    OpenClaw 2026.9.6): the visible messages newest first, upstreamUserText preferred, a
    delivery mirror left out, zstd-packed events read, the last ten in order."""
    import zstandard

    state = tmp_path / "state"
    path = state / "agents" / "main" / "agent" / "openclaw-agent.sqlite"
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE session_nodes (session_key TEXT PRIMARY KEY, current_session_id TEXT);"
        "CREATE TABLE transcript_events (session_id TEXT, seq INTEGER, event_json TEXT,"
        " event_zstd BLOB, PRIMARY KEY (session_id, seq));"
        "CREATE TABLE session_transcript_active_events (session_id TEXT, active_position"
        " INTEGER, event_seq INTEGER, message_position INTEGER);"
    )
    conn.execute("INSERT INTO session_nodes VALUES ('agent:main:x', 's1')")

    def user(text: str, **meta: object) -> dict[str, object]:
        message: dict[str, object] = {"role": "user", "content": [{"type": "text", "text": text}]}
        if meta:
            message["__openclaw"] = meta
        return {"type": "message", "message": message}

    events = [
        {"type": "session"},
        user("a plain prompt"),
        user("what the channel showed", upstreamUserText="what the gateway sent"),
        user("a mirrored delivery", mirrorOrigin="telegram"),
        {"type": "message", "message": {"role": "assistant", "content": "ok"}},
        user("packed"),
    ] + [user(f"later {i}") for i in range(8)]
    for seq, event in enumerate(events):
        raw = orjson.dumps(event)
        packed = seq == 5
        conn.execute(
            "INSERT INTO transcript_events VALUES ('s1', ?, ?, ?)",
            (seq, None if packed else raw.decode(),
             zstandard.ZstdCompressor().compress(raw) if packed else None),
        )  # fmt: skip
        conn.execute(
            "INSERT INTO session_transcript_active_events VALUES ('s1', ?, ?, ?)",
            (seq, seq, seq if event["type"] == "message" else None),
        )
    conn.commit()
    conn.close()
    reader = openclaw.GatewayTranscripts(openclaw.locate({"OPENCLAW_STATE_DIR": str(state)}))
    texts = reader.recent("main", "agent:main:x")
    # eleven user texts but the mirror: the last ten, the upstream text in place of the shown
    assert texts == ["what the gateway sent", "packed", *[f"later {i}" for i in range(8)]]
    assert "a mirrored delivery" not in texts and "what the channel showed" not in texts
    assert reader.recent("main", "agent:main:unknown") == []
    assert reader.recent("ops", "agent:ops:x") == []  # no database for that agent
