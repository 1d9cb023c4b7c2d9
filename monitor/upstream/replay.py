"""``sessionwatch replay``: a native source read from its start through the same check as
the monitor, by the kind's own adapter, writing nothing anywhere. The summary says what the
monitor would show: turns, compactions, where it would block, the format drift it met."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from adapters.base import Settings
from adapters.registry import entry


def replay(
    kind: str, path: str, *, thread: str | None, own_texts: list[str], settings: Settings
) -> Iterable[dict[str, Any]]:
    """One ``turn`` object per detected turn, then the ``summary``."""
    return entry(kind).build(settings).replay(path, thread, own_texts)
