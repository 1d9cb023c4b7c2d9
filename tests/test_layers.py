"""The layer rules of docs/architecture.md, checked on the import graph (every import,
including those inside functions): adapters import nothing of ``monitor`` but its errors,
and the kernel's modules import no adapter, no upstream monitor and no web code."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL = [
    *("clock", "cursors", "db", "errors", "events", "keys", "kernel", "lazylog", "notices"),
    *("paths", "retention", "schema", "signal_log", "store", "store_paths"),
]
HIGHER = ("adapters", "monitor.upstream", "monitor.api", "monitor.node", "monitor.service")


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_adapters_import_only_the_errors_of_monitor() -> None:
    for path in sorted((ROOT / "adapters").glob("*.py")):
        wrong = {m for m in _imports(path) if m.startswith("monitor") and m != "monitor.errors"}
        assert not wrong, f"{path.name} imports {sorted(wrong)}"


def test_the_kernel_imports_no_adapter_no_monitor_and_no_web() -> None:
    for name in KERNEL:
        imported = _imports(ROOT / "monitor" / f"{name}.py")
        wrong = {m for m in imported if m.startswith(HIGHER)}
        assert not wrong, f"monitor/{name}.py imports {sorted(wrong)}"
