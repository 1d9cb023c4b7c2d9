"""The sixth hour of trying it as a new operator, as classes: every one-shot command opens a
database that cannot be opened the same way, saying why; every refusal by a command exits
non-zero with its reason on stderr; the JSON log keeps exceptions; ``node --help`` gives its
defaults. Real processes, real mounts (as root), real files."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.test_fifth_hour import fill

ROOT = os.geteuid() == 0
KEY = "agent:main:x"
# every one-shot command that opens the database, with what it is asked
ONE_SHOT = {
    "links": ["links"],
    "status": ["status", KEY],
    "notices": ["notices", "--watcher", "agent:main:main"],
    "catalog": ["catalog"],
    "record": ["record", "--session", KEY, "--kind", "goal_changed", "--actor", "human"],
    "watch": ["watch", "--watcher", "agent:main:main", "--target", KEY],
    "sessions": ["sessions"],
}


def _sw(
    env: dict[str, str], *argv: str, unprivileged: bool = False
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "monitor", *argv]
    if unprivileged and ROOT:
        cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *cmd]
    return subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _env(tmp: Path, db: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SESSIONWATCH_", "OPENCLAW_"))}
    (tmp / "home").mkdir(exist_ok=True)
    return {**keep, "HOME": str(tmp / "home"), "SESSIONWATCH_DB": str(db)}


def _a_database(db: Path) -> None:
    db.parent.mkdir(parents=True, exist_ok=True)
    done = _sw(_env(db.parent, db), *ONE_SHOT["record"])
    assert done.returncode == 0, done.stderr


@contextlib.contextmanager
def _mounted(kind: str, tmp: Path) -> Iterator[Path]:
    """A database whose opening fails for ``kind``'s reason."""
    if kind == "not a database":
        db = tmp / "state.db"
        db.write_bytes(b"this is not SQLite, " * 100)
        db.chmod(0o600)
        yield db
        return
    if kind == "permissions":
        _a_database(tmp / "state.db")
        (tmp / "state.db").chmod(0)
        yield tmp / "state.db"
        return
    if not ROOT:
        pytest.skip("a mount needs root")
    where = tmp / "mnt"
    where.mkdir()
    size = "2m" if kind == "read-only mount" else "512k"
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                           str(where)], capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        db = where / "state.db"
        _a_database(db)
        for side in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(f"{db}{side}").unlink()
        if kind == "read-only mount":
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        else:
            fill(where)
        yield db
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


CAUSES = {
    "read-only mount": "is on a read-only file system",
    "full disk": "is full",
    "permissions": "this user may not read and write it",
    "not a database": "is not a SQLite database",
}


@pytest.mark.parametrize("cause", sorted(CAUSES))
def test_every_one_shot_command_says_why_a_database_cannot_be_opened(
    tmp_path: Path, cause: str
) -> None:
    with _mounted(cause, tmp_path) as db:
        env = _env(tmp_path, db)
        for name, argv in ONE_SHOT.items():
            done = _sw(env, *argv, unprivileged=cause == "permissions")
            lines = done.stderr.strip().splitlines()
            if cause == "full disk" and done.returncode == 0:
                continue  # a read that needs no new page of the full disk: it answered
            assert done.returncode != 0, (name, done.stdout)
            assert len(lines) == 1 and "Traceback" not in done.stderr, (name, done.stderr)
            assert "unable to open database file" not in lines[0], (name, lines[0])
            assert CAUSES[cause] in lines[0], (name, lines[0])
            assert str(db) in lines[0], (name, lines[0])


def test_a_refused_watch_exits_1_with_its_reason_on_stderr(tmp_path: Path) -> None:
    env = _env(tmp_path, tmp_path / "state.db")
    done = _sw(env, "watch", "--watcher", KEY, "--target", KEY)
    assert done.returncode == 1
    assert json.loads(done.stdout)["watched"] is False  # the answer, for a program
    assert done.stderr == "sessionwatch: not watched: a session does not watch itself\n"
    done = _sw(env, "watch", "--watcher", "agent:main:main", "--target", KEY)
    assert done.returncode == 0 and not done.stderr


def test_every_refusal_by_a_command_exits_non_zero_with_its_reason(tmp_path: Path) -> None:
    """The refusals a command can give, each its own way in: a typo, a missing argument, a
    bad value, an unknown session, a watch refused, an adoption declined."""
    env = _env(tmp_path, tmp_path / "state.db")
    (tmp_path / "gone.jsonl").write_bytes(b"")
    refusals = [
        ["statsu", KEY],
        ["status"],
        ["record", "--session", KEY, "--kind", "no_such_kind", "--actor", "human"],
        ["watch", "--watcher", KEY, "--target", KEY],
        [
            "adopt",
            "--kind",
            "claude",
            "--path",
            str(tmp_path / "missing.jsonl"),
            "--session-key",
            KEY,
        ],
        ["adopt", "deadbeef", "--session-key", KEY],
        ["status", KEY, "--changes-since", "-1"],
        ["notices"],
    ]
    for argv in refusals:
        done = _sw(env, *argv)
        assert done.returncode != 0, (argv, done.stdout)
        assert done.stderr.startswith("sessionwatch") or done.stderr.startswith("usage"), (
            argv,
            done.stderr,
        )
        assert "Traceback" not in done.stderr, (argv, done.stderr)


def test_the_json_log_keeps_an_exception_s_type_and_traceback() -> None:
    code = (
        "import logging\n"
        "from monitor.cli.process_commands import _setup_logging\n"
        "_setup_logging('json')\n"
        "try:\n    1 / 0\nexcept ZeroDivisionError:\n"
        "    logging.getLogger('aiohttp.server').exception('error handling a request')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    (line,) = done.stderr.strip().splitlines()
    said = json.loads(line)
    assert said["message"] == "error handling a request"
    assert said["exc_type"] == "builtins.ZeroDivisionError"
    assert said["exc_message"] == "division by zero"
    assert said["exc"].startswith("Traceback") and "ZeroDivisionError" in said["exc"]
    assert said["level"] == "ERROR"


def test_node_help_gives_the_listen_default() -> None:
    done = subprocess.run([sys.executable, "-m", "monitor", "node", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert "default: 127.0.0.1:" in " ".join(done.stdout.split()), done.stdout


def test_doctor_names_watched_links_that_cannot_be_read(tmp_path: Path) -> None:
    """A watched transcript this user may not read: the tick says so in ``links``, and
    ``doctor`` no longer says all is well."""
    root = tmp_path / "claude" / "p"
    root.mkdir(parents=True)
    transcript = root / "s1.jsonl"
    transcript.write_bytes(
        b'{"type":"user","uuid":"u1","message":{"role":"user","content":"hi"}}\n'
    )
    env = _env(tmp_path, tmp_path / "state.db")
    config = tmp_path / "sw.toml"
    config.write_text(f'[roots]\nclaude = "{tmp_path / "claude"}"\n')
    env["SESSIONWATCH_CONFIG"] = str(config)
    adopt = ["adopt", "--kind", "claude", "--path", str(transcript), "--session-key", KEY]
    assert _sw(env, *adopt).returncode == 0
    assert _sw(env, "watch", "--watcher", "agent:main:main", "--target", KEY).returncode == 0
    healthy = _sw(env, "doctor", unprivileged=True)
    assert "watched link" not in healthy.stdout, healthy.stdout
    transcript.chmod(0)
    try:
        assert _sw(env, "tick", unprivileged=True).returncode == 0
        said = _sw(env, "doctor", unprivileged=True).stdout
    finally:
        transcript.chmod(0o600)
    (line,) = [x for x in said.splitlines() if "watched link" in x]
    assert line.startswith("PROBLEM") and f"{KEY} (Permission denied)" in line, said
