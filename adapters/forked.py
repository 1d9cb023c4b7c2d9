"""CPU-bound reading on every core: a list of work split across forked children.

The catalog of a year of sessions parses thousands of files' heads in Python, which one
interpreter does on one core. :func:`split` gives each usable core but this one a part of
the list in a forked child, which sends back what it found pickled through a pipe, and does
the first part here meanwhile. A child is a copy of this process at the fork: it runs only
the function it is given, on data it already holds, and leaves with ``os._exit`` (no
handler, no buffer flushed twice, nothing of the parent's touched).

Nothing is lost to a child: one that cannot be forked, dies, sends what cannot be read back,
or has not answered within :data:`PATIENCE_S` is killed if need be, and its part is done
here instead.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import time
from collections.abc import Callable
from typing import Protocol, Self, TypeVar, cast

PATIENCE_S = 60.0  # a child's whole answer, at most; then its part is done here


class Mergeable(Protocol):
    def extend(self, other: Self, /) -> None: ...


M = TypeVar("M", bound=Mergeable)
W = TypeVar("W")


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def split(work: Callable[[list[W]], M], items: list[W], ways: int | None = None) -> M:
    """``work(items)``, as one result, with ``items`` split ``ways`` ways (the usable
    cores, by default): every part but the first in a forked child. The parts are taken
    in stride, so that each holds as many large and small items as the next."""
    ways = min(ways or cores(), len(items)) if items else 1
    if ways < 2:
        return work(items)
    parts = [items[i::ways] for i in range(ways)]
    children = [_fork(work, part) for part in parts[1:]]
    try:
        found = work(parts[0])
    except BaseException:  # no child outlives the call, nor waits on a pipe no one reads
        for made in filter(None, children):
            _answer(made, time.monotonic())  # out of patience at once: killed, reaped
        raise
    deadline = time.monotonic() + PATIENCE_S
    for child, part in zip(children, parts[1:], strict=True):
        answer = _answer(child, deadline) if child is not None else None
        found.extend(cast(M, answer) if answer is not None else work(part))
    return found


def _fork(work: Callable[[list[W]], M], part: list[W]) -> tuple[int, int] | None:
    """A child doing ``work(part)``: its pid and the read end of its pipe; None when no
    child could be made."""
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(read_end)
            data = memoryview(pickle.dumps(work(part), protocol=pickle.HIGHEST_PROTOCOL))
            while data:
                data = data[os.write(write_end, data) :]
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    return pid, read_end


def _answer(child: tuple[int, int], deadline: float) -> object | None:
    """What the child sent, once it ended well; None when it did not (then it has ended)."""
    pid, read_end = child
    chunks: list[bytes] = []
    waiting = select.poll()
    waiting.register(read_end, select.POLLIN)
    try:
        while (left := deadline - time.monotonic()) > 0 and waiting.poll(left * 1000):
            chunk = os.read(read_end, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        else:
            os.kill(pid, signal.SIGKILL)  # out of patience
    finally:
        os.close(read_end)
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:  # reaped by someone else (SIGCHLD ignored): the bytes say
        status = 0
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return None
    try:  # our own child's bytes, all of them (a cut pickle does not load)
        found: object = pickle.loads(b"".join(chunks))
    except Exception:  # never trusted blindly
        return None
    return found
