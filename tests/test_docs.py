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
    """The curl examples (the stream's never ends by itself: tests/web/test_stream.py runs
    it; the setup block is run below)."""
    found = re.findall(r"```sh\n(.*?)```", DOC.read_text(), flags=re.S)
    return [b for b in found if b.startswith("curl") and "/notices/stream" not in b]


def test_the_setup_that_differs_runs_as_written_on_a_fresh_account(tmp_path: Path) -> None:
    """The block "When your setup differs", in a fresh HOME: the configuration directory is
    made, the TOML saved where ``$SESSIONWATCH_CONFIG`` names it, the hook token written
    with mode 600 (``install`` failed on a fresh account: no directory). ``doctor`` and
    ``serve`` would call the gateway's port (which no test may reach) and run for ever: a
    ``sessionwatch`` first on PATH runs ``sessionwatch config`` for each, which reads the
    same file and refuses what they would refuse."""
    text = DOC.read_text()
    block = next(
        b for b in re.findall(r"```sh\n(.*?)```", text, flags=re.S) if "SESSIONWATCH_CONFIG" in b
    )
    home, shims = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    shims.mkdir()
    called = tmp_path / "called"
    shim = shims / "sessionwatch"
    shim.write_text(
        "#!/bin/sh\n"
        f'echo "$1" >> "{called}"\n'
        f'case "$1" in doctor|serve) set -- config ;; esac\n'
        f'exec "{sys.executable}" -m monitor "$@"\n'
    )
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONWATCH_")}
    env |= {"HOME": str(home), "PATH": f"{shims}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        ["bash", "-e", "-c", block], capture_output=True, text=True, env=env, timeout=60
    )
    assert 0 == done.returncode, done.stderr + done.stdout
    token = home / ".config" / "sessionwatch" / "hooks-token"
    assert 0o600 == token.stat().st_mode & 0o777
    assert "<the same hook token>\n" == token.read_text()
    assert ["doctor", "serve"] == called.read_text().split()
    assert str(home / ".openclaw" / "state" / "openclaw.sqlite") in done.stdout  # expanded
    assert "http://127.0.0.1:18789/hooks" in done.stdout


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
