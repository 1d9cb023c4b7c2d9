"""The curl examples of docs/gateway-integration.md really work against ``serve``."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.helpers import REPO, served_address

DOC = REPO / "docs" / "gateway-integration.md"


def blocks() -> list[str]:
    found = re.findall(r"```sh\n(.*?)```", DOC.read_text(), flags=re.S)
    # The stream example never ends by itself: tests/web/test_stream.py runs it.
    return [b for b in found if "export SW=" not in b and "/notices/stream" not in b]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_every_curl_example_succeeds(tmp_path: Path) -> None:
    config = tmp_path / "sessionwatch.toml"
    config.write_text(
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n'
        f'[roots]\nclaude = "{tmp_path}"\n[monitor]\ninitial_delay_s = 3600\n'
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "monitor",
            "--db",
            str(tmp_path / "state.db"),
            "--config",
            str(config),
            "serve",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        address = served_address(proc)
        env = {**os.environ, "SW": address, "TOKEN": (tmp_path / "token").read_text().strip()}
        assert len(blocks()) >= 8
        for block in blocks():
            out = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            assert 0 == out.returncode, (block, out.stderr)
            for line in out.stdout.replace("}{", "}\n{").splitlines():
                orjson.loads(line)  # every answer is JSON
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    assert 0 == proc.returncode


def test_the_repository_stands_on_its_own() -> None:
    """No file cites the design folder the project was started from: the behaviour is in
    docs/specification.md, in the project's own words."""
    cited = ("SPEC.md", "native-formats.md", "openclaw-implementation.md", "../shared")
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    found = []
    for name in tracked:
        if name == "tests/test_docs.py" or not name.endswith((".py", ".md", ".toml", ".sh")):
            continue
        text = (REPO / name).read_text(errors="replace")
        found += [f"{name}: {c}" for c in cited if c in text]
    assert [] == found


def test_the_api_reference_quotes_the_limits_the_server_enforces() -> None:
    """docs/api.md quotes the answer to an occurredAt past its limit, word for word."""
    import orjson

    from monitor.errors import BadInput
    from monitor.web import models

    event = {"sessionKey": "agent:main:x", "kind": "goal_changed", "actorType": "human"}
    try:
        models.decode(models.EventIn, orjson.dumps({**event, "occurredAt": 2**63 - 1}))
    except BadInput as exc:
        said = str(exc).replace("`", "")
    else:
        raise AssertionError("an occurredAt past the limit was accepted")
    text = (REPO / "docs" / "api.md").read_text()
    assert said in text.replace("`", ""), said


def test_the_api_reference_names_every_route_of_the_openapi_document() -> None:
    from monitor.web.openapi import document

    text = (REPO / "docs" / "api.md").read_text()
    for path, operations in document()["paths"].items():
        for method in operations:
            assert f"`{method.upper()} {path}" in text, f"{method.upper()} {path}"
