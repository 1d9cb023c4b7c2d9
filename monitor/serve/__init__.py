"""``sessionwatch serve`` and ``sessionwatch node``: the running service, as components on
one exit stack (:mod:`.root`, the composition root), each owning its start and stop and
acting on the changes it hears on the change bus (:mod:`monitor.kernel.bus`): the upstream
monitor, the hooks client and delivery (:mod:`monitor.delivery`), the host leases, the tick
schedule and early checks (:mod:`.ticks`), file watching (:mod:`.file_watch`), node
watching (:mod:`.node_watch`), retention, the log level and the configuration in force
(:mod:`.reload`), the API site. Nothing is imported here: a one-shot command never loads
the service."""
