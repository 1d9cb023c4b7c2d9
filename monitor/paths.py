"""``~`` in paths a person or a client gives."""

from __future__ import annotations

import os
from pathlib import Path

from monitor.errors import BadInput


def expand_user(path: str | Path) -> str:
    """``path`` with ``~`` or ``~user`` expanded; a home that cannot be found is refused,
    never taken as a directory literally named ``~user`` (nor raised as a RuntimeError),
    and so is a NUL byte (which the system calls refuse with a ValueError)."""
    text = str(path)
    if "\x00" in text:
        raise BadInput("a path cannot hold a NUL byte")
    expanded = os.path.expanduser(text)
    if expanded.startswith("~"):
        user = text[1:].split("/", 1)[0]
        raise BadInput(f"cannot expand {text!r}: no home directory for user {user!r}")
    return expanded
