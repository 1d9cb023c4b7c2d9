"""What the upstream side publishes on the kernel's change stream
(:class:`monitor.kernel.changes.ChangeStream`): links that changed, and sources that moved."""

from __future__ import annotations

from monitor.records import NamedTuple


class LinksChanged(NamedTuple):
    """Links were adopted or removed, a link's source went missing, or the roots and nodes
    they are read under changed: which files and nodes are watched may differ."""


class SourcesMoved(NamedTuple):
    """The native sources of these links changed (a file written to, a node's feed moved):
    they are due an early check. ``catch_up``: the check that follows arming a watch, whose
    missing sources must not re-arm it again. ``settling``: a database's WAL was written,
    and the commit becomes visible to readers a moment later (SQLite updates the WAL index
    after the frames): the keys are checked again shortly after, as well as at once."""

    keys: frozenset[str]
    catch_up: bool = False
    settling: bool = False


class SourcesWatched(NamedTuple):
    """The links whose sources a watcher hears as they change, from now on (``by`` names
    the watcher; an empty set: it hears none, a watch being armed again). A scheduled tick
    that finds nothing moved since the last full one, every link then quiet and heard, has
    nothing to read (``serve/ticks.py``)."""

    by: str
    keys: frozenset[str]
