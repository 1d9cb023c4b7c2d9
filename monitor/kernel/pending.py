"""A write waiting for its group transaction, as both group-committing stores keep it: its
function, its deadline for another process's lock, and the future its caller awaits.

The stores run a group on a thread of their own; these are the two steps they share: the
writes whose lock wait is over fail at once (not when the group ends), and each caller
gets its own outcome on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Result = tuple[bool, Any]  # (ok, the value or the exception)


@dataclass(slots=True)
class PendingWrite:
    fn: Callable[[Any], Any]
    deadline: float  # time.monotonic() after which it no longer waits for a lock
    timeout: float  # how long that was, for the error
    future: asyncio.Future[Any]
    alone: bool = False  # run outside any transaction (the pragmas), not in a group


Done = list[tuple[PendingWrite, Result]]
Expired = Callable[[Done], None]


def fail_late(
    writes: list[PendingWrite],
    outcomes: list[Result | None],
    now: float,
    locked: Callable[[float], BaseException],
    expired: Expired | None,
) -> None:
    """The writes still waiting whose deadline has passed fail with ``locked(timeout)``, and
    are told at once through ``expired``: a write that came in early would otherwise wait
    for the deadline of the last one in its group."""
    late: Done = []
    for i, write in enumerate(writes):
        if outcomes[i] is None and write.deadline <= now:
            outcome: Result = (False, locked(write.timeout))
            outcomes[i] = outcome
            late.append((write, outcome))
    if late and expired is not None:
        expired(late)


def resolve(done: Done, translate: Callable[[BaseException, float], BaseException]) -> None:
    """On the event loop: each write's caller gets its own result or error (``translate``
    makes the store's error ours); a caller already told (or gone) is skipped."""
    for write, (ok, value) in done:
        if write.future.done():
            continue
        if ok:
            write.future.set_result(value)
        else:
            write.future.set_exception(translate(value, write.timeout))
