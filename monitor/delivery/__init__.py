"""Wake delivery, in one home: from a notice a sidecar opened to the gateway's
acknowledgement of it.

- :mod:`ledger`: :class:`Delivery`, what the kernel hands each notice it opens; the
  database is its one memory of what was delivered.
- :mod:`coalescer`: at most one wake per watcher per 20 s window.
- :mod:`claims`: the window, claimed in the store, across sidecars sharing it.
- :mod:`hooks`: the gateway's hooks API as a client, over a transport given from outside.
- :mod:`timers`: the clock and timers all of it runs on, given from outside.
"""
