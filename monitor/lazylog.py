"""A logger that imports :mod:`logging` on its first use.

The one-shot CLI commands never log in the common case; importing logging costs them about
a tenth of their start-up. Modules on that path (the kernel, the notices) log through this.
"""

from __future__ import annotations

TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any


class LazyLogger:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        import logging

        return getattr(logging.getLogger(self._name), attr)
