"""The README's first command, as written, on a fresh machine: a virtual environment, the
package installed from its source (not editable), and ``serve`` on its embedded SQLite
default, in a home directory of its own; then the operator guide's ``sessionwatch open``,
whose link opens the status page.

The source is a copy of the repository's files (the command makes ``.venv`` where it runs,
and the repository's own must not be touched). The one thing set around the command is
``SESSIONWATCH_CONFIG``, naming a file that makes ``serve`` listen on a free port: its
default, 8765, may be taken on a developer's machine."""

from __future__ import annotations

import http.cookiejar
import os
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path

from tests.doc_blocks import doc_block
from tests.helpers import REPO, served_address


def _copy_of_the_source(dest: Path) -> None:
    """The repository's files as a fresh clone would have them (and those not yet added)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def test_the_readmes_first_command_installs_and_serves_on_a_fresh_machine(
    tmp_path: Path,
) -> None:
    first = doc_block("fresh-machine").splitlines()[0]
    assert doc_block("install-and-serve").strip() == first  # the operator guide's, the same
    source, home = tmp_path / "source", tmp_path / "home"
    source.mkdir()
    home.mkdir()
    _copy_of_the_source(source)
    listen = tmp_path / "listen.toml"
    listen.write_text('[api]\nlisten = "127.0.0.1:0"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SESSIONWATCH_", "VIRTUAL"))}
    env |= {"HOME": str(home), "SESSIONWATCH_CONFIG": str(listen)}
    with (tmp_path / "install.log").open("w") as log:
        shell = subprocess.Popen(
            ["bash", "-c", first],
            cwd=source,
            env=env,
            stdout=log,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    said: list[str] = []
    try:
        address = served_address(shell, said)
        state = home / ".local" / "state" / "sessionwatch"
        assert (state / "state.db").is_file()  # the embedded SQLite default
        assert 0o600 == (state / "token").stat().st_mode & 0o777
        env["PATH"] = f"{source / '.venv' / 'bin'}:{env['PATH']}"
        opened = subprocess.run(
            ["bash", "-e", "-c", doc_block("open")],
            env=env, capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        link = opened.stdout.strip()
        assert link.startswith(f"{address}/ui/login?ticket="), opened.stdout
        browser = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )
        with browser.open(link, timeout=30) as page:  # the login, then the page itself
            assert 200 == page.status and page.url == f"{address}/"
            assert b"Adopted sessions" in page.read()
        [serve] = _children(shell.pid) or [shell.pid]  # bash may exec the last command
        os.kill(serve, signal.SIGTERM)
        assert 0 == shell.wait(timeout=30), "".join(said)
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()
