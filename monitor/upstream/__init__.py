"""The upstream monitor (SPEC.md sections 7-8): adoption, the catalog, and the tick over
watched links, on the kernel and the adapters' one seam."""

from monitor.upstream.monitor import UpstreamMonitor

__all__ = ["UpstreamMonitor"]
