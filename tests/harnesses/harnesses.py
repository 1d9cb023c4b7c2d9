"""The four real harnesses, driven the way a person types into them, offline against the mock
model on loopback (``tests/mock_model.py``), each with ``HOME`` in a scratch directory.

``tests/interop/install.sh`` installs them from the npm registry at pinned versions (or the
newest with ``HARNESS_VERSIONS=latest``) beside Node 24:

| harness | first prompt | the next ones | writes |
|---|---|---|---|
| Claude Code | ``claude -p TEXT`` | ``--resume ID`` | ``~/.claude/projects/<cwd>/<id>.jsonl`` |
| Codex | ``codex exec TEXT`` | ``codex exec resume --last TEXT`` | ``$CODEX_HOME/sessions/...`` |
| OpenCode | ``opencode run TEXT`` | ``--continue`` | ``~/.local/share/opencode/opencode.db`` |
| Pi | ``pi --print TEXT`` | ``--continue`` | ``~/.pi/agent/sessions/<cwd>/<id>.jsonl`` |
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from adapters.jsonl_format import format_of
from tests.adapters.full_parse import both_ways
from tests.helpers import REPO
from tests.interop import MODULES, NODE
from tests.interop.gateway_rig import MockModelProcess

KINDS = ("claude", "codex", "opencode", "pi")
PACKAGES = {
    "claude": "@anthropic-ai/claude-code",
    "codex": "@openai/codex",
    "opencode": "opencode-ai",
    "pi": "@earendil-works/pi-coding-agent",
}
BINARIES = {"claude": "claude", "codex": "codex", "opencode": "opencode", "pi": "pi"}
TIMEOUT_S = 120
MAIN = "agent:main:main"


def installed_version(kind: str) -> str | None:
    try:
        manifest = json.loads((MODULES / PACKAGES[kind] / "package.json").read_text())
    except (OSError, ValueError):
        return None
    version = manifest.get("version")
    return version if isinstance(version, str) else None


def why_not_runnable(kind: str) -> str | None:
    if not NODE.exists():
        return "Node 24 is not installed; run tests/interop/install.sh"
    if not (MODULES / ".bin" / BINARIES[kind]).exists() or installed_version(kind) is None:
        return f"{PACKAGES[kind]} is not installed; run tests/interop/install.sh"
    return None


@dataclass
class Harness:
    """One harness in ``work``: its home, its project directory, its session."""

    kind: str
    work: Path
    model: MockModelProcess
    session: str | None = None
    runs: list[float] = field(default_factory=list)
    moved: bool = False  # its home set by its own variable, outside HOME (home_vars)

    def __post_init__(self) -> None:
        self.home = self.work / "home"
        self.project = self.work / "project"
        self.project.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        getattr(self, f"_setup_{self.kind}")()

    @property
    def version(self) -> str | None:
        return installed_version(self.kind)

    def home_vars(self) -> dict[str, str]:
        """The harness's own variables that put its sessions outside HOME: Codex's
        CODEX_HOME always, the others' when ``moved``."""
        if self.kind == "codex":
            return {"CODEX_HOME": str(self.work / "codex-home")}
        if not self.moved:
            return {}
        return {
            "claude": {"CLAUDE_CONFIG_DIR": str(self.work / "claude-config")},
            "opencode": {"XDG_DATA_HOME": str(self.work / "xdg-data")},
            "pi": {"PI_CODING_AGENT_DIR": str(self.work / "pi-agent")},
        }[self.kind]

    def root(self) -> tuple[str, Path]:
        """The ``[roots]`` key and value that point sessionwatch at what it writes."""
        if self.moved and self.kind != "codex":
            return {
                "claude": ("claude", self.work / "claude-config" / "projects"),
                "opencode": ("opencode_db", self.work / "xdg-data/opencode/opencode.db"),
                "pi": ("pi", self.work / "pi-agent" / "sessions"),
            }[self.kind]
        return {
            "claude": ("claude", self.home / ".claude" / "projects"),
            "codex": ("codex", self.work / "codex-home" / "sessions"),
            "opencode": ("opencode_db", self.home / ".local/share/opencode/opencode.db"),
            "pi": ("pi", self.home / ".pi" / "agent" / "sessions"),
        }[self.kind]

    def env(self) -> dict[str, str]:
        env = {
            "HOME": str(self.home),
            "PATH": f"{NODE.parent}:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            # nothing beyond loopback: no proxy, no telemetry, no update checks
            "NO_PROXY": "*",
        }
        return env | getattr(self, f"_env_{self.kind}")() | self.home_vars()

    def prompt(self, text: str, *extra: str) -> str:
        """Type one prompt: the first starts the session, the next ones resume it. Returns
        the session id (Claude Code's; the others answer "started")."""
        import time

        start = time.monotonic()
        proc = self._exec(*self._argv(text), *extra)
        self.runs.append(time.monotonic() - start)
        out = proc.stdout.decode("utf-8", "replace")
        assert proc.returncode == 0, f"{self.kind}: {out[-2000:]}{proc.stderr.decode()[-2000:]}"
        if self.kind == "claude":
            answered = str(json.loads(out)["session_id"])
            self.session = self.session or answered
            return answered
        self.session = self.session or "started"
        return self.session

    def run(self, *args: str) -> None:
        """Run the harness's binary with ``args`` as a person would, in its project."""
        proc = self._exec(*args)
        assert proc.returncode == 0, f"{self.kind} {args}: {proc.stderr.decode()[-2000:]}"

    def _exec(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [str(MODULES / ".bin" / BINARIES[self.kind]), *args],
            cwd=self.project,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=TIMEOUT_S,
            check=False,
        )

    def _argv(self, text: str) -> list[str]:
        again = self.session is not None
        if self.kind == "claude":
            resume = ["--resume", self.session] if again and self.session else []
            return ["-p", text, "--output-format", "json", *resume]
        if self.kind == "codex":
            base = ["exec", "--skip-git-repo-check"]
            return [*base, "resume", "--last", text] if again else [*base, text]
        if self.kind == "opencode":
            return ["run", *(["--continue"] if again else []), text]
        return [
            "--provider",
            "mock",
            "--model",
            "mock-model",
            *(["--continue"] if again else []),
            "--print",
            text,
        ]

    # -- per harness -----------------------------------------------------------------------

    def _setup_claude(self) -> None:
        pass

    def _env_claude(self) -> dict[str, str]:
        return {
            "ANTHROPIC_BASE_URL": self.model.base,
            "ANTHROPIC_API_KEY": "dummy",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
        }

    def _setup_codex(self) -> None:
        home = self.work / "codex-home"
        home.mkdir(exist_ok=True)
        (home / "config.toml").write_text(
            'model = "mock-model"\nmodel_provider = "mock"\n'
            "check_for_update_on_startup = false\n"
            "[model_providers.mock]\n"
            f'name = "mock"\nbase_url = "{self.model.base}/v1"\nenv_key = "MOCK_API_KEY"\n'
            'wire_api = "responses"\nrequest_max_retries = 0\nstream_max_retries = 0\n'
            "supports_websockets = false\n"
            "[analytics]\nenabled = false\n[feedback]\nenabled = false\n"
            "[features]\nplugins = false\nremote_plugin = false\nplugin_sharing = false\n"
            "apps = false\n"
        )

    def _env_codex(self) -> dict[str, str]:
        return {"MOCK_API_KEY": "dummy"}  # CODEX_HOME: home_vars

    def _setup_opencode(self) -> None:
        config = {
            "provider": {
                "mock": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Mock",
                    "options": {"baseURL": f"{self.model.base}/v1", "apiKey": "dummy"},
                    "models": {"mock-model": {"name": "Mock Model"}},
                }
            },
            "model": "mock/mock-model",
            "small_model": "mock/mock-model",
            "enabled_providers": ["mock"],
            "autoupdate": False,
            "share": "disabled",
        }
        (self.work / "opencode.json").write_text(json.dumps(config))

    def _env_opencode(self) -> dict[str, str]:
        return {
            "OPENCODE_CONFIG": str(self.work / "opencode.json"),
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
        }

    def _setup_pi(self) -> None:
        agent = self.work / "pi-agent" if self.moved else self.home / ".pi" / "agent"
        agent.mkdir(parents=True, exist_ok=True)
        model = {"id": "mock-model", "name": "Mock", "contextWindow": 128000, "maxTokens": 4096}
        provider = {
            "baseUrl": f"{self.model.base}/v1",
            "api": "openai-completions",
            "apiKey": "dummy",
            "models": [model],
        }
        (agent / "models.json").write_text(json.dumps({"providers": {"mock": provider}}))

    def _env_pi(self) -> dict[str, str]:
        return {"PI_OFFLINE": "1"}


class Sidecar:
    """``sessionwatch`` one-shot commands on a scratch database, rooted at the harness."""

    def __init__(self, work: Path, harness: Harness, *, env: dict[str, str] | None = None) -> None:
        """``env``: run with these variables and no ``[roots]``, so that each root is where
        the harness's own variables put it (HOME is a directory of its own)."""
        key, root = harness.root()
        self.db = work / "state.db"
        self.config = work / "sessionwatch.toml"
        self.config.write_text(f'[roots]\n{key} = "{root}"\n' if env is None else "")
        self.env: dict[str, str] | None = None
        if env is not None:
            (work / "sidecar-home").mkdir(exist_ok=True)
            self.env = {"PATH": "/usr/bin:/bin", "HOME": str(work / "sidecar-home"), **env}

    def __call__(self, *args: str) -> Any:
        return orjson.loads(self.run(*args))

    def run(self, *args: str) -> bytes:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "monitor",
                "--db",
                str(self.db),
                "--config",
                str(self.config),
                *args,
            ],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr.decode()
        return proc.stdout

    def adopt(self, kind: str, key: str, native_id: str | None = None) -> dict[str, Any]:
        """Adopt the harness's session (the one with ``native_id``, else the only one) from
        the catalog under ``key``, watched by the main session; its catalog entry."""
        from tests.interop.gateway_rig import wait_for

        def listed() -> dict[str, Any] | None:
            sessions = self("catalog", "--kind", kind, "--json")["sessions"]
            found = [s for s in sessions if native_id in (None, s["nativeId"])]
            assert len(found) <= 1, found
            return found[0] if found else None

        entry = wait_for(f"{kind} session {native_id or ''} in the catalog", listed, 30)
        adopted = self("adopt", entry["catalogId"], "--session-key", key)
        assert adopted["link"] is not None, adopted
        assert {"watched": True} == self("watch", "--watcher", MAIN, "--target", key)
        found: dict[str, Any] = entry
        return found

    def events(self, key: str) -> list[dict[str, Any]]:
        """Every event recorded for ``key``, oldest first."""
        found: list[dict[str, Any]] = self("status", key, "--changes-since", "0")["stateChanges"][
            "events"
        ]
        return found

    def count(self, key: str, kind: str = "human_direct_message") -> int:
        """How many of ``kind`` were recorded: the turns a tick found together are one
        event that says how many (``payload.turns``)."""
        return sum(
            int((e.get("payload") or {}).get("turns", 1))
            for e in self.events(key)
            if e["kind"] == kind
        )

    def human_turns(self, key: str) -> int:
        return self.count(key)

    def ticked_to(self, key: str, n: int, kind: str = "human_direct_message") -> None:
        """Tick until ``key`` has recorded ``n`` events of ``kind`` (a harness may flush its
        file just after it answers), then check that it has exactly that many."""
        from tests.interop.gateway_rig import wait_for

        def reached() -> bool:
            self("tick")
            return self.count(key, kind) >= n

        wait_for(f"{n} {kind} of {key}", reached, 30)
        assert n == self.count(key, kind)


def replay_summary(sw: Sidecar, harness: Harness, entry: dict[str, Any]) -> dict[str, Any]:
    """``sessionwatch replay`` of a session the harness wrote; a JSONL session is also read
    with its format's pre-filter and by parsing every line, which must find the same."""
    if harness.kind in ("claude", "codex", "pi"):
        with_prefilter, every_line = both_ways(
            format_of(harness.kind), Path(entry["path"]).read_bytes()
        )
        assert with_prefilter == every_line, entry["path"]
    args = ["replay", "--adapter", harness.kind, entry["path"]]
    if harness.kind == "opencode":
        args += ["--session", entry["nativeId"]]
    lines = [orjson.loads(line) for line in sw.run(*args).splitlines()]
    summary: dict[str, Any] = lines[-1]
    return summary
