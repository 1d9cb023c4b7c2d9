"""Earlier releases of sessionwatch, built from the project's own git history, and the state
databases they leave behind: what an upgrade starts from.

Each release runs from its own source (``git archive`` of its commit) with this
interpreter; the dependencies it had that today's release dropped (aiosqlite, APScheduler 3)
are installed beside it once. It then does what a user of that release did: a spawn edge, a
human event on the child, a Claude Code session adopted and watched, and a turn typed into
it and recorded by a tick, which leaves two notices pending for ``agent:main:main``.

Where the checkout has no history to build from (a shallow clone), the databases those
releases wrote are in ``tests/fixtures/releases/``, made by this module::

    python -m tests.releases            # writes tests/fixtures/releases/<commit>.db

Each fixture's ``.json`` names the commit that made it and the directory its link points
into; :func:`database` moves that link to the test's own directory, as a user moving the
files would.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers import REPO

# commit -> what it was. The first release; the last before the hooks wake (schema 3, no
# mark on the notices a sidecar opened); the hooks release; the last before issue 28.
RELEASES = {
    "865cf60": "the first release (schema 1, files made 0644)",
    "74efb9a": "the release before the hooks wake (schema 3)",
    "0eb389b": "the hooks release (schema 4)",
    "c1dd981": "the release before the upgrade work",
    "9700cad": "the release before what each session is doing (schema 6)",
}
OLD_DEPENDENCIES = ("aiosqlite>=0.20", "apscheduler>=3.10,<4")
FIXTURES = REPO / "tests" / "fixtures" / "releases"
MAIN = "agent:main:main"
CHILD = "agent:main:subagent:c1"
ADOPTED = "agent:main:demo"
FIRST = b'{"type":"user","uuid":"u1","cwd":"/tmp","message":{"role":"user","content":"Fix the billing tests"}}\n'  # noqa: E501
SECOND = b'{"type":"user","uuid":"u2","message":{"role":"user","content":"and run them again"}}\n'
THIRD = b'{"type":"user","uuid":"u3","message":{"role":"user","content":"now the invoices"}}\n'


def has_history(commit: str) -> bool:
    done = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def _cache() -> Path:
    path = Path(tempfile.gettempdir()) / f"sessionwatch-releases-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def build(commit: str) -> Path:
    """The release's source tree (kept in a cache a later run reuses)."""
    src = _cache() / commit
    if not (src / "monitor").is_dir():
        partial = src.with_name(commit + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", commit, "monitor", "adapters"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(partial)], input=archive, check=True)
        partial.rename(src)
    deps = _cache() / "deps"
    if not (deps / "aiosqlite").is_dir():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--target",
                str(deps),
                *OLD_DEPENDENCIES,
            ],
            check=True,
            capture_output=True,
        )
    return src


def release_deps() -> Path:
    """Where the dependencies an earlier release had, and today's dropped, are installed."""
    return _cache() / "deps"


def transcript(workdir: Path) -> Path:
    return workdir / "claude" / "proj" / "s1.jsonl"


def _run(src: Path, env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "monitor", *argv],
        env=env,
        cwd=src,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{src.name} {argv}: {done.stderr}"
    return done.stdout


def write_database(commit: str, workdir: Path) -> Path:
    """Run the release ``commit`` as its user did; the state database it leaves."""
    src = build(commit)
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "state.db"
    config = workdir / "release.toml"
    config.write_text(f'[roots]\nclaude = "{workdir / "claude"}"\n')
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workdir / "home"),
        "PYTHONPATH": f"{src}{os.pathsep}{_cache() / 'deps'}",
        "SESSIONWATCH_DB": str(db),
        "SESSIONWATCH_CONFIG": str(config),
    }
    probe = subprocess.run(
        [sys.executable, "-c", "import monitor; print(monitor.__file__)"],
        env=env,
        cwd=src,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert probe.startswith(str(src)), f"the release did not run from its source: {probe}"
    _run(src, env, "spawn", "--parent", MAIN, "--child", CHILD, "--run-id", "r1")
    _run(src, env, "record", "--session", CHILD, "--kind", "human_direct_message",
         "--actor", "human", "--payload", '{"channel": "telegram"}')  # fmt: skip
    path = transcript(workdir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(FIRST)
    _run(src, env, "adopt", "--kind", "claude", "--path", str(path), "--session-key", ADOPTED,
         "--session-id", "s1")  # fmt: skip
    _run(src, env, "watch", "--watcher", MAIN, "--target", ADOPTED)
    with path.open("ab") as f:
        f.write(SECOND)
    _run(src, env, "tick")
    pending = json.loads(_run(src, env, "notices", "--watcher", MAIN))["notices"]
    assert len(pending) == 2, pending
    return db


def database(commit: str, workdir: Path) -> Path:
    """The state database the release ``commit`` left, in ``workdir`` with its transcript:
    written by the release itself where the history has it, else its committed fixture."""
    if has_history(commit):
        return write_database(commit, workdir)
    made = json.loads((FIXTURES / f"{commit}.json").read_text())
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "state.db"
    shutil.copyfile(FIXTURES / f"{commit}.db", db)
    os.chmod(db, int(made["mode"], 8))
    path = transcript(workdir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(FIRST + SECOND)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(
            "UPDATE session_upstream_links SET upstream_ref_json ="
            " replace(upstream_ref_json, ?, ?)",
            (made["dir"], str(workdir)),
        )
    conn.close()
    return db


def main() -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for commit, what in RELEASES.items():
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp) / commit
            db = write_database(commit, workdir)
            conn = sqlite3.connect(db)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.close()
            shutil.copyfile(db, FIXTURES / f"{commit}.db")
            mode = f"{os.stat(db).st_mode & 0o777:04o}"
            made = {"commit": commit, "release": what, "dir": str(workdir), "mode": mode}
            (FIXTURES / f"{commit}.json").write_text(json.dumps(made, indent=1) + "\n")
            print(f"{commit}: {what}")


if __name__ == "__main__":
    main()
