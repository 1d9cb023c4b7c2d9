"""The kernel of session state awareness: the signal log, watcher cursors, notices and
reconciliation over one state database. It imports no adapter, no upstream monitor and no
web code (see docs/architecture.md).

``Kernel``, ``KernelSettings`` and ``NewEvent`` are imported on first use, so that a
one-shot command importing one kernel module pays for that module only.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False

if TYPE_CHECKING:
    from monitor.kernel.drafts import NewEvent
    from monitor.kernel.kernel import Kernel
    from monitor.kernel.settings import KernelSettings

__all__ = ["Kernel", "KernelSettings", "NewEvent"]
_HOMES = {"Kernel": "kernel", "KernelSettings": "settings", "NewEvent": "drafts"}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'monitor.kernel' has no attribute {name!r}")
    return getattr(importlib.import_module(f"monitor.kernel.{home}"), name)
