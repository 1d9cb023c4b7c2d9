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
