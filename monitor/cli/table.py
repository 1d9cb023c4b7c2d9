"""What the CLI prints for people rather than programs: the catalog as a table (``rich``).
Everything else it prints is JSON."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from adapters.catalog import Catalog, CatalogEntry
from monitor.clock import ago
from monitor.errors import escaped

if TYPE_CHECKING:
    from rich.text import Text


def _size(entry: CatalogEntry) -> str:
    if entry.size_unit == "messages":
        return f"{entry.size} msg"
    value = float(entry.size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return ""  # pragma: no cover - the loop always returns


def _home(path: str | None) -> str:
    if not path:
        return ""
    home = str(Path.home())
    return "~" + path[len(home) :] if path == home or path.startswith(home + "/") else path


def shown(text: str) -> Text:
    """Text from a transcript or a file name as a terminal should show it: control
    characters escaped (``ESC[2J`` would clear the screen), never read as rich markup."""
    from rich.text import Text

    return Text(escaped(text))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def print_catalog(catalog: Catalog, now_ms: int, *, width: int = 100) -> None:
    """The catalog as a table for people (``sessionwatch catalog``), ``width`` columns wide:
    a short id ``adopt`` takes, the title and working directory cut to fit."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=width)
    table = Table(box=None, pad_edge=False, expand=True, header_style="bold")
    kinds = [f"{e.kind}@{e.node}" if e.node else e.kind for e in catalog.entries]
    kind_width = min(max((len(k) for k in kinds), default=6), 40)  # a node name is read whole
    table.add_column("id", no_wrap=True, min_width=8)
    table.add_column("kind", no_wrap=True, overflow="ellipsis", min_width=kind_width)
    table.add_column("title", no_wrap=True, overflow="ellipsis", ratio=1)
    table.add_column("directory", no_wrap=True, overflow="ellipsis", max_width=28)
    table.add_column("age", no_wrap=True, justify="right", min_width=10)
    table.add_column("size", no_wrap=True, justify="right", min_width=8)
    table.add_column("session", no_wrap=True, overflow="ellipsis", max_width=24)
    for e, kind in zip(catalog.entries, kinds, strict=True):
        table.add_row(
            e.short_id,
            shown(kind),
            shown(e.title or ""),
            shown(_home(e.cwd)),
            ago(e.updated_at, now_ms),
            _size(e),
            shown(", ".join(k for k in (e.session_key, *e.also_keys) if k)),
        )
    console.print(table)
    said = _plural(len(catalog.entries), "session")
    if catalog.skipped:
        said += f"; {catalog.skipped} not adoptable (sub-agent runs), not listed"
    if catalog.errors:
        said += f"; {_plural(len(catalog.errors), 'source')} could not be read:"
    console.print(said, soft_wrap=True)
    for err in catalog.errors:  # whole, however long: a path is read, or copied
        line = shown(f"  {err['path']}: {err['reason']}")
        line.stylize("yellow")
        console.print(line, soft_wrap=True)
