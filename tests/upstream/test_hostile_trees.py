"""Every walk of a root survives any tree a real disk holds. The trees are generated: symlink
loops, links that lead nowhere or to ``/``, folders and files of mode 000, FIFOs, sockets and
device nodes, names with bytes that are not UTF-8 or with a newline, nesting near and past
``PATH_MAX``, and a file that vanishes or turns into a folder while the walks run. The walks
run where mode 000 keeps them out (:mod:`tests.unprivileged`, even as root).

What must hold, for every tree: no walk raises; every session that can be read is listed
(none dropped for another's sake); everything that looks like a session and cannot be read
is listed as unreadable, with its reason, once; and what is listed can be sent as JSON. The
whole sidecar (the CLI, the API, the tick, ``doctor``) is then run over one tree that holds
every kind at once (tests/upstream/test_hostile_trees.py::test_every_entry_point...)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters import claude, codex, pi
from adapters.catalog import shown_path
from adapters.claude_node import find_thread
from adapters.jsonl_catalog import NOT_UTF8, scan_files
from adapters.jsonl_node import find_file
from monitor.errors import NotFound
from tests.unprivileged import unprivileged

LINE = b'{"type":"user","uuid":"u1","cwd":"/srv/x","message":{"role":"user","content":"hi"}}\n'
PATH_MAX = os.pathconf("/", "PC_PATH_MAX")
ROOT = os.geteuid() == 0  # a device node takes root to make


@dataclass
class Tree:
    """A tree under ``root``, and what a walk of it must list."""

    root: bytes
    sessions: set[str] = field(default_factory=set)  # paths listed as sessions
    unreadable: set[str] = field(default_factory=set)  # paths listed as unreadable (shown)
    n: int = 0

    def name(self, stem: bytes = b"s", suffix: bytes = b".jsonl") -> bytes:
        self.n += 1
        return stem + str(self.n).encode() + suffix

    def session(self, folder: bytes, name: bytes | None = None) -> None:
        path = os.path.join(folder, name or self.name())
        Path(os.fsdecode(path)).write_bytes(LINE)
        self.sessions.add(os.fsdecode(path))

    def bad(self, path: bytes) -> None:
        self.unreadable.add(shown_path(os.fsdecode(path)))


def _file_000(t: Tree, folder: bytes, listed: bool) -> None:
    path = os.path.join(folder, t.name(b"locked"))
    Path(os.fsdecode(path)).write_bytes(LINE)
    os.chmod(path, 0)
    if listed:
        t.bad(path)


def _fifo(t: Tree, folder: bytes, listed: bool) -> None:
    path = os.path.join(folder, t.name(b"fifo"))
    os.mkfifo(path)
    if listed:
        t.bad(path)


def _socket(t: Tree, folder: bytes, listed: bool) -> None:
    path = os.path.join(folder, t.name(b"sock"))
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.bind(path)
        except OSError:  # a path too long for sockaddr_un: a FIFO stands in
            os.mkfifo(path)
    if listed:
        t.bad(path)


def _device(t: Tree, folder: bytes, listed: bool) -> None:
    path = os.path.join(folder, t.name(b"null"))
    if ROOT:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    else:
        os.mkfifo(path)
    if listed:
        t.bad(path)


def _dangling(t: Tree, folder: bytes, listed: bool) -> None:
    path = os.path.join(folder, t.name(b"gone"))
    os.symlink(b"nowhere", path)
    if listed:
        t.bad(path)


def _self_loop(t: Tree, folder: bytes, listed: bool) -> None:
    name = t.name(b"loop")
    os.symlink(name, os.path.join(folder, name))
    if listed:
        t.bad(os.path.join(folder, name))


def _loop_pair(t: Tree, folder: bytes, listed: bool) -> None:
    """``a -> b -> a``, named as folders are: never entered, never listed."""
    a, b = t.name(b"loop", b""), t.name(b"loop", b"")
    os.symlink(b, os.path.join(folder, a))
    os.symlink(a, os.path.join(folder, b))


def _link_up(t: Tree, folder: bytes, listed: bool) -> None:
    """Links to the folder itself, to the root and to ``/``: never entered."""
    os.symlink(b".", os.path.join(folder, t.name(b"here", b"")))
    os.symlink(t.root, os.path.join(folder, t.name(b"root", b"")))
    os.symlink(b"/", os.path.join(folder, t.name(b"slash", b"")))


def _linked_folder_named_as_session(t: Tree, folder: bytes, listed: bool) -> None:
    os.symlink(b"/", os.path.join(folder, t.name(b"slash")))


def _not_utf8_file(t: Tree, folder: bytes, listed: bool) -> None:
    path = os.path.join(folder, t.name(b"bad\xff"))
    Path(os.fsdecode(path)).write_bytes(LINE)
    if listed:
        t.bad(path)


def _newline(t: Tree, folder: bytes, listed: bool) -> None:
    name = t.name(b"new\nline")
    if listed:
        t.session(folder, name)
    else:
        Path(os.fsdecode(os.path.join(folder, name))).write_bytes(LINE)


def _session(t: Tree, folder: bytes, listed: bool) -> None:
    if listed:
        t.session(folder)
    else:
        Path(os.fsdecode(os.path.join(folder, t.name()))).write_bytes(LINE)


def _deep(t: Tree, folder: bytes, listed: bool) -> None:
    """A chain of folders on past ``PATH_MAX`` (made a step at a time from inside), a session
    in each: listed while its path can be named, unreadable once it cannot, and below the
    first folder too long to name, nothing (that folder is listed as unreadable)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    path = folder
    try:
        while len(path) < PATH_MAX:
            os.mkdir(b"d" * 200, dir_fd=fd)
            inner = os.open(b"d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd, path = inner, os.path.join(path, b"d" * 200)
            _write_at(fd, b"s.jsonl")
            if not listed:
                continue
            if len(path) >= PATH_MAX:
                t.bad(path)
            elif len(os.path.join(path, b"s.jsonl")) >= PATH_MAX:
                t.bad(os.path.join(path, b"s.jsonl"))
            else:
                t.sessions.add(os.fsdecode(os.path.join(path, b"s.jsonl")))
    finally:
        os.close(fd)


def _write_at(dir_fd: int, name: bytes) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=dir_fd)
    try:
        os.write(fd, LINE)
    finally:
        os.close(fd)


ITEMS: dict[str, Callable[[Tree, bytes, bool], None]] = {
    "session": _session,
    "file 000": _file_000,
    "fifo": _fifo,
    "socket": _socket,
    "device": _device,
    "dangling link": _dangling,
    "self loop": _self_loop,
    "loop pair": _loop_pair,
    "links up": _link_up,
    "linked folder named as a session": _linked_folder_named_as_session,
    "name not UTF-8": _not_utf8_file,
    "name with a newline": _newline,
}
FOLDERS = ("plain", "mode 000", "name not UTF-8", "name with a newline")


@dataclass
class Shape:
    folders: list[tuple[int, str]]  # (parent index, kind); index 0 is the root
    items: list[tuple[int, str]]  # (folder index, item kind)
    deep: bool


def shapes() -> st.SearchStrategy[Shape]:
    @st.composite
    def build(draw: st.DrawFn) -> Shape:
        n = draw(st.integers(0, 5))
        folders = [(draw(st.integers(0, i)), draw(st.sampled_from(FOLDERS))) for i in range(n)]
        items = draw(
            st.lists(st.tuples(st.integers(0, n), st.sampled_from(sorted(ITEMS))), max_size=12)
        )
        return Shape(folders, items, draw(st.booleans()))

    return build()


def make(shape: Shape, under: bytes) -> Tree:
    tree = Tree(under)
    paths, listed = [under], [True]
    for i, (parent, kind) in enumerate(shape.folders):
        name = {"name not UTF-8": b"f\xfe%d", "name with a newline": b"f\n%d"}.get(kind, b"f%d")
        path = os.path.join(paths[parent], name % i)
        os.mkdir(path)
        visible = listed[parent] and kind in ("plain", "name with a newline")
        if listed[parent] and not visible:
            tree.bad(path)
        paths.append(path)
        listed.append(visible)
    tree.sessions.clear()
    for folder, kind in shape.items:
        ITEMS[kind](tree, paths[folder], listed[folder])
    if shape.deep:
        _deep(tree, under, True)
    for (_, kind), path in zip(shape.folders, paths[1:], strict=True):
        if kind == "mode 000":
            os.chmod(path, 0)
    return tree


@contextmanager
def scratch() -> Iterator[bytes]:
    """A fresh folder for one tree; emptied after, whatever the tree made unreadable."""
    where = tempfile.mkdtemp(prefix="sw-tree-")
    try:
        yield os.fsencode(where)
    finally:
        # coreutils work from descriptors: past PATH_MAX too, and links are not followed
        subprocess.run(["chmod", "-R", "u+rwX", where], check=False, capture_output=True)
        subprocess.run(["rm", "-rf", where], check=True)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(shape=shapes())
def test_a_walk_of_any_tree_lists_every_session_and_each_unreadable_once(shape: Shape) -> None:
    with scratch() as under:
        root = os.path.join(under, b"claude")
        os.mkdir(root)
        tree = make(shape, root)
        found = unprivileged(lambda: scan_files(claude.FORMAT, os.fsdecode(root)))
        orjson.dumps(found.as_json())  # JSON can carry all of it
        paths = [e["path"] for e in found.errors]
        assert len(paths) == len(set(paths)), "an unreadable source listed twice"
        assert set(paths) == tree.unreadable
        assert {e.path for e in found.entries} == {os.path.realpath(p) for p in tree.sessions}
        for e in found.errors:
            assert e["reason"] and "\n" not in e["reason"]
        # the other formats' walks over the same tree raise nothing and say it as JSON
        for fmt in (codex.FORMAT, pi.FORMAT):
            orjson.dumps(unprivileged(lambda f=fmt: scan_files(f, os.fsdecode(root))).as_json())
        # a node's reads find each session by its thread, and a missing one is a 404
        for path in tree.sessions:
            thread = os.path.basename(path).removesuffix(".jsonl")
            assert unprivileged(
                lambda t=thread: find_file(claude.FORMAT, os.fsdecode(root), t, None)
            )
        with pytest.raises(NotFound):
            unprivileged(lambda: find_file(claude.FORMAT, os.fsdecode(root), "absent", None))
        with pytest.raises(NotFound):
            unprivileged(lambda: find_thread(Path(os.fsdecode(root)), "absent"))


def test_a_file_that_vanishes_or_turns_into_a_folder_while_walked(tmp_path: Path) -> None:
    """A session that comes and goes, and turns into a folder and back, while its folder is
    walked over and over: no walk raises, and the steady session is always listed."""
    root = tmp_path / "claude" / "p"
    root.mkdir(parents=True)
    (root / "steady.jsonl").write_bytes(LINE)
    flipping = root / "flip.jsonl"
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            flipping.write_bytes(LINE * 50)
            flipping.unlink()
            flipping.mkdir()
            (flipping / "inner.jsonl").write_bytes(LINE)
            shutil.rmtree(flipping)

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        for _ in range(300):
            found = scan_files(claude.FORMAT, str(tmp_path / "claude"))
            assert str(root / "steady.jsonl") in {e.path for e in found.entries}
            orjson.dumps(found.as_json())
    finally:
        stop.set()
        flipper.join()


def test_a_folder_named_not_in_utf8_is_said_as_such() -> None:
    with scratch() as under:
        folder = os.path.join(under, b"f\xff")
        os.mkdir(folder)
        Path(os.fsdecode(os.path.join(folder, b"s.jsonl"))).write_bytes(LINE)
        found = scan_files(claude.FORMAT, os.fsdecode(under))
        assert found.errors == [{"path": shown_path(os.fsdecode(folder)), "reason": NOT_UTF8}]
        assert "\\xff" in found.errors[0]["path"]


if sys.platform != "linux":  # pragma: no cover - the suite runs on Linux
    pytestmark = pytest.mark.skip("Linux file kinds")


# -- the whole sidecar over one tree of every kind -----------------------------------------

REPO = Path(__file__).resolve().parents[2]


def _as_unprivileged(argv: list[str]) -> list[str]:
    """``argv`` where mode 000 holds: as root, without the capabilities that override it."""
    if not ROOT:
        return argv
    if shutil.which("setpriv") is None:  # pragma: no cover - util-linux is essential
        pytest.skip("setpriv (util-linux) is needed to drop root's file capabilities")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *argv]


def _every_kind(under: bytes) -> Tree:
    shape = Shape(
        folders=[(0, kind) for kind in FOLDERS] + [(1, "plain")],
        items=[(0, kind) for kind in sorted(ITEMS)] + [(5, "session"), (2, "session")],
        deep=True,
    )
    return make(shape, under)


def test_every_entry_point_over_a_tree_of_every_kind(tmp_path: Path) -> None:
    """The CLI's catalog (table and JSON), the API's, ``doctor`` and the tick, each run as a
    real process over one tree that holds every kind at once: none answers 500 or prints a
    traceback, each lists every session and names each unreadable source once."""
    with scratch() as under:
        root = os.path.join(under, b"claude")
        os.mkdir(root)
        tree = _every_kind(root)
        home = tmp_path / "home"
        home.mkdir()
        config = tmp_path / "sw.toml"
        config.write_text(
            f'[roots]\nclaude = "{os.fsdecode(root)}"\n[api]\nlisten = "127.0.0.1:0"\n'
            f'token_file = "{tmp_path}/token"\n'
        )
        env = {
            **{
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("SESSIONWATCH_", "OPENCLAW_"))
            },
            "HOME": str(home),
            "SESSIONWATCH_CONFIG": str(config),
            "SESSIONWATCH_DB": str(tmp_path / "state.db"),
        }

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            argv = _as_unprivileged([sys.executable, "-m", "monitor", *args])
            return subprocess.run(
                argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
            )

        expected_sessions = {os.path.realpath(p) for p in tree.sessions}
        listed = cli("catalog", "--kind", "claude", "--json")
        assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
        answer = orjson.loads(listed.stdout)
        assert {e["path"] for e in answer["errors"]} == tree.unreadable
        assert len(answer["errors"]) == len(tree.unreadable)
        assert {s["path"] for s in answer["sessions"]} == expected_sessions
        table = cli("catalog")
        assert table.returncode == 0 and not table.stderr, table.stderr
        assert f"{len(tree.unreadable)} sources could not be read" in table.stdout
        doctor = cli("doctor")
        assert "Traceback" not in doctor.stderr + doctor.stdout
        said = [line for line in doctor.stdout.splitlines() if "claude root" in line]
        assert len(said) == 1 and said[0].startswith("PROBLEM"), doctor.stdout
        assert f"{len(tree.unreadable)} sources cannot be read" in said[0]

        proc = subprocess.Popen(
            _as_unprivileged([sys.executable, "-m", "monitor", "serve"]),
            cwd=REPO,
            env=env,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        try:
            from tests.helpers import served_address

            address = served_address(proc)
            token = (tmp_path / "token").read_text().strip()
            import urllib.request

            request = urllib.request.Request(
                f"{address}/v1/catalog?kind=claude", headers={"Authorization": f"Bearer {token}"}
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                assert response.status == 200
                served = orjson.loads(response.read())
            assert {e["path"] for e in served["errors"]} == tree.unreadable
            assert {s["path"] for s in served["sessions"]} == expected_sessions
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        assert "Traceback" not in err, err


# -- an adopted file that turns into anything a disk holds ---------------------------------


def _turn_into(kind: str, path: Path) -> None:
    path.unlink()
    if kind == "a symlink loop":
        path.symlink_to(path.name)
    elif kind == "a link that leads nowhere":
        path.symlink_to("nowhere")
    elif kind == "a folder":
        path.mkdir()
    elif kind == "a FIFO":
        os.mkfifo(path)
    elif kind == "a socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))
    elif kind == "a link to /":
        path.symlink_to("/")


TURNS = {
    "a symlink loop": ("inconclusive", "Too many levels of symbolic links"),
    "a link that leads nowhere": ("missing", None),
    "a folder": ("inconclusive", "not a regular file (a directory)"),
    "a FIFO": ("inconclusive", "not a regular file (a FIFO)"),
    "a socket": ("inconclusive", "not a regular file (a socket)"),
    "a link to /": ("inconclusive", "outside the configured roots"),
    "nothing": ("missing", None),
}


@pytest.mark.parametrize("kind", sorted(TURNS))
async def test_an_adopted_file_that_turns_into_anything_is_said_and_stalls_no_other(
    kind: str, kernel: Any, roots: Any
) -> None:
    from monitor.config import Config
    from monitor.upstream import UpstreamMonitor
    from monitor.web import wire

    monitor = UpstreamMonitor.from_config(kernel, Config(roots=roots))
    a, b = Path(roots.claude) / "a.jsonl", Path(roots.claude) / "b.jsonl"
    for path, key in ((a, "agent:main:a"), (b, "agent:main:b")):
        path.write_bytes(LINE)
        await monitor.adoption.adopt(
            kind="claude", path=str(path), session_key=key, session_id=path.stem
        )
        assert await kernel.watch(watcher="agent:main:main", target=key)
    if kind != "nothing":
        _turn_into(kind, a)
    else:
        a.unlink()
    with b.open("ab") as f:
        f.write(LINE.replace(b'"u1"', b'"u2"'))
    results = {r.session_key: r for r in await asyncio.wait_for(monitor.ticker.tick(), 30)}
    outcome, reason = TURNS[kind]
    assert results["agent:main:a"].outcome == outcome
    if reason:
        assert results["agent:main:a"].reason == reason
    assert (results["agent:main:b"].outcome, results["agent:main:b"].turns) == ("activity", 1)
    listed = {x["sessionKey"]: x for x in wire.links(await monitor.links())}
    assert listed["agent:main:a"]["status"]["outcome"] == outcome


# -- a root that is anything ---------------------------------------------------------------

ROOT_KINDS = {  # the reason each format's catalog gives, by what its root is
    "a symlink loop": {"claude": "Too many levels of symbolic links"},
    "a FIFO": {"claude": "Not a directory", "opencode": "not a regular file (a FIFO)"},
    "a folder": {"claude": "", "opencode": "not a regular file (a directory)"},
    "a regular file": {"claude": "Not a directory", "opencode": "no such table: session"},
    "mode 000": {"claude": "Permission denied"},
}


def _root_as(kind: str, path: Path, *, folder: bool) -> None:
    if kind == "a symlink loop":
        path.symlink_to(path.name)
    elif kind == "a FIFO":
        os.mkfifo(path)
    elif kind == "a folder":
        path.mkdir()
    elif kind == "a regular file":
        path.write_bytes(b"")
    elif kind == "mode 000":
        if folder:
            path.mkdir()
            (path / "p").mkdir()
            (path / "p" / "s.jsonl").write_bytes(LINE)
        else:
            path.write_bytes(b"")
        path.chmod(0)


@pytest.mark.parametrize("kind", sorted(ROOT_KINDS))
@pytest.mark.parametrize("fmt", ["claude", "opencode"])
def test_a_root_that_is_anything_is_listed_as_unreadable_with_its_reason(
    tmp_path: Path, fmt: str, kind: str
) -> None:
    """A folder root (Claude's) that is not a folder, or a database root (OpenCode's) that
    is not a file: the catalog lists the root as unreadable, with the system's reason (not
    SQLite's "unable to open database file"), and no more."""
    from adapters.opencode import scan_sessions

    root = tmp_path / "root"
    _root_as(kind, root, folder=fmt == "claude")
    reasons = ROOT_KINDS[kind]
    expected = reasons.get(fmt, reasons.get("claude", ""))
    try:
        if fmt == "claude":
            found = unprivileged(lambda: scan_files(claude.FORMAT, str(root)))
        else:
            found = unprivileged(lambda: scan_sessions(str(root)))
    finally:
        if kind == "mode 000":
            root.chmod(0o700)
    assert found.entries == []
    assert found.errors == ([{"path": str(root), "reason": expected}] if expected else [])


def test_file_watching_takes_adopted_files_below_folders_it_may_not_search(
    tmp_path: Path,
) -> None:
    """The folders file watching watches: one it may not search (mode 000 above an adopted
    file), one gone, one a link in a loop: none raises, and the readable one is kept."""
    from monitor.serve.file_watch import _dirs_of

    ok = tmp_path / "ok"
    ok.mkdir()
    locked = tmp_path / "locked"
    (locked / "inner").mkdir(parents=True)
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    files = {
        str(ok / "a.jsonl"): {"agent:main:a"},
        str(locked / "inner" / "b.jsonl"): {"agent:main:b"},
        str(tmp_path / "gone" / "c.jsonl"): {"agent:main:c"},
        str(loop / "d.jsonl"): {"agent:main:d"},
    }
    locked.chmod(0)
    try:
        assert unprivileged(lambda: _dirs_of(files)) == [str(ok)]
    finally:
        locked.chmod(0o700)
