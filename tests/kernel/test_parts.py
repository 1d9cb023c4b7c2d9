"""The kernel's parts hold what they use, never the kernel: no mutual references."""

from __future__ import annotations

from monitor.kernel import Kernel
from tests.helpers import KernelFactory


async def test_no_part_of_the_kernel_holds_the_kernel(open_kernel: KernelFactory) -> None:
    kernel: Kernel = await open_kernel()
    parts = [v for v in vars(kernel).values() if hasattr(v, "__dict__") or hasattr(v, "__slots__")]
    assert len(parts) >= 6  # the store, the bus, the hub, the commits, the gateway's sessions...
    for part in parts:
        held = vars(part).values() if hasattr(part, "__dict__") else ()
        assert not any(value is kernel for value in held), type(part).__name__
        bound = [getattr(v, "__self__", None) for v in held]  # nor one of its methods
        assert not any(owner is kernel for owner in bound), type(part).__name__
