"""The real gateway adopts a real Codex thread through its Codex plugin, supervision on, and
the sidecar follows the gateway's own ``codex-app-server`` link.

Everything is real but the model: OpenClaw 2026.9.6 as a throwaway user, its Codex plugin
``@openclaw/codex`` installed by the gateway itself from npm (offline, from the npm cache
tests/interop/install.sh fills: the gateway trusts only a plugin it installed), Codex 0.171.0
as the plugin's app-server and as the person's own ``codex``, and ``sessionwatch serve`` on
the gateway's database. The thread is made by a Codex app-server client (an interactive
source, as the gateway's catalog requires) and adopted with ``sessions.catalog.continue``.

A person types into the source before the gateway's first run; the gateway's run makes its
branch (``threadSource: "openclaw"``); the person then types into the branch, and then into
the source again, which the gateway no longer reads. Each prompt is recorded once, within a
second of Codex writing it: in the branch with the dedupe key the gateway's monitor uses, in
the source after the branch on the sidecar's own marker under a key of its own; the first
one's notice reaches the model once; the gateway's own prompt is not a person's; and the
gateway's own monitor, polling a minute later, records nothing new.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from monitor.kernel.notices import notice_text
from tests.interop import INSTALL_DIR, MODULES, NODE, OPENCLAW, unless_runnable
from tests.interop.gateway_rig import (
    Gateway,
    MockModelProcess,
    Sidecar,
    throwaway_user,
    wait_for,
    why_not_runnable,
)
from tests.interop.test_gateway import MAIN, delivered_once, state_version

CODEX = MODULES / "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"
PLUGIN_VERSION = "2026.9.5"
NPM_CACHE = INSTALL_DIR / "npm-cache"


def _why() -> str | None:
    why = why_not_runnable()
    if why is None and not CODEX.exists():
        why = f"Codex is not installed in {INSTALL_DIR}; run tests/interop/install.sh"
    if why is None and not (NPM_CACHE / f".openclaw-codex-{PLUGIN_VERSION}").exists():
        why = "the Codex plugin is not in the interop npm cache; run tests/interop/install.sh"
    return why


pytestmark = unless_runnable(_why())


class CodexGateway(Gateway):
    """The gateway with its Codex plugin on: supervision, the plugin's app-server being this
    Codex, in the user's own Codex home."""

    def env(self) -> dict[str, str]:
        # npm offline on the interop cache for every command, the gateway's own included: at
        # start it may decide the plugin's install is unfinished and look it up on npm,
        # which here fails only after a minute (a TLS-intercepting proxy), past the wait for
        # it to be ready; from the cache it answers at once
        npm = {"npm_config_cache": str(self.home / ".npm-offline"), "npm_config_offline": "true"}
        return super().env() | {"MOCK_API_KEY": "dummy", "LANG": "C.UTF-8"} | npm

    def write_config(self) -> None:
        before = json.loads(self.config_path.read_text()) if self.config_path.exists() else {}
        super().write_config()
        # what the gateway wrote (its meta, the plugin's install), then this rig's settings
        config = {**before, **json.loads(self.config_path.read_text())}
        plugins = before.get("plugins", {})  # what the plugin's install recorded
        entry = plugins.setdefault("entries", {}).setdefault("codex", {})
        entry["enabled"] = True
        entry["config"] = {
            "supervision": {"enabled": True},
            "appServer": {"command": str(CODEX), "homeScope": "user"},
        }
        config["plugins"] = plugins
        self.config_path.write_text(json.dumps(config, indent=2))

    def install_plugin(self) -> None:
        """``openclaw plugins install npm:@openclaw/codex@…`` as the gateway's user, npm
        offline on a copy of the interop cache."""
        cache = self.home / ".npm-offline"
        shutil.copytree(NPM_CACHE, cache)
        assert self.user is not None
        subprocess.run(["chown", "-R", f"{self.user}:{self.user}", str(cache)], check=True)
        self.write_config()
        env = self.env()
        argv = [str(NODE), str(OPENCLAW / "openclaw.mjs"), "plugins", "install"]
        argv += [f"npm:@openclaw/codex@{PLUGIN_VERSION}", "--pin"]
        proc = subprocess.run(
            self.command(*argv, env=env), cwd=self.home, capture_output=True, timeout=300
        )
        assert proc.returncode == 0, proc.stdout.decode()[-2000:] + proc.stderr.decode()[-2000:]


class AppServer:
    """``codex app-server`` as the person, in their Codex home: one client, as an editor's."""

    def __init__(self, gateway: CodexGateway, cwd: Path) -> None:
        self.proc = subprocess.Popen(
            gateway.command(str(CODEX), "app-server", env=gateway.env()),
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.ids = 0
        self.call("initialize", clientInfo={"name": "codex_vscode", "version": "0"})
        self.send({"jsonrpc": "2.0", "method": "initialized"})

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the app-server closed its output"
        found: dict[str, Any] = json.loads(line)
        return found

    def call(self, method: str, **params: Any) -> Any:
        self.ids += 1
        ident = self.ids
        self.send({"jsonrpc": "2.0", "id": ident, "method": method, "params": params})
        while True:
            answer = self.read()
            if answer.get("id") == ident:
                assert "result" in answer, answer
                return answer["result"]

    def turn(self, thread: str, text: str) -> None:
        self.call("turn/start", threadId=thread, input=[{"type": "text", "text": text}])
        while (message := self.read()).get("method") != "turn/completed":
            pass
        assert "completed" == message["params"]["turn"]["status"]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


@dataclass
class CodexRig:
    gateway: CodexGateway
    model: MockModelProcess
    sidecar: Sidecar
    project: Path
    thread: str
    key: str

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(f"file:{self.gateway.db}?mode=ro", uri=True)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def records(self) -> list[str]:
        """The dedupe keys of the human turns recorded for the adopted session."""
        rows = self.query(
            "SELECT dedupe_key FROM session_state_events WHERE session_key = ?"
            " AND kind = 'human_direct_message' ORDER BY sequence",
            self.key,
        )
        return [str(r[0]) for r in rows]

    def bound_thread(self) -> str:
        (value,) = self.query(
            "SELECT value_json FROM plugin_state_entries WHERE plugin_id = 'codex'"
            " AND namespace = 'app-server-thread-bindings'"
        )[0]
        return str(json.loads(value)["binding"]["threadId"])

    def marker(self) -> dict[str, Any]:
        (raw,) = self.query(
            "SELECT last_marker_json FROM session_upstream_links WHERE session_key = ?", self.key
        )[0]
        found: dict[str, Any] = json.loads(raw)
        return found


@pytest.fixture(scope="module")
def codex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CodexRig]:
    work = tmp_path_factory.mktemp("codex-gateway")
    work.chmod(0o755)
    with throwaway_user("sw-e2e-codex") as user:
        model = MockModelProcess(work)
        gateway = CodexGateway(work, model, user=user)
        sidecar: Sidecar | None = None
        try:
            home = gateway.home / ".codex"
            project = gateway.home / "billing"
            subprocess.run(gateway.command("mkdir", "-p", str(home), str(project)), check=True)
            (home / "config.toml").write_text(codex_config(model.base))
            shutil.chown(home / "config.toml", user, user)
            person = AppServer(gateway, project)
            thread = str(person.call("thread/start", cwd=str(project))["thread"]["id"])
            person.turn(thread, "fix the failing billing tests")
            person.close()
            gateway.install_plugin()
            gateway.start()
            adopted = gateway.call(
                "sessions.catalog.continue",
                {"catalogId": "codex", "hostId": "gateway:local", "threadId": thread},
            )
            key = str(adopted["sessionKey"])
            sidecar = Sidecar(
                work,
                gateway,
                claude_root=gateway.home / ".claude" / "projects",
                hooks_token=gateway.hooks_token,
            )
            roots = f'[roots]\ncodex = "{home / "sessions"}"\n'
            sidecar.config.write_text(sidecar.config.read_text().replace("[roots]\n", roots))
            sidecar.start()
            assert {"watched": True} == sidecar.cli("watch", "--watcher", MAIN, "--target", key)
            yield CodexRig(gateway, model, sidecar, project, thread, key)
        finally:
            if sidecar is not None:
                sidecar.stop()
            gateway.stop()
            model.stop()


def codex_config(model_base: str) -> str:
    return (
        'model = "mock-model"\nmodel_provider = "mock"\ncheck_for_update_on_startup = false\n'
        "[model_providers.mock]\n"
        f'name = "mock"\nbase_url = "{model_base}/v1"\nenv_key = "MOCK_API_KEY"\n'
        'wire_api = "responses"\nrequest_max_retries = 0\nstream_max_retries = 0\n'
        "supports_websockets = false\n"
        "[analytics]\nenabled = false\n[feedback]\nenabled = false\n"
        "[features]\nplugins = false\nremote_plugin = false\nplugin_sharing = false\n"
        "apps = false\n"
    )


def diagnose(rig: CodexRig, branch: str) -> str:
    """What the sidecar had to go by when it took the gateway's prompt for a person's."""
    from monitor.openclaw.files import gateway_transcripts

    said = []
    for path in (rig.gateway.home / ".codex").rglob(f"rollout-*{branch}*.jsonl"):
        for line in path.read_text().splitlines():
            payload = json.loads(line).get("payload", {})
            item = payload.get("item") if isinstance(payload, dict) else None
            if isinstance(item, dict) and item.get("type") == "UserMessage":
                said.append(json.dumps(item.get("content"))[:300])
    texts = gateway_transcripts(rig.gateway.db)
    own = [t[:300] for t in texts.recent("main", rig.key)] if texts else None
    log = [x for x in rig.sidecar.log_text().splitlines() if "codex" in x or rig.key in x]
    return f"branch said {said}; gateway's texts {own}; sidecar log {log[-20:]}"


def typed_into(rig: CodexRig, thread: str, text: str) -> float:
    """The person types ``text`` into ``thread`` with ``codex exec resume``, once the
    gateway's app-server has let go of it (it holds a thread it ran as its writer for a
    while); when the command that wrote it started."""
    argv = [str(CODEX), "exec", "--skip-git-repo-check", "resume", thread, text]
    deadline = time.monotonic() + 180
    while True:
        started = time.monotonic()
        proc = subprocess.run(
            rig.gateway.command(*argv, env=rig.gateway.env()),
            cwd=rig.project,
            capture_output=True,
            timeout=180,
        )
        if proc.returncode == 0:
            return started
        assert b"already has an active writer" in proc.stderr, proc.stderr.decode()[-2000:]
        assert time.monotonic() < deadline, "the gateway's app-server kept the thread"
        time.sleep(2)


def test_each_prompt_is_recorded_once_before_and_after_the_branch(codex: CodexRig) -> None:
    rig = codex
    links = rig.sidecar.cli("links")["links"]
    (link,) = [x for x in links if x["sessionKey"] == rig.key]
    assert ("codex-app-server", False, rig.thread) == (
        link["upstreamKind"],
        link["foreign"],
        link["threadId"],
    )
    prefix = f"upstream:{rig.key}:"

    # 1. Before the gateway's first run, the gateway probes the source: typed there.
    seen = state_version(rig.sidecar, rig.key)
    before = len(rig.model.requests())
    person = AppServer(rig.gateway, rig.project)
    person.call("thread/resume", threadId=rig.thread)
    typed = time.monotonic()
    person.turn(rig.thread, "and run them again")
    person.close()
    wait_for("the source's prompt to be recorded", lambda: rig.records() or None, 30)
    first_at = time.monotonic() - typed
    (first,) = rig.records()
    assert first.startswith(prefix) and first.endswith(f"{rig.marker()['turnId']}:1")
    delivered_once(rig.model, before, notice_text(rig.key, seen))

    # 2. The gateway's first run makes its branch; its own prompt there is not a person's.
    rig.gateway.call(
        "chat.send",
        {"sessionKey": rig.key, "message": "go on with the tests", "idempotencyKey": "gw-run-1"},
    )
    branch = wait_for(
        "the gateway's branch",
        lambda: ((t := rig.bound_thread()) != rig.thread and t) or None,
        180,
    )
    wait_for(
        "the gateway's run to end",
        lambda: rig.marker().get("turnId") not in (None, first.rsplit(":", 2)[-2]) or None,
        120,
    )
    assert [first] == rig.records(), diagnose(rig, branch)

    # 3. After it, the gateway probes the branch: typed there, recorded once; the source no
    # longer counts.
    written = typed_into(rig, branch, "now the integration tests")
    wait_for("the branch's prompt to be recorded", lambda: len(rig.records()) == 2 or None, 30)
    second_at = time.monotonic() - written
    assert rig.records()[1].startswith(prefix)
    assert rig.records()[1].endswith(f"{rig.marker()['turnId']}:1")
    # by the early check, not by the tick (every 60 s here): a bound no loaded machine
    # misses (it read 2.1 s beside three busy workers); bench/codex_wake.py measures speed
    assert first_at < 15 and second_at < 15, (first_at, second_at)

    # 4. The person goes on in their own thread, the source, which the gateway no longer
    # probes: the sidecar follows it on its own marker, records the prompt once under a
    # key of its own, and leaves the gateway's marker where it was.
    marker = rig.marker()
    written = typed_into(rig, rig.thread, "and the flaky one, from my own terminal")
    wait_for(
        "the source's later prompt to be recorded", lambda: len(rig.records()) == 3 or None, 30
    )
    third_at = time.monotonic() - written
    assert rig.records()[2].startswith(f"upstream-source:{rig.key}:"), rig.records()
    assert marker == rig.marker()
    assert third_at < 15, third_at  # the early check, as above

    # 5. The gateway's own monitor polls every minute: it finds nothing new.
    time.sleep(65)
    assert 3 == len(rig.records())
    assert marker == rig.marker()
    assert "database is locked" not in rig.sidecar.log_text()
