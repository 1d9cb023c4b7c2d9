"""A throwaway PostgreSQL cluster for the tests: ``initdb`` in a temporary directory, the
server on a free loopback port, trust authentication, and everything removed at the end.

PostgreSQL refuses to run as root, so under root the cluster runs as the ``postgres`` user
that Debian's package creates. ``$SESSIONWATCH_TEST_PG`` names a server to use instead (then
the tests that stop and start the server are skipped). Without either, the PostgreSQL half
of the suite is skipped, and says why.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

USER = "sessionwatch"
BIN_DIRS = ("/usr/lib/postgresql",)


def find_binary(name: str) -> str | None:
    """``initdb``/``pg_ctl`` on PATH, else in Debian's versioned directory."""
    found = shutil.which(name)
    if found:
        return found
    for base in BIN_DIRS:
        for version in sorted(Path(base).glob("*"), reverse=True):
            candidate = version / "bin" / name
            if candidate.exists():
                return str(candidate)
    return None


def _runuser() -> str:
    for candidate in (shutil.which("runuser"), "/usr/sbin/runuser", "/sbin/runuser"):
        if candidate and os.path.exists(candidate):
            return candidate
    return "runuser"


def why_unavailable() -> str | None:
    """None when a cluster can be started here; else the reason."""
    if not find_binary("initdb") or not find_binary("pg_ctl"):
        return "PostgreSQL is not installed (no initdb/pg_ctl); .ci/run installs it"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run the server as"
        if not os.path.exists(_runuser()):
            return "running as root and there is no runuser to start the server as postgres"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Cluster:
    """One server: :meth:`start`, :meth:`stop` (and start again), :meth:`destroy`."""

    def __init__(
        self, *, netns: str | None = None, listen: str = "127.0.0.1", options: str = ""
    ) -> None:
        """``netns``: a network namespace the server runs in, listening on ``listen`` there
        (tests/netns.py); ``options``: more server settings (``-c name=value``)."""
        self.options = options
        self.root = Path(tempfile.mkdtemp(prefix="sessionwatch-pg-"))
        self.data = self.root / "data"
        self.listen = listen
        self.port = _free_port() if netns is None else 5432  # a namespace of its own
        self.netns = netns
        self._as: list[str] = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self._as = [_runuser(), "-u", "postgres", "--"]
        self._run(
            find_binary("initdb") or "initdb",
            "-D",
            str(self.data),
            "-U",
            USER,
            "--auth=trust",
            "--no-locale",
            "-E",
            "UTF8",
        )
        if netns:  # the hosts' addresses inside the test's namespaces
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write("host all all 10.0.0.0/8 trust\n")

    def _run(self, *argv: str) -> None:
        inside = ["ip", "netns", "exec", self.netns] if self.netns else []
        subprocess.run(
            [*inside, *self._as, *argv], check=True, capture_output=True, timeout=120, cwd=self.root
        )

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@{self.listen}:{self.port}/postgres"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses={self.listen} -c fsync=off"
        options += f" {self.options}" if self.options else ""
        self._run(
            find_binary("pg_ctl") or "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )
        if self.netns:  # pg_ctl -w waited for it to accept connections
            return
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        self._run(find_binary("pg_ctl") or "pg_ctl", "-D", str(self.data), "-m", mode, "stop")

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def fresh_database(admin_url: str, name: str) -> str:
    """A new, empty database on the server; its URL."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + f"/{name}"
