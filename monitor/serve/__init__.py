"""``sessionwatch serve`` and ``sessionwatch node``: the running service, as components on
one exit stack (:mod:`.root`, the composition root), each owning its start and stop and
acting on what the kernel's change stream says changed: the tick schedule and early checks
(:mod:`.ticks`), file watching (:mod:`.file_watch`), node watching (:mod:`.node_watch`),
delivery (:mod:`monitor.delivery`), the API site, retention and reload (:mod:`.reload`).
Nothing is imported here: a one-shot command never loads the service."""
