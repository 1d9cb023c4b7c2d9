"""The layer rules of docs/architecture.md, checked on the import graph (every import,
including those inside functions).

From the bottom: ``adapters`` import nothing of ``monitor`` but its errors, records and lazy
logger; the kernel imports no adapter, no delivery, no upstream monitor and no web code;
delivery imports no adapter, no upstream monitor and no web code; the upstream monitor
imports no web code; nothing below the service imports the service or the CLI.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO

ROOT = REPO
TOP = ("monitor.serve", "monitor.cli", "monitor.__main__")
# The modules at the top of monitor/ that sit under everything (errors, config...), and the
# three outside them: two serve the CLI and the service only (doctor, ui_open), one the
# tests of whoever tests against sessionwatch (testing).
SHARED = (
    *("errors", "config", "clock", "paths", "records", "metrics", "lazylog", "pulse"),
    *("retry", "private", "inotify"),
)
FORBIDDEN = {
    "monitor/openclaw": (
        *("adapters", "monitor.kernel", "monitor.delivery", "monitor.upstream", "monitor.web"),
        *TOP,
    ),
    "monitor/kernel": ("adapters", "monitor.delivery", "monitor.upstream", "monitor.web", *TOP),
    "monitor/delivery": ("adapters", "monitor.upstream", "monitor.web", *TOP),
    "monitor/upstream": ("monitor.web", *TOP),
    "monitor/web": TOP,
    "monitor/serve": ("monitor.cli", "monitor.__main__"),
    "monitor/cli": ("monitor.__main__",),  # the top: it runs the service
}
# The two top-level modules outside the shared ones: what they may not import.
TOP_LEVEL = {
    "doctor": ("monitor.serve", "monitor.cli", "monitor.__main__", "monitor.web"),
    "ui_open": ("monitor.serve", "monitor.cli", "monitor.__main__", "monitor.web"),
    # for a gateway's tests: the hooks client's transport, and nothing of the service
    "testing": ("monitor.serve", "monitor.cli", "monitor.__main__", "monitor.web"),
    "__main__": (),
    "__init__": ("monitor.",),
}


def _imports(path: Path, *, at_run_time: bool = False, expand: bool = False) -> set[str]:
    """Every module ``path`` imports; with ``at_run_time``, only those imported when it
    runs (not those under ``if TYPE_CHECKING:``); with either, a ``from PACKAGE import
    MODULE`` naming ``PACKAGE.MODULE`` too."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    if at_run_time:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped |= {id(n) for part in node.body for n in ast.walk(part)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not expand:
                found.add(node.module)
            if at_run_time:
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif expand:  # a submodule named is imported; a name, its module
                for alias in node.names:
                    sub = ROOT.joinpath(*f"{node.module}.{alias.name}".split("."))
                    whole = sub.with_suffix(".py").exists() or (sub / "__init__.py").exists()
                    found.add(f"{node.module}.{alias.name}" if whole else node.module)
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_cycle_anywhere() -> None:
    """Among our modules, counting the imports inside functions and those for the type
    checker too (a reader sees those as well): a new format, say, is imported by nothing of
    the plumbing, so nothing imports in a circle."""
    paths = {
        _module_name(p): p for pkg in ("monitor", "adapters") for p in (ROOT / pkg).rglob("*.py")
    }
    graph = {
        name: {m for m in _imports(path, expand=True) if m in paths and m != name}
        for name, path in paths.items()
    }
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                cycle = [*trail[trail.index(dep) :], dep] if dep in trail else [name, dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, [*trail, dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


# What adapters may import of monitor: the errors, and the two shared modules that import
# nothing at all (a one-shot command's records, its lazy logger).
ADAPTERS_MAY_IMPORT = frozenset({"monitor.errors", "monitor.records", "monitor.lazylog"})


def test_adapters_import_only_the_errors_and_leaf_helpers_of_monitor() -> None:
    for path in sorted((ROOT / "adapters").rglob("*.py")):
        wrong = {
            m for m in _imports(path) if m.startswith("monitor") and m not in ADAPTERS_MAY_IMPORT
        }
        assert not wrong, f"{path.name} imports {sorted(wrong)}"
    for name in ADAPTERS_MAY_IMPORT - {"monitor.errors"}:  # they stay leaves
        path = ROOT / f"{name.replace('.', '/')}.py"
        ours = {m for m in _imports(path) if m.startswith(("monitor", "adapters"))}
        assert not ours, f"{name} imports {sorted(ours)}"


def test_no_package_imports_a_higher_one() -> None:
    for package, higher in FORBIDDEN.items():
        paths = sorted((ROOT / package).rglob("*.py"))
        assert paths, package
        for path in paths:
            wrong = {m for m in _imports(path) if m.startswith(higher)}
            assert not wrong, f"{package}/{path.name} imports {sorted(wrong)}"


def test_every_subpackage_has_its_floor() -> None:
    """A new package under monitor/ is placed among the layers, not left out of them."""
    packages = {
        p.parent.relative_to(ROOT).as_posix()
        for p in (ROOT / "monitor").rglob("__init__.py")
        if p.parent != ROOT / "monitor"
    }
    unplaced = {p for p in packages if not any(p.startswith(floor) for floor in FORBIDDEN)}
    assert not unplaced, f"not in FORBIDDEN: {sorted(unplaced)}"


def test_the_shared_modules_import_no_package() -> None:
    """errors, config, clock, paths, records, metrics, lazylog, pulse, retry and private sit
    under everything."""
    for name in SHARED:
        imported = _imports(ROOT / "monitor" / f"{name}.py")
        wrong = {m for m in imported if m.startswith(("adapters", "monitor.", *TOP))}
        wrong -= {"monitor.errors", "monitor.paths", "monitor.clock", "monitor.records"}
        assert not wrong, f"monitor/{name}.py imports {sorted(wrong)}"


def test_every_module_at_the_top_has_its_place() -> None:
    """A module directly under monitor/ is a shared one or has its own rule: the layer
    rules cover every module, not only the packages."""
    for path in sorted((ROOT / "monitor").glob("*.py")):
        name = path.stem
        assert name in SHARED or name in TOP_LEVEL, f"monitor/{path.name} has no place"
        if name in TOP_LEVEL:
            wrong = {m for m in _imports(path) if TOP_LEVEL[name] and m.startswith(TOP_LEVEL[name])}
            assert not wrong, f"monitor/{path.name} imports {sorted(wrong)}"


TABLES = (
    *("session_state_events", "session_state_heads", "session_watch_cursors"),
    *("session_upstream_links", "sessionwatch_link_state", "sessionwatch_sessions"),
    *("sessionwatch_own_messages", "sessionwatch_leases", "sessionwatch_wakes"),
    *("sessionwatch_created_notices", "sessionwatch_opened_notices"),
    *("sessionwatch_notice_outbox", "sessionwatch_source_follows", "sessionwatch_doing_history"),
)


def _strings(path: Path) -> list[str]:
    return [
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_each_table_has_one_owner() -> None:
    """A table's SQL lives in one module (the two schemas' DDL apart)."""
    owners: dict[str, set[str]] = {t: set() for t in TABLES}
    for path in sorted((ROOT / "monitor").rglob("*.py")):
        if path.name in ("sqlite_schema.py", "pg_schema.py"):
            continue
        text = " ".join(_strings(path))
        for table in TABLES:
            if table in text:
                owners[table].add(str(path.relative_to(ROOT)))
    assert {t: 1 for t in TABLES} == {t: len(o) for t, o in owners.items()}, owners


def test_no_module_outside_the_adapters_names_an_upstream_kind() -> None:
    """Only adapters/ and the configuration (its roots) name a kind; the schema keeps the
    kinds sessionwatch's schema 1 wrote, to migrate them (data of the past, not a list)."""
    from adapters.registry import names

    kinds = set(names())
    for path in sorted((ROOT / "monitor").rglob("*.py")):
        if path.name == "config.py" or path.relative_to(ROOT).as_posix() == (
            "monitor/kernel/store/sqlite_schema.py"
        ):
            continue
        named = kinds.intersection(_strings(path))
        assert not named, f"{path.relative_to(ROOT)} names {sorted(named)}"


def test_every_write_goes_through_commits() -> None:
    """Only :class:`~monitor.kernel.commits.Commits` (and the stores' own modules) calls a
    store's ``write``: every write transaction then publishes ``StoreWritten`` and the
    changes it names, by construction."""
    found = []
    for package in ("monitor", "adapters"):
        for path in sorted((ROOT / package).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            if where == "monitor/kernel/commits.py" or where.startswith("monitor/kernel/store/"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                owner = node.func.value
                named = getattr(owner, "attr", None) or getattr(owner, "id", "")
                if node.func.attr == "write" and named.lstrip("_").endswith("store"):
                    found.append(f"{where}:{node.lineno}")
    assert [] == found


# the changes a write transaction makes: said by Commits once it committed, never by hand
WRITE_CHANGES = ("StoreWritten", "NoticesOpened", "NoticesAcknowledged", "WatchesChanged",
                 "LinksChanged")  # fmt: skip


def test_a_write_s_change_is_said_only_by_its_transaction() -> None:
    """No ``bus.publish`` of a write's change outside Commits: a part says it with
    ``record.say`` (or the recorder's own methods) inside the transaction, so that it is
    published after the commit, and never after a failed or a declined write."""
    found = []
    for package in ("monitor", "adapters"):
        for path in sorted((ROOT / package).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            if where == "monitor/kernel/commits.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                if node.func.attr != "publish" or not node.args:
                    continue
                said = node.args[0]
                name = getattr(getattr(said, "func", None), "id", None) or getattr(said, "id", "")
                if name in WRITE_CHANGES:
                    found.append(f"{where}:{node.lineno} publishes {name}")
    assert [] == found


def test_the_bus_is_handed_to_a_part_at_start_and_reached_no_other_way() -> None:
    """A part gets the bus in ``start(stack, bus)``; none reaches it through the kernel
    (``kernel.bus``, ``x.kernel.bus``) outside the kernel's own package, but a one-shot
    command's root (the CLI's, the testing module's), which has no parts."""
    found = []
    for package in ("monitor", "adapters"):
        for path in sorted((ROOT / package).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            if where.startswith(("monitor/kernel/", "monitor/cli/", "monitor/testing.py")):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Attribute) and node.attr == "bus"):
                    continue
                owner = node.value
                if getattr(owner, "attr", None) == "kernel" or getattr(owner, "id", "") == "kernel":
                    found.append(f"{where}:{node.lineno}")
    assert [] == found


MAX_MODULE_LINES = 600


def test_no_module_is_over_600_lines() -> None:
    """A module a newcomer reads whole: split along its parts past that."""
    long = {
        str(path.relative_to(ROOT)): n
        for package in ("monitor", "adapters")
        for path in sorted((ROOT / package).rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert {} == long


MAX_CLASS_LINES = 300


def _classes() -> list[tuple[str, str, int]]:
    """Every class of the runtime (``monitor`` and ``adapters``): its name, module, lines."""
    found = []
    for package in ("monitor", "adapters"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    assert node.end_lineno is not None
                    lines = node.end_lineno - node.lineno + 1
                    found.append((node.name, str(path.relative_to(ROOT)), lines))
    return found


def test_no_class_is_over_300_lines_and_no_two_share_a_name() -> None:
    classes = _classes()
    long = [(name, where, n) for name, where, n in classes if n > MAX_CLASS_LINES]
    assert [] == long
    where: dict[str, list[str]] = {}
    for name, module, _ in classes:
        where.setdefault(name, []).append(module)
    assert {} == {name: modules for name, modules in where.items() if len(modules) > 1}


def test_every_running_part_starts_one_way() -> None:
    """Every class of the service with a ``start`` implements the one component contract,
    ``async def start(self, stack, bus)`` (monitor/serve/components.py), and ``running``
    starts them through one ordered list (``Parts``), and no other way."""
    starts = []
    for path in sorted((ROOT / "monitor").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef) or node.name in ("JsonErrorHandler", "Parts"):
                continue  # (that one overrides aiohttp's RequestHandler.start; Parts starts them)
            for item in node.body:
                if (
                    isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                    and item.name == "start"
                ):
                    args = [a.arg for a in item.args.args]
                    where = f"{path.relative_to(ROOT)}: {node.name}.start{tuple(args)}"
                    assert isinstance(item, ast.AsyncFunctionDef), where
                    assert ["self", "stack", "bus"] == args, where
                    starts.append(node.name)
    assert len(starts) >= 10, starts
    root = (ROOT / "monitor" / "serve" / "root.py").read_text()
    assert "parts = Parts(stack, bus)" in root and ".start(stack" not in root
    assert "stack.callback(" not in root and "stack.push_async_callback(" not in root
    assert "stack.enter_context(" not in root


async def test_every_part_is_in_the_ordered_list_and_leaves_nothing_subscribed(
    tmp_path: Path,
) -> None:
    """The lock, the store, the kernel and every other part start in one order, and
    closing the stack ends every subscription they made (none is made on no stack)."""
    from monitor.config import GatewayConfig
    from monitor.serve.root import running
    from tests.helpers import make_config

    token = tmp_path / "hooks-token"
    token.write_text("a-hooks-token-long-enough\n")
    token.chmod(0o600)
    gateway = GatewayConfig(hooks_url="http://127.0.0.1:9/hooks", hooks_token_file=str(token))
    config = make_config(tmp_path, gateway=gateway)
    async with running(config, tmp_path / "state.db") as sidecar:
        assert sidecar is not None
        order = [type(part).__name__ for part in sidecar.parts]
        bus = sidecar.kernel.bus
        assert bus._subscribers
    assert ["InstanceLock", "Store", "Kernel", "PageState", "UpstreamMonitor"] == order[:5]
    assert {"HooksClient", "Delivery", "Ticker", "Ticks", "FileWatch", "TitleReader"} <= set(order)
    assert "ApiSite" == order[-1]
    assert {} == {kind.__name__: subs for kind, subs in bus._subscribers.items() if subs}
    assert {} == bus._first  # the change hub's start ended with the kernel
