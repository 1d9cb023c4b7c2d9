"""Time in this layer is integer milliseconds since the epoch, UTC."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]

SECOND_MS = 1000
HOUR_MS = 3600 * SECOND_MS
DAY_MS = 24 * HOUR_MS


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def ago(then_ms: int | None, now: int) -> str:
    """How long ago, for people: ``12 s ago``, ``3 min ago``, ``5 h ago``, ``2 d ago``;
    ``never`` for no time at all."""
    if not then_ms:
        return "never"
    seconds = max(0, (now - then_ms) // SECOND_MS)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"
