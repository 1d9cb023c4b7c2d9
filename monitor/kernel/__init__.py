"""The kernel of session state awareness: the signal log, watcher cursors, notices and
reconciliation over one state database. It imports no adapter, no upstream monitor and no
web code (see docs/architecture.md)."""

from monitor.kernel.kernel import Kernel, KernelSettings

__all__ = ["Kernel", "KernelSettings"]
