"""The real OpenClaw gateway, a mock model, the real Claude Code CLI and ``sessionwatch serve``,
each its own process on loopback, for the end-to-end tests.

Two ways to run the gateway:

- as a throwaway system user with no state overrides (``useradd -r``, then ``runuser``), so
  that its Claude catalog scans that user's ``~/.claude/projects``: the catalog path;
- as this user in a scratch state directory (``OPENCLAW_STATE_DIR`` and friends), for what
  needs no catalog.

Nothing here talks to anything beyond loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson

from tests.helpers import REPO
from tests.interop import CLAUDE, NODE, OPENCLAW

T = TypeVar("T")
QUIET = {
    "OPENCLAW_DISABLE_BONJOUR": "1",
    "OPENCLAW_NO_RESPAWN": "1",
    "OPENCLAW_SKIP_CHANNELS": "1",
    "OPENCLAW_NO_AUTO_UPDATE": "1",
    "OPENCLAW_SKIP_GMAIL_WATCHER": "1",
    "OPENCLAW_DISABLE_BUNDLED_PLUGIN_POSTINSTALL": "1",
    "OPENCLAW_EXEC_SHELL_SNAPSHOT": "0",
}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
USER = "sw-e2e-gateway"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0) -> T:
    """Poll ``probe`` until it answers something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def http(
    method: str, url: str, body: Any = None, token: str | None = None, timeout: float = 30
) -> tuple[int, Any]:
    """One loopback HTTP call with the standard library (the rig runs outside asyncio);
    ``timeout``: for the answer (a harness's whole turn, for one that answers at its end)."""
    import urllib.error
    import urllib.request

    data = None if body is None else orjson.dumps(body)
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, orjson.loads(raw)
    except orjson.JSONDecodeError:
        return status, raw.decode("utf-8", "replace")


class MockModelProcess:
    """``tests/mock_model.py`` in a process of its own."""

    def __init__(self, work: Path) -> None:
        port_file = work / "mock.port"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.mock_model", "--port-file", str(port_file)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=(work / "mock.log").open("wb"),
        )
        self.port = int(wait_for("the mock model", lambda: _read(port_file), 30))
        self.base = f"http://127.0.0.1:{self.port}"

    def script(self, **how: Any) -> None:
        assert 200 == http("POST", f"{self.base}/_script", how)[0]

    def requests(self) -> list[dict[str, Any]]:
        status, answer = http("GET", f"{self.base}/_requests")
        assert 200 == status
        return list(answer)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def model_texts(requests: list[dict[str, Any]], *, new_only: bool = False) -> list[str]:
    """The text of every chat request the gateway made, one string per request; with
    ``new_only``, only what the request brings after the model's last answer (its new input,
    not the history a later run of the session sends again)."""
    texts = []
    for r in requests:
        if r["path"] != "/v1/chat/completions":
            continue
        messages = r["body"].get("messages", [])
        if new_only:
            answered = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
            messages = messages[answered[-1] + 1 :] if answered else messages
        parts = []
        for message in messages:
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts += [p.get("text", "") for p in content if isinstance(p, dict)]
        texts.append("\n".join(parts))
    return texts


def mentions(requests: list[dict[str, Any]], text: str, *, new_only: bool = False) -> int:
    """How many times ``text`` reached the model over all of its chat requests: as it is, or
    quoted as the gateway quotes a system line (a JSON string inside the prompt)."""
    quoted = json.dumps(text)[1:-1]
    return sum(
        t.count(text) + (t.count(quoted) if quoted != text else 0)
        for t in model_texts(requests, new_only=new_only)
    )


class Gateway:
    """``openclaw gateway run`` with hooks on, loopback only, on the mock model."""

    def __init__(self, work: Path, model: MockModelProcess, *, user: str | None) -> None:
        self.work = work
        self.user = user
        self.port = free_port()
        self.token = "gw-" + secrets.token_hex(16)
        self.hooks_token = "hooks-" + secrets.token_hex(16)
        self.allow_keys = True
        if user:
            self.home = Path(pwd.getpwnam(user).pw_dir)
            self.config_path = self.home / ".openclaw" / "openclaw.json"
            self.db = self.home / ".openclaw" / "state" / "openclaw.sqlite"
        else:
            self.home = work / "home"
            self.config_path = work / "openclaw.json"
            self.db = work / "state" / "state" / "openclaw.sqlite"
        self.model = model
        self.log = work / "gateway.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        env = {"HOME": str(self.home), "PATH": f"{NODE.parent}:/usr/bin:/bin", **QUIET}
        if not self.user:
            env |= {
                "OPENCLAW_HOME": str(self.home),
                "OPENCLAW_STATE_DIR": str(self.work / "state"),
                "OPENCLAW_CONFIG_PATH": str(self.config_path),
            }
        return env

    def command(self, *argv: str, env: dict[str, str] | None = None) -> list[str]:
        """``argv`` with this gateway's environment, as its user where it has one."""
        full = ["env", "-i", *(f"{k}={v}" for k, v in (env or self.env()).items()), *argv]
        return ["runuser", "-u", self.user, "--", *full] if self.user else full

    def write_config(self) -> None:
        model = {
            "id": "mock-model",
            "name": "Mock",
            "api": "openai-completions",
            "reasoning": False,
            "input": ["text"],
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
            "contextWindow": 128000,
            "maxTokens": 4096,
        }
        hooks: dict[str, Any] = {"enabled": True, "token": self.hooks_token, "path": "/hooks"}
        if self.allow_keys:
            hooks |= {
                "allowRequestSessionKey": True,
                "allowedSessionKeyPrefixes": ["hook:", "agent:"],
            }
        config = {
            "gateway": {
                "mode": "local",
                "port": self.port,
                "bind": "loopback",
                "auth": {"mode": "token", "token": self.token},
            },
            "hooks": hooks,
            "models": {
                "providers": {
                    "mock": {
                        "baseUrl": f"{self.model.base}/v1",
                        "apiKey": "dummy",
                        "api": "openai-completions",
                        "models": [model],
                    }
                }
            },
            "agents": {"defaults": {"model": {"primary": "mock/mock-model"}}},
        }
        self.home.mkdir(parents=True, exist_ok=True)
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(json.dumps(config, indent=2))
        if self.user:
            shutil.chown(self.config_path.parent, self.user, self.user)
            shutil.chown(self.config_path, self.user, self.user)

    def start(self) -> None:
        self.write_config()
        offset = self.log.stat().st_size if self.log.exists() else 0
        log = self.log.open("ab")
        self.proc = subprocess.Popen(
            self.command(str(NODE), str(OPENCLAW / "openclaw.mjs"), "gateway", "run"),
            cwd=self.home,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the gateway exited: {self.log_text()[-3000:]}")
            text = ANSI.sub("", self.log.read_bytes()[offset:].decode("utf-8", "replace"))
            return bool(re.search(r"\[gateway\] ready\b", text))

        try:  # 15 plugins and their migrations: beside 3 busy test workers it took over 120 s
            wait_for("the gateway to be ready", ready, 300)
        except AssertionError as timeout:
            # The log says why (a plugin install, an npm lookup, a port): carry its tail.
            raise AssertionError(f"{timeout}; its log ends:\n{self.log_text()[-3000:]}") from None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def log_text(self) -> str:
        return ANSI.sub("", self.log.read_bytes().decode("utf-8", "replace"))

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        status, _ = http("GET", f"{self.base}/healthz")
        return status == 200

    def call(self, method: str, params: dict[str, Any]) -> Any:
        """A gateway RPC method through its own CLI (``openclaw gateway call``).

        The CLI gives up on an answer after 10 s by default. A loaded two-core machine running
        the whole suite has had the gateway accept an ``agent`` call later than that, while
        the sidecar wrote the same file, so the CLI waits as long as this process does: a
        test here asks what the gateway answers, never how fast."""
        argv = [str(NODE), str(OPENCLAW / "openclaw.mjs"), "gateway", "call", method]
        argv += ["--params", json.dumps(params), "--json", "--timeout", "110000"]
        proc = subprocess.run(
            self.command(*argv), cwd=self.home, capture_output=True, timeout=120, check=False
        )
        out = proc.stdout.decode()
        assert proc.returncode == 0, out + proc.stderr.decode()
        return json.loads(out[out.index("{") :])

    def hook_wake(self, body: dict[str, Any], token: str | None = None) -> tuple[int, Any]:
        return http("POST", f"{self.base}/hooks/wake", body, token or self.hooks_token)

    def session_status(self, key: str, changes_since: int) -> dict[str, Any]:
        """OpenClaw's own ``session_status`` tool, as the woken agent would call it."""
        body = {
            "tool": "session_status",
            "args": {"sessionKey": key, "changesSince": changes_since},
        }
        status, answer = http("POST", f"{self.base}/tools/invoke", body, self.token)
        assert 200 == status, answer
        details: dict[str, Any] = answer["result"]["details"]
        return details


class ClaudeCode:
    """The real Claude Code CLI, as ``user`` in ``cwd``, against the mock's Messages API."""

    def __init__(self, gateway: Gateway, cwd: Path) -> None:
        self.gateway = gateway
        self.cwd = cwd

    def prompt(self, text: str, *, resume: str | None = None) -> str:
        """Type one prompt the way a person does in print mode; the session id."""
        env = {
            "HOME": str(self.gateway.home),
            "PATH": "/usr/bin:/bin",
            "ANTHROPIC_BASE_URL": self.gateway.model.base,
            "ANTHROPIC_API_KEY": "dummy",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
        }
        argv = [str(CLAUDE), "-p", text, "--output-format", "json"]
        if resume:
            argv += ["--resume", resume]
        proc = subprocess.run(
            self.gateway.command(*argv, env=env),
            cwd=self.cwd,
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
        answer = json.loads(proc.stdout)
        assert not answer.get("is_error"), answer
        return str(answer["session_id"])


class Sidecar:
    """``sessionwatch serve`` on the gateway's database, waking it through its hooks.

    ``zero``: with no configuration of its store, its gateway or its roots at all, in the
    gateway's own environment (its HOME and OPENCLAW_* variables), as a user runs it next
    to OpenClaw: it finds the database, the hooks and the token in OpenClaw's files. Its
    configuration file says only where its API listens."""

    def __init__(
        self,
        work: Path,
        gateway: Gateway,
        *,
        claude_root: Path,
        hooks_token: str,
        zero: bool = False,
    ):
        self.work = work
        self.gateway = gateway
        self.zero = zero
        self.port = free_port()
        self.config = work / "sessionwatch.toml"
        self.hooks_token_file = work / "hooks-token"
        self.set_hooks_token(hooks_token)
        api = f'[api]\nlisten = "127.0.0.1:{self.port}"\ntoken_file = "{work / "token"}"\n'
        if zero:
            self.config.write_text(f"{api}[monitor]\ninitial_delay_s = 1\n")
        else:
            self.config.write_text(
                f'[roots]\nclaude = "{claude_root}"\n{api}'
                f'[gateway]\nhooks_url = "{gateway.base}/hooks"\n'
                f'hooks_token_file = "{self.hooks_token_file}"\nretry_interval_s = 1\n'
                "[monitor]\ninitial_delay_s = 1\n"
            )
        self.log = work / "serve.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str] | None:
        """The gateway's environment for a ``zero`` sidecar (else this process's)."""
        if not self.zero:
            return None
        return {**self.gateway.env(), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    def set_hooks_token(self, token: str) -> None:
        self.hooks_token_file.write_text(token + "\n")
        self.hooks_token_file.chmod(0o600)

    def start(self, *, wait: bool = True) -> None:
        """Start ``serve``; with ``wait``, until it listens (else :meth:`serving`)."""
        self.proc = subprocess.Popen(
            [*self.base_argv(), "serve"],
            cwd=REPO,
            env=self.env(),
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("ab"),
        )
        if wait:
            self.serving()

    def serving(self, timeout: float = 60) -> None:
        wait_for("serve to listen", lambda: "serving" in self.log_text(), timeout)

    def base_argv(self) -> list[str]:
        db = [] if self.zero else ["--db", str(self.gateway.db)]
        return [sys.executable, "-m", "monitor", *db, "--config", str(self.config)]

    def cli(self, *args: str) -> Any:
        proc = subprocess.run(
            [*self.base_argv(), *args],
            cwd=REPO,
            env=self.env(),
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr.decode()
        return orjson.loads(proc.stdout)

    def metric(self, name: str, **labels: str) -> float:
        token = (self.work / "token").read_text().strip()
        status, text = http("GET", f"http://127.0.0.1:{self.port}/metrics", token=token)
        assert 200 == status
        want = name + (
            "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
        )
        for line in str(text).splitlines():
            if line.startswith(want + " "):
                return float(line.split()[-1])
        return 0.0

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def serve_before_first_start(work: Path, gateway: Gateway) -> Sidecar:
    """A first boot where the sidecar's unit wins the race: ``openclaw.json`` is there
    (onboarding wrote it), the gateway has not started yet, so its state database is not
    made. ``serve``, with no configuration, waits for it; then the gateway starts, and
    ``serve`` follows the database it makes. The sidecar, serving."""
    gateway.write_config()
    sidecar = Sidecar(
        work,
        gateway,
        claude_root=gateway.home / ".claude" / "projects",
        hooks_token=gateway.hooks_token,
        zero=True,
    )
    sidecar.start(wait=False)
    try:
        wait_for("serve to wait", lambda: "waiting for" in sidecar.log_text(), 60)
        gateway.start()
        sidecar.serving(120)
    except BaseException:
        sidecar.stop()
        raise
    return sidecar


@contextlib.contextmanager
def throwaway_user(user: str = USER) -> Iterator[str]:
    """A system user with its own home in a fresh directory; removed afterwards. Modules
    that may run at once (in two workers) each take a name of their own: making the user
    kills whatever runs as it."""
    base = Path(tempfile.mkdtemp(prefix="sw-e2e-", dir="/tmp"))
    base.chmod(0o755)
    home = base / "home"
    with contextlib.suppress(KeyError):  # left by a run that was killed: its processes too
        pwd.getpwnam(user)
        subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True, check=False)
        for _ in range(50):  # userdel refuses a user whose processes are still exiting
            if subprocess.run(["userdel", "-r", user], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
    subprocess.run(
        ["useradd", "-r", "-m", "-d", str(home), "-s", "/bin/sh", user],
        check=True,
        capture_output=True,
    )
    try:
        yield user
    finally:
        subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True, check=False)
        subprocess.run(["userdel", "-r", user], capture_output=True, check=False)
        shutil.rmtree(base, ignore_errors=True)


def why_not_runnable() -> str | None:
    """Why the end-to-end tests cannot run here, or None."""
    if not (NODE.exists() and (OPENCLAW / "dist").is_dir() and CLAUDE.exists()):
        from tests.interop import NOT_INSTALLED

        return NOT_INSTALLED
    if os.geteuid() != 0:
        return "the gateway end-to-end tests make a throwaway user: they need root"
    for tool in ("useradd", "userdel", "runuser"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None
