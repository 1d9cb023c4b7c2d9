"""What the CLI prints for people rather than programs: the catalog as a table (in rich's
cell widths). Everything else it prints is JSON."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from adapters.catalog import CatalogEntry, CatalogListing
from monitor.clock import ago
from monitor.errors import escaped
from monitor.kernel.keys import shown_key


def _size(entry: CatalogEntry) -> str:
    if entry.size_unit == "messages":
        return f"{entry.size} msg"
    value = float(entry.size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return ""  # pragma: no cover - the loop always returns


def _home(path: str | None, home: str) -> str:
    if not path:
        return ""
    return "~" + path[len(home) :] if path == home or path.startswith(home + "/") else path


def _warned(text: str) -> str:
    """``text`` in yellow on a terminal that takes colour (``NO_COLOR`` unset)."""
    if sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb":
        return f"\x1b[33m{text}\x1b[0m"
    return text


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


_GAP = "  "
KEY_CELLS = 28  # a session key: its head and its tail (monitor.kernel.keys.shown_key)


def _fit(text: str, width: int, *, right: bool = False) -> str:
    """``text`` in exactly ``width`` terminal cells: cut with an ellipsis, or padded."""
    if text.isascii():  # a cell a character: no measuring
        if len(text) > width:
            return text[: max(width - 1, 0)] + "…"
        return text.rjust(width) if right else text.ljust(width)
    from rich.cells import cell_len, set_cell_size

    cells = cell_len(text)
    if cells > width:
        return set_cell_size(text, max(width - 1, 0)) + "…"
    pad = " " * (width - cells)
    return pad + text if right else text + pad


def _widths(rows: list[tuple[str, ...]], width: int) -> list[int]:
    """Each column's width: the title takes what the others leave of ``width``."""
    from rich.cells import cell_len

    def widest(i: int, floor: int, cap: int) -> int:
        cells = (len(r[i]) if r[i].isascii() else cell_len(r[i]) for r in rows)
        return min(max(floor, *cells), cap)

    fixed = [
        widest(0, 8, 16),  # id
        widest(1, 4, 40),  # kind: a node name is read whole
        0,  # title
        widest(3, 9, 28),  # directory
        widest(4, 10, 16),  # age
        widest(5, 8, 12),  # size
        widest(6, 7, KEY_CELLS),  # session
    ]
    fixed[2] = max(width - sum(fixed) - len(_GAP) * (len(fixed) - 1), 10)
    return fixed


def print_catalog(catalog: CatalogListing, now_ms: int, *, width: int = 100) -> None:
    """The catalog as a table for people (``sessionwatch catalog``), ``width`` columns wide:
    a short id ``adopt`` takes, the title and working directory cut to fit. Laid out here,
    a row a line (rich's table took 6 s for 10,000 rows), in rich's cell widths."""
    home = str(Path.home())
    rows = [
        (
            e.short_id,
            escaped(f"{e.kind}@{e.node}" if e.node else e.kind),
            escaped(e.title or ""),
            escaped(_home(e.cwd, home)),
            ago(e.updated_at, now_ms),
            _size(e),
            escaped(", ".join(shown_key(k, KEY_CELLS) for k in (e.session_key, *e.also_keys) if k)),
        )
        for e in catalog.entries
    ]
    header = ("id", "kind", "title", "directory", "age", "size", "session")
    widths = _widths([header, *rows], width)
    right = (False, False, False, False, True, True, False)
    # padded by str's own methods, a cell a character; only a cell too long, or not a cell
    # a character (CJK, emoji: two cells), is fitted, by its cells (a format string would
    # pad it by its characters again)
    columns = list(zip(widths, right, strict=True))
    lines = [
        _GAP.join(
            (cell.rjust(w) if r else cell.ljust(w))
            if len(cell) <= w and cell.isascii()
            else _fit(cell, w, right=r)
            for cell, (w, r) in zip(row, columns, strict=True)
        ).rstrip()
        for row in (header, *rows)
    ]
    said = _plural(len(catalog.entries), "session")
    if catalog.skipped:
        said += f"; {catalog.skipped} not adoptable (sub-agent runs), not listed"
    if catalog.errors:
        said += f"; {_plural(len(catalog.errors), 'source')} could not be read:"
    lines.append(said)
    for err in catalog.errors:  # whole, however long: a path is read, or copied; control
        # characters escaped (``ESC[2J`` in a file name would clear the screen)
        lines.append(_warned(escaped(f"  {err['path']}: {err['reason']}")))
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
