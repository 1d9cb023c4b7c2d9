"""The published API contract: the document in docs/, the one served, and schemathesis
against a live ``serve`` (no 5xx, every answer as documented, no row changed by a refused
request)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from monitor.web.openapi import document_bytes
from tests.helpers import REPO, Client, served_address

DOCS = REPO / "docs" / "openapi.json"
EXAMPLES = 15  # per route and generation mode: bounded, so CI stays fast
STREAM = "/v1/watchers/{key}/notices/stream"  # never ends; tests/web/test_stream.py covers it


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    tmp = tmp_path_factory.mktemp("contract")
    (tmp / "claude").mkdir()
    config = tmp / "sessionwatch.toml"
    config.write_text(
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp / "token"}"\n'
        f'[roots]\nclaude = "{tmp / "claude"}"\ncodex = "{tmp / "codex"}"\npi = "{tmp / "pi"}"\n'
        "[monitor]\ninitial_delay_s = 3600\ninterval_s = 3600\n"
    )
    db = tmp / "state.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "--db", str(db), "--config", str(config), "serve"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = served_address(proc)
        yield base, (tmp / "token").read_text().strip(), db
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_the_published_document_is_the_generated_one(live: tuple[str, str, Path]) -> None:
    base, _, _ = live
    served = requests.get(f"{base}/openapi.json", timeout=30)
    assert 200 == served.status_code
    assert document_bytes() == served.content
    assert document_bytes() == DOCS.read_bytes(), (
        "run: python -m monitor.web.openapi > docs/openapi.json"
    )


def _rows(db: Path) -> list[Any]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = [
            r[0]
            for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY 1")
        ]
        return [(t, sorted(map(repr, conn.execute(f'SELECT * FROM "{t}"')))) for t in tables]
    finally:
        conn.close()


def test_schemathesis_finds_no_server_error_no_undocumented_answer_no_partial_write(
    live: tuple[str, str, Path],
) -> None:
    base, token, db = live
    # from the served document, as a dict: loaded from its URL, schemathesis leaves out the
    # route that serves it, which must conform like any other
    schema = schemathesis.openapi.from_dict(requests.get(f"{base}/openapi.json", timeout=30).json())
    headers = {"Authorization": f"Bearer {token}"}
    session = requests.Session()
    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) >= 18
    called: dict[str, int] = {}

    def exercise(operation: Any, mode: GenerationMode) -> None:
        @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Any) -> None:
            before = _rows(db)
            response = case.call(base_url=base, session=session, headers=headers, timeout=30)
            if response.status_code >= 400:
                assert before == _rows(db), f"{case.method} {case.path} changed rows"
            case.validate_response(response, checks=checks)
            called[operation.label] = called.get(operation.label, 0) + 1

        try:
            run()
        except hypothesis.errors.Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE  # nothing to get wrong (no input)

    for operation in operations:
        if operation.path != STREAM:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                exercise(operation, mode)
    assert len(called) >= 16, called
    assert "GET /openapi.json" in called, sorted(called)


def test_every_schema_of_the_document_has_a_type_client_generators_keep() -> None:
    """``Literal[True]`` answers (``ok``, ``recorded``, ...) are ``const`` booleans, not bare
    enums a generator drops; the document's own route is an object; its version is the
    package's."""
    from importlib.metadata import version

    import orjson

    doc = orjson.loads(document_bytes())

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "enum" in node and any(isinstance(v, bool) for v in node["enum"]):
                raise AssertionError(f"an untyped boolean enum: {node}")
            if "const" in node and isinstance(node["const"], bool):
                assert "boolean" == node.get("type"), node
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    served = doc["paths"]["/openapi.json"]["get"]["responses"]["200"]["content"]
    assert {"application/json": {"schema": {"type": "object"}}} == served
    assert version("sessionwatch") == doc["info"]["version"]


async def test_a_generated_python_client_parses_every_documented_answer(
    tmp_path: Path, client: Client
) -> None:
    """``openapi-python-client`` generates a client from the document, and its models parse
    what the sidecar really answers, route by route (a typeless ``const`` was dropped by it
    before, and ``status`` could not be parsed)."""
    import importlib
    import shutil

    generator = Path(sys.executable).with_name("openapi-python-client")
    if not generator.exists():
        pytest.skip("openapi-python-client is not installed (pip install -e '.[test]')")
    spec = tmp_path / "openapi.json"
    spec.write_bytes(document_bytes())
    out = tmp_path / "swclient"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    proc = subprocess.run(
        [
            str(generator),
            "generate",
            "--path",
            str(spec),
            "--meta",
            "none",
            "--output-path",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert out.is_dir(), proc.stdout + proc.stderr
    assert "WARNING parsing" not in proc.stdout, proc.stdout  # no model or answer dropped
    sys.path.insert(0, str(tmp_path))
    try:
        models = importlib.import_module("swclient.models")
        key, main = "agent:main:subagent:gen", "agent:main:main"
        calls = [
            ("PUT", f"/v1/sessions/{key}", {"sessionId": "s1"}, "SessionInfo"),
            ("POST", "/v1/watches", {"watcher": main, "target": key}, "Watched"),
            (
                "POST",
                "/v1/events",
                {"sessionKey": key, "kind": "human_direct_message", "actorType": "human"},
                "EventRecorded",
            ),
            ("GET", f"/v1/sessions/{key}/status?changesSince=0", None, "Status"),
            ("GET", "/v1/sessions", None, "Sessions"),
            ("GET", f"/v1/watchers/{main}/notices", None, "Notices"),
            ("GET", "/v1/links", None, "Links"),
            ("GET", "/v1/catalog", None, "Catalog"),
            ("GET", "/v1/sessions/nope/status", None, "ErrorAnswer"),
            ("POST", f"/v1/sessions/{key}/reset", None, "Ok"),
        ]
        for method, path, body, name in calls:
            _, answer = await client.call(method, path, body)
            parsed = getattr(models, name).from_dict(answer)
            assert parsed.to_dict() == answer, (name, answer)
    finally:
        sys.path.remove(str(tmp_path))
        for module in [m for m in sys.modules if m == "swclient" or m.startswith("swclient.")]:
            del sys.modules[module]
        shutil.rmtree(out, ignore_errors=True)
