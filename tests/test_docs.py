"""The docs run as written: every shell block is taken by a test, and the curl examples of
docs/gateway-integration.md really work against ``serve``."""

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

from monitor.config import ApiConfig
from tests.doc_blocks import NAMED, doc_block, doc_blocks, sh_blocks
from tests.helpers import REPO, served_address


def test_every_shell_block_of_the_docs_is_run_by_a_test() -> None:
    """Each ``sh`` block of the README and docs/ is named exactly once in tests/doc_blocks.py,
    and each name is taken by a test; the README's test command is the one .ci/run runs."""
    blocks = sh_blocks()
    assert len(blocks) >= 18
    for block in blocks:
        names = [n for n, (doc, takes) in NAMED.items() if doc == block.doc and takes(block.text)]
        assert 1 == len(names), f"{block.doc}:{block.line} is named {names}: {block.text[:80]!r}"
    sources = "".join(p.read_text() for p in (REPO / "tests").rglob("test_*.py"))
    for name in NAMED:
        assert f'doc_block("{name}")' in sources or f'doc_blocks("{name}")' in sources, name
    fresh = doc_block("fresh-machine").splitlines()
    assert 2 == len(fresh) and fresh[1].endswith(".venv/bin/pytest -q")
    assert 'eval "$test_command"' in (REPO / ".ci" / "run").read_text()


def test_the_setup_that_differs_runs_as_written_on_a_fresh_account(tmp_path: Path) -> None:
    """The block "When your setup differs", in a fresh HOME: the configuration directory is
    made, the TOML saved where ``$SESSIONWATCH_CONFIG`` names it, the hook token written
    with mode 600 (``install`` failed on a fresh account: no directory). ``doctor`` and
    ``serve`` would call the gateway's port (which no test may reach) and run for ever: a
    ``sessionwatch`` first on PATH runs ``sessionwatch config`` for each, which reads the
    same file and refuses what they would refuse."""
    block = doc_block("setup-differs")
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
    """In a fresh HOME, the block that sets ``$SW`` and ``$TOKEN`` (the address replaced by
    the one ``serve`` took: it listens on a free port here), then every curl example."""
    home = tmp_path / "home"
    home.mkdir()
    config = tmp_path / "sessionwatch.toml"
    config.write_text(
        f'[api]\nlisten = "127.0.0.1:0"\n'
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
        env={**os.environ, "HOME": str(home)},
    )
    try:
        address = served_address(proc)
        setup = doc_block("address-and-token")
        default = f"http://{ApiConfig().listen}"  # where serve listens unless told
        assert f"export SW={default}\n" in setup
        setup = setup.replace(default, address)
        env = {**os.environ, "HOME": str(home)}
        token_file = ApiConfig().token_file.replace("~", str(home), 1)
        token = Path(token_file).read_text().strip()
        said = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", setup + 'echo "$SW $TOKEN"'],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert f"{address} {token}\n" == said.stdout
        assert len(doc_blocks("curl")) >= 8
        for block in doc_blocks("curl"):
            out = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", setup + block],
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


def test_the_architecture_diagram_names_every_module_of_the_runtime() -> None:
    diagram = (REPO / "docs" / "architecture.md").read_text().split("```")[1]
    modules = [*(REPO / "monitor").rglob("*.py"), *(REPO / "adapters").glob("*.py")]
    missing = [
        str(p.relative_to(REPO))
        for p in modules
        if p.stem != "__init__"
        and not re.search(rf"(?<![\w.]){re.escape(p.stem)}(\.py)?(?!\w)", diagram)
    ]
    assert not missing, f"docs/architecture.md's diagram leaves out {missing}"


def test_the_docs_say_what_is_true_not_how_the_work_was_organised() -> None:
    """No doc speaks of the work's own steps (a numbered issue or stop, "this stop"): the
    history is in git."""
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text()
        found = re.findall(
            r"\b(?:[Ii]ssue|[Ss]top|[Ss]print) \d+\b|\bthis stop\b|stop before", text
        )
        assert not found, f"{path.name}: {found}"


def test_the_changelog_s_newest_release_is_the_code_s_version_and_schema() -> None:
    """A release bumps the version, and a schema change bumps its minor number and names the
    schema in the changelog: the newest heading of CHANGELOG.md is the code's own."""
    import re

    from monitor import __version__
    from monitor.kernel.store.sqlite_schema import SCHEMA_VERSION

    text = (REPO / "CHANGELOG.md").read_text()
    newest = re.search(r"^## (\d+)\.(\d+)\.(\d+) \(schema (\d+)\)$", text, re.M)
    assert newest is not None, "CHANGELOG.md names no release"
    major, minor, patch, schema = newest.groups()
    assert f"{major}.{minor}.{patch}" == __version__
    assert int(schema) == SCHEMA_VERSION
    assert int(minor) >= SCHEMA_VERSION  # the minor moves with every schema change
