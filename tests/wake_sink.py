"""A hooks endpoint on loopback, on a thread, for the tests that run ``serve`` as a process
(the crash loop, tests/delivery/test_wake_processes.py). It keeps every call, and answers as
it is told: ``accept`` (200 ``queued`` after 0 to ``jitter`` s), ``down`` (503), or
``hold`` (no answer at all until :meth:`WakeSink.release`, so that a SIGKILL lands mid-call).

Each sidecar can be given its own base (``url_for("a")``): the first segment of the path
says which one called."""

from __future__ import annotations

import contextlib
import http.server
import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

HOOKS_TOKEN = "process-tests-hooks-token"
Mode = Literal["accept", "down", "hold"]


@dataclass(frozen=True)
class Call:
    at: float  # time.monotonic() when it arrived
    who: str  # the first path segment ("" for the bare /hooks base)
    text: str
    answer: int | None  # the status sent; None while held or when the caller was gone
    watcher: str = ""  # the sessionKey it named


class WakeSink:
    def __init__(self, jitter: float = 0.0, host: str = "127.0.0.1") -> None:
        self.mode: Mode = "accept"
        self.jitter = jitter
        self.calls: list[Call] = []
        self._lock = threading.Condition()
        self._released = threading.Event()
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Authorization") != f"Bearer {HOOKS_TOKEN}":
                    self.send_response(401)
                    self.end_headers()
                    return
                wake = json.loads(body)
                sink._answer(self, str(wake.get("text")), str(wake.get("sessionKey") or ""))

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.port = self.server.server_address[1]
        self.base = f"http://{host}:{self.port}"
        self.url = self.url_for("")
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url_for(self, who: str) -> str:
        """The hooks base for the sidecar named ``who``."""
        return f"{self.base}/{who}/hooks" if who else f"{self.base}/hooks"

    def _answer(self, handler: http.server.BaseHTTPRequestHandler, text: str, watcher: str) -> None:
        arrived, mode = time.monotonic(), self.mode
        who = handler.path.strip("/").split("/")[0] if handler.path.count("/") > 2 else ""
        if mode == "hold":
            self._keep(Call(arrived, who, text, None, watcher))
            self._released.wait(120)
            return  # no answer: the caller was killed, or its call times out
        if mode == "accept":
            time.sleep(random.uniform(0, self.jitter))
        status = 200 if mode == "accept" else 503
        answer = b'{"ok":true,"mode":"now","eventOutcome":"queued"}' if status == 200 else b"{}"
        with contextlib.suppress(OSError):  # the caller may be gone
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(answer)))
            handler.end_headers()
            handler.wfile.write(answer)
        self._keep(Call(arrived, who, text, status, watcher))

    def _keep(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)
            self._lock.notify_all()

    def release(self) -> None:
        """Held calls end unanswered; later calls are answered by ``mode``."""
        self._released.set()

    def wait(self, what: str, probe: Any, timeout: float = 90) -> list[Call]:
        """The calls so far, once ``probe(calls)`` holds; fails naming ``what``."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not probe(self.calls):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for {what}: {self.calls}")
                self._lock.wait(left)
            return list(self.calls)

    @property
    def texts(self) -> Counter[str]:
        """How often each text reached the endpoint, whatever it answered."""
        with self._lock:
            return Counter(c.text for c in self.calls)

    def close(self) -> None:
        self._released.set()
        self.server.shutdown()
        self.server.server_close()
