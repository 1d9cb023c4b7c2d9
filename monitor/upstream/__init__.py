"""The upstream monitor (docs/specification.md sections 8-9): adoption, the catalog, and
the tick over watched links, on the kernel and the adapters' one seam.

``UpstreamMonitor`` is imported on first use (see :mod:`monitor.kernel`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from monitor.upstream.monitor import UpstreamMonitor

__all__ = ["UpstreamMonitor"]


def __getattr__(name: str) -> object:
    if name != "UpstreamMonitor":
        raise AttributeError(f"module 'monitor.upstream' has no attribute {name!r}")
    return importlib.import_module("monitor.upstream.monitor").UpstreamMonitor
