"""Run a function as a user whom mode 000 keeps out, even when the suite runs as root (as CI
does): in a thread of its own whose effective capabilities lack ``CAP_DAC_OVERRIDE`` and
``CAP_DAC_READ_SEARCH``. Linux keeps capabilities per thread, so the rest of the process, and
every other thread, keeps them; the thread ends with the call."""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_VERSION_3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words of each set
_DAC = (1 << 1) | (1 << 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_dac() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    header = _Header(_VERSION_3, 0)  # pid 0: this thread
    data = (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    data[0].effective &= ~_DAC
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def unprivileged(fn: Callable[[], T]) -> T:
    """``fn()``, where permission bits hold (as they do for any user but root)."""
    if os.geteuid() != 0:
        return fn()
    result: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            _drop_dac()
            result.append(fn())
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=run, name="unprivileged")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return result[0]
