"""sessionwatch: a session-state-awareness sidecar.

``monitor`` is the kernel and the service: the store, the signal log, cursors and
notices, reconciliation, the upstream monitor's tick and the CLI. ``adapters`` holds one
module per upstream format.
"""

__version__ = (
    "0.7.0"  # bumped with every release; its minor with every schema change (CHANGELOG.md)
)
