"""Wake delivery, in one home: from a notice a sidecar opened to the gateway's
acknowledgement of it.

- :mod:`ledger`: :class:`Delivery`, what the kernel hands each notice it opens; the
  database is its one memory of what was delivered.
- :mod:`claims`: each step of a pass in the store: the watcher's lease, its window (at most
  one wake per 20 s), the read of each notice before its call, the call's outcome.
- :mod:`hooks`: the gateway's hooks API as a client, over a transport given from outside.
- :mod:`timers`: the clock and timers all of it runs on, given from outside.
"""
