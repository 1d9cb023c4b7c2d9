"""Hypothesis against a live API: any method, path, query string, headers and body.

Never a 5xx (the database is healthy here), always the JSON error shape for a 4xx, and a
refused request changes no row. Requests are raw bytes over a socket, so headers and query
strings can hold anything a client could send.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor.serve.root import running
from tests.helpers import make_config

KEYS = ["agent:main:main", "agent:main:subagent:c1", "global", "agent:x", "", "%00", "a" * 300]
PATHS = [
    "/v1/sessions/{k}",
    "/v1/sessions/{k}/reset",
    "/v1/sessions/{k}/own-messages",
    "/v1/sessions/{k}/status",
    "/v1/sessions",
    "/v1/events",
    "/v1/spawns",
    "/v1/watches",
    "/v1/watchers/{k}/notices",
    "/v1/watchers/{k}/notices/drain",
    "/v1/links",
    "/v1/links/{k}",
    "/v1/catalog",
    "/healthz",
    "/nope",
]
QUERY_NAMES = ["changesSince", "agentId", "keys", "storePath", "kind", "x"]
QUERY_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.text(max_size=20),
    st.sampled_from(["", "0", "9223372036854775807", "9223372036854775808", "claude"]),
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    [
        "sessionKey",
        "kind",
        "actorType",
        "actorId",
        "runId",
        "occurredAt",
        "payload",
        "parent",
        "child",
        "watcher",
        "target",
        "text",
        "sessionId",
        "runActive",
        "catalogId",
        "path",
    ]
)


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()  # the standard library writes integers of any size


BODY = st.one_of(
    st.none(),
    st.binary(max_size=64),
    JSON.map(_dumps),
    st.dictionaries(FIELDS, JSON, max_size=6).map(_dumps),
)
TABLES = (
    "session_state_events",
    "session_state_heads",
    "session_watch_cursors",
    "session_upstream_links",
    "sessionwatch_sessions",
    "sessionwatch_own_messages",
)


class Live:
    """A sidecar serving on loopback from a thread of its own."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ready = threading.Event()
        self.stop: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.address = ""
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.stop = asyncio.Event()
        async with running(make_config(self.tmp), self.tmp / "state.db") as sidecar:
            assert sidecar is not None
            self.address = sidecar.addresses[0]
            self.ready.set()
            await self.stop.wait()

    def close(self) -> None:
        assert self.loop is not None and self.stop is not None
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    server = Live(tmp_path_factory.mktemp("fuzz"))
    server.thread.start()
    assert server.ready.wait(30)
    yield server
    server.close()


def rows(db: Path) -> dict[str, Any]:
    with sqlite3.connect(db) as conn:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in TABLES}


def send(address: str, raw: bytes) -> tuple[int, bytes]:
    host, port = address.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(raw)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    answer = b"".join(chunks)
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
    path=st.sampled_from(PATHS),
    key=st.sampled_from(KEYS) | st.text(max_size=12),
    query=st.dictionaries(st.sampled_from(QUERY_NAMES), QUERY_VALUES, max_size=3),
    auth=st.one_of(
        st.just("good"), st.binary(max_size=24), st.sampled_from([b"", b"Bearer", b"Basic x"])
    ),
    content_type=st.sampled_from([b"application/json", b"text/plain", b"", b"\xff\xfe"]),
    body=BODY,
)
def test_no_input_gets_a_5xx_and_a_refused_request_changes_nothing(
    live: Live,
    method: str,
    path: str,
    key: str,
    query: dict[str, str],
    auth: Any,
    content_type: bytes,
    body: bytes | None,
) -> None:
    token = (live.tmp / "token").read_text().strip().encode()
    target = path.replace("{k}", quote(key, safe=""))
    if query:
        target += "?" + "&".join(f"{quote(k)}={quote(v)}" for k, v in query.items())
    header = b"Bearer " + token if auth == "good" else auth
    raw = (
        f"{method} {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n".encode()
        + b"Authorization: "
        + header.replace(b"\r", b"").replace(b"\n", b"")
        + b"\r\n"
    )
    if body is not None:
        raw += b"Content-Type: " + content_type + b"\r\n"
        raw += f"Content-Length: {len(body)}\r\n".encode()
    raw += b"\r\n" + (body or b"")
    before = rows(live.tmp / "state.db")
    status, answer = send(live.address, raw)
    assert status < 500, (status, answer[:200])
    if status >= 400:
        error = orjson.loads(answer)["error"]
        assert isinstance(error["code"], str) and isinstance(error["message"], str)
        assert before == rows(live.tmp / "state.db")
