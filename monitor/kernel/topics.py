"""What a commit touched, as another process acts on it: its topics.

On a store several sidecars share, each commit tells the others, and each of them reacts
to what it hears. Told only *that* something moved, every host would read the store again
after every commit of every other host (its outbox, its links): work per turn growing with
the square of the hosts. So a commit names what it touched, and PostgreSQL's change notice
carries the names (:mod:`monitor.kernel.store.postgres`); a host reads only what a topic it
acts on says moved, and a commit that touched nothing another host acts on (a lease
renewed, a step of a wake's ledger) tells no one.

- :data:`EVENTS`: events were recorded;
- :data:`NOTICES`: notices were opened or acknowledged (what an inbox holds);
- :data:`LINKS`: links or watches were written (what each host watches and ticks);
- :data:`DOING`: what an adopted session is doing changed (what the status page shows);
- ``wake:<watcher>`` (:func:`wake`): a notice ``watcher`` is woken for was opened, for the
  one host that delivers to that watcher (:mod:`monitor.delivery.shares`).

:class:`~monitor.kernel.commits.Commits` names them, from what each transaction recorded
and said; a change kind says which topic it is (``Change.topic``).

``None`` stands for "anything may have moved": a store that cannot say (SQLite's
``data_version`` counts commits, nothing more), a listener that reconnected (notices may
have been missed), a commit that named too much to carry.
"""

from __future__ import annotations

Topics = frozenset[str] | None

EVENTS = "events"
NOTICES = "notices"
LINKS = "links"
DOING = "doing"
_WAKE = "wake:"

NOTHING: frozenset[str] = frozenset()


def wake(watcher: str) -> str:
    return _WAKE + watcher


def to_wake(topics: frozenset[str]) -> list[str]:
    """The watchers these topics have notices opened for, to wake."""
    return sorted(t[len(_WAKE) :] for t in topics if t.startswith(_WAKE))
