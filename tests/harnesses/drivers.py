"""The harnesses' own programmatic front ends, for what their print modes cannot do: queue a
prompt while the model answers, interrupt a turn, compact, fork.

- Pi: ``pi --mode rpc``, JSON commands on stdin and events on stdout (``prompt``,
  ``steer``, ``follow_up``, ``abort``, ``compact``, ``fork``), as its ``docs/rpc.md`` says.
- Claude Code: ``claude -p --input-format stream-json``, one user message per line on stdin
  while earlier ones run, and a ``control_request`` of subtype ``interrupt``, as its SDKs
  drive it.
- Claude Code's interactive TUI in a detached ``tmux`` session, typed into key by key, as
  a person does: a prompt typed while the model answers is queued by the TUI itself, and
  Escape interrupts.
- OpenCode: ``opencode serve``, its HTTP API on loopback (``POST /session``,
  ``.../message``, ``.../prompt_async``, ``.../abort``, ``.../summarize``, ``.../fork``),
  as its ``/doc`` OpenAPI document describes the installed version.
- Codex: ``codex app-server``, JSON-RPC over stdio (``thread/start``, ``turn/start``,
  ``turn/steer``, ``turn/interrupt``, ``thread/compact/start``, ``thread/fork``), as
  ``codex app-server generate-json-schema`` describes the installed version.

Each is the real binary, with the harness's scratch ``HOME`` and the mock model.
"""

from __future__ import annotations

import json
import queue
import re
import shutil
import subprocess
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import orjson

from tests.harnesses.harnesses import BINARIES, TIMEOUT_S, Harness
from tests.interop import MODULES
from tests.interop.gateway_rig import http, wait_for

Message = dict[str, Any]


class JsonLinesChild:
    """A harness process that reads JSON lines on stdin and writes them on stdout; every
    line it writes is kept, in order."""

    def __init__(self, harness: Harness, *args: str) -> None:
        self.harness = harness
        binary = MODULES / ".bin" / BINARIES[harness.kind]
        self.log = (harness.work / f"{harness.kind}-driver.log").open("wb")
        self.proc = subprocess.Popen(
            [str(binary), *args],
            cwd=harness.project,
            env=harness.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        self.seen: list[Message] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a log line of the harness, not a message
            if isinstance(message, dict):
                with self._lock:
                    self.seen.append(message)

    def send(self, message: Message) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(orjson.dumps(message) + b"\n")
        self.proc.stdin.flush()

    def mark(self) -> int:
        """Where the messages written from now on start, for :meth:`wait`."""
        with self._lock:
            return len(self.seen)

    def wait(self, what: str, match: Callable[[Message], bool], since: int = 0) -> Message:
        """The first message from ``since`` on that ``match`` accepts."""

        def probe() -> Message | None:
            with self._lock:
                return next((m for m in self.seen[since:] if match(m)), None)

        return wait_for(f"{self.harness.kind}: {what}", probe, TIMEOUT_S)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


class PiRpc(JsonLinesChild):
    """``pi --mode rpc`` on the mock model."""

    def __init__(self, harness: Harness) -> None:
        super().__init__(harness, "--mode", "rpc", "--provider", "mock", "--model", "mock-model")
        self._ids = 0

    def command(self, kind: str, **fields: Any) -> Message:
        """Send one command; its response (which says it started, not that it finished)."""
        self._ids += 1
        ident = f"sw-{self._ids}"
        self.send({"id": ident, "type": kind, **fields})
        answer = self.wait(f"the answer to {kind}", lambda m: m.get("id") == ident)
        assert answer.get("success") is True, answer
        return answer

    def idle(self) -> None:
        """Wait until nothing streams and nothing is queued."""

        def quiet() -> bool:
            state = self.command("get_state")["data"]
            return not state["isStreaming"] and not state.get("pendingMessageCount")

        wait_for("pi: idle", quiet, TIMEOUT_S)

    def prompt(self, text: str) -> None:
        since = self.mark()
        self.command("prompt", message=text)
        self.wait("the turn's end", lambda m: m.get("type") == "agent_end", since)
        self.idle()


class ClaudeStream(JsonLinesChild):
    """``claude -p`` reading stream-json from stdin: one process, many prompts."""

    def __init__(self, harness: Harness) -> None:
        super().__init__(
            harness,
            *("-p", "--input-format", "stream-json", "--output-format", "stream-json"),
            "--verbose",
        )
        self._ids = 0

    def type(self, text: str) -> int:
        """Send one prompt without waiting; the mark its result is awaited from."""
        since = self.mark()
        self.send({"type": "user", "message": {"role": "user", "content": text}})
        return since

    def results(self, since: int = 0) -> int:
        with self._lock:
            return sum(m.get("type") == "result" for m in self.seen[since:])

    def finished(self, since: int, n: int = 1) -> None:
        """Wait for ``n`` turn results from ``since`` on."""
        wait_for("claude: the turns' results", lambda: self.results(since) >= n, TIMEOUT_S)

    def prompt(self, text: str) -> None:
        self.finished(self.type(text))

    def interrupt(self) -> None:
        self._ids += 1
        ident = f"sw-{self._ids}"
        self.send(
            {"type": "control_request", "request_id": ident, "request": {"subtype": "interrupt"}}
        )
        self.wait(
            "the interrupt's answer",
            lambda m: (
                m.get("type") == "control_response"
                and m.get("response", {}).get("request_id") == ident
            ),
        )


class CodexAppServer(JsonLinesChild):
    """``codex app-server`` on the mock model: one thread, and the forks made of it."""

    def __init__(self, harness: Harness, *, experimental: bool = False) -> None:
        """``experimental``: opt into the API's experimental methods and fields (a thread
        with ``historyMode: "legacy"``)."""
        super().__init__(harness, "app-server")
        self._ids = 0
        self.call(
            "initialize",
            clientInfo={"name": "sessionwatch-tests", "version": "0"},
            capabilities={"experimentalApi": experimental},
        )
        self.send({"jsonrpc": "2.0", "method": "initialized"})
        self.thread = str(self.call("thread/start", cwd=str(harness.project))["thread"]["id"])

    def turns_listed(self, thread: str) -> list[list[Any]]:
        """What the gateway's monitor asks for: the newest 100 turns, newest first, each as
        its id and its number of user messages."""
        page = self.call(
            "thread/turns/list", threadId=thread, limit=100, sortDirection="desc", itemsView="full"
        )
        return [
            [t["id"], sum(1 for i in t["items"] if i.get("type") == "userMessage")]
            for t in page["data"]
        ]

    def call(self, method: str, **params: Any) -> Any:
        self._ids += 1
        ident = self._ids
        self.send({"jsonrpc": "2.0", "id": ident, "method": method, "params": params})
        answer = self.wait(f"the answer to {method}", lambda m: m.get("id") == ident)
        assert "result" in answer, answer
        return answer["result"]

    def start_turn(self, text: str, thread: str | None = None) -> tuple[str, int]:
        """Start a turn; its id, and the mark its completion is awaited from."""
        since = self.mark()
        started = self.call("turn/start", threadId=thread or self.thread, input=text_input(text))
        return str(started["turn"]["id"]), since

    def completed(self, since: int) -> str:
        """The status of the next turn that completed (``completed``, ``interrupted``)."""
        done = self.wait(
            "a turn's completion", lambda m: m.get("method") == "turn/completed", since
        )
        return str(done["params"]["turn"]["status"])

    def turn(self, text: str, thread: str | None = None) -> None:
        _, since = self.start_turn(text, thread)
        assert "completed" == self.completed(since)


def text_input(text: str) -> list[Message]:
    return [{"type": "text", "text": text}]


class OpenCodeServer:
    """``opencode serve`` on a free loopback port, with the harness's mock provider."""

    MODEL: ClassVar[dict[str, str]] = {"providerID": "mock", "modelID": "mock-model"}

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        binary = MODULES / ".bin" / BINARIES[harness.kind]
        self.proc = subprocess.Popen(
            [str(binary), "serve", "--port", "0", "--hostname", "127.0.0.1"],
            cwd=harness.project,
            env=harness.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert self.proc.stdout is not None
        said: queue.Queue[bytes] = queue.Queue()
        stdout = self.proc.stdout
        threading.Thread(target=lambda: [said.put(line) for line in stdout], daemon=True).start()
        self.base = ""
        while not self.base:  # a server that hangs silently fails the test, never hangs it
            try:
                raw = said.get(timeout=TIMEOUT_S)
            except queue.Empty:
                raise AssertionError("opencode serve never said where it listens") from None
            found = re.search(rb"http://127\.0\.0\.1:\d+", raw)
            self.base = found.group(0).decode() if found else ""
        self.session = str(self.post("/session")["id"])

    def post(self, path: str, body: Message | None = None, timeout: float = 30) -> Any:
        status, answer = http(
            "POST", self.base + path, body if body is not None else {}, timeout=timeout
        )
        assert status < 300, (path, status, answer)
        return answer

    def get(self, path: str) -> Any:
        status, answer = http("GET", self.base + path)
        assert status < 300, (path, status, answer)
        return answer

    def message(self, text: str, session: str | None = None, wait: bool = True) -> None:
        """A prompt; with ``wait``, once its turn is done (answered at its end: a first
        turn beside three busy workers took over 30 s), else as soon as it is queued."""
        route = "message" if wait else "prompt_async"
        body = {"parts": [{"type": "text", "text": text}], "model": self.MODEL}
        self.post(f"/session/{session or self.session}/{route}", body, timeout=TIMEOUT_S)

    def idle(self) -> None:
        def quiet() -> bool:
            status, answer = http("GET", self.base + "/session/status")
            assert 200 == status, answer
            state = answer.get(self.session, {"type": "idle"})
            return bool(state.get("type") == "idle")

        wait_for("opencode: idle", quiet, TIMEOUT_S)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def why_no_tmux() -> str | None:
    return None if shutil.which("tmux") else "tmux is not installed (Debian's tmux package)"


class ClaudeTui:
    """The real ``claude`` TUI in a detached tmux session of its own (its own socket)."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        # what a person has already answered once: onboarding, the folder's trust, the key
        state = {
            "hasCompletedOnboarding": True,
            "theme": "dark",
            "customApiKeyResponses": {"approved": ["dummy"], "rejected": []},
            "projects": {
                str(harness.project): {
                    "hasTrustDialogAccepted": True,
                    "hasCompletedProjectOnboarding": True,
                }
            },
        }
        (harness.home / ".claude.json").write_text(json.dumps(state))
        self.socket = str(harness.work / "tmux.sock")
        env = [f"{k}={v}" for k, v in (harness.env() | {"TERM": "xterm-256color"}).items()]
        binary = MODULES / ".bin" / BINARIES[harness.kind]
        self._tmux(
            *("new-session", "-d", "-x", "120", "-y", "40", "-s", "claude"),
            *("-c", str(harness.project), "env", "-i", *env, str(binary)),
        )
        wait_for("claude: its prompt", lambda: "\u276f" in self.screen(), TIMEOUT_S)

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", self.socket, *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "claude")

    def busy(self) -> bool:
        return "esc to interrupt" in self.screen()

    def type(self, text: str) -> None:
        """Type ``text`` into the input box and press Enter once it shows there."""
        self._tmux("send-keys", "-t", "claude", "-l", text)
        wait_for("claude: the typed text", lambda: text in self.screen(), TIMEOUT_S)
        self._tmux("send-keys", "-t", "claude", "Enter")

    def idle(self) -> None:
        wait_for("claude: idle", lambda: not self.busy(), TIMEOUT_S)

    def interrupt(self) -> None:
        self._tmux("send-keys", "-t", "claude", "Escape")
        self.idle()

    def keys(self, *keys: str) -> None:
        """Press ``keys`` (tmux's names: ``Enter``, ``Down``...)."""
        self._tmux("send-keys", "-t", "claude", *keys)

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], timeout=30, check=False)
