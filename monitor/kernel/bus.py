"""The change bus: every change the running service acts on, and the one way to hear one.

Every kind is a :class:`Change`, declared here:

- the kernel's, after each commit of this process: :class:`StoreWritten` (any commit),
  :class:`NoticesOpened`, :class:`NoticesAcknowledged` (a drain, a
  wake the gateway accepted) and :class:`WatchesChanged`; the start-up sweep's
  :class:`NoticesUndecided`;
- the store's, for another process's commit: :class:`StoreMoved` (the change hub,
  :mod:`monitor.kernel.changes`, hears it);
- upstream's: :class:`LinksChanged`, :class:`DoingChanged`, :class:`WatchedMayDiffer`,
  :class:`SourcesMoved`, :class:`SourcesWatched`;
- the tick's: :class:`TickRan`;
- delivery's: :class:`WakeOutcome`;
- the title reader's: :class:`TitlesRead`;
- the configuration's: :class:`ConfigReloaded` (the one in force before and after).

A part of the service subscribes to the kinds it acts on (:meth:`Bus.subscribe`, APScheduler
4's broker is the model: a :class:`Subscription` that ends it); the callback runs at once, on
the publisher's thread (the event loop's), and must be quick and never raise. A reader that
waits (the notice stream, ``notices --follow``, the status page) iterates
:meth:`Bus.listen`: it is told, never polls. A source of changes that costs something to
run (the hub's watch of the store) starts when its kind is first heard
(:meth:`Bus.on_first`).

Changes are small classes with slots, not dataclasses or named tuples: a one-shot command
imports this module, and a base class is what every kind shares. A change carries what a
reader shows of it (a wake's outcome, a tick's time): no reader reaches into the memory of
the part that published it.

What the status page does with each kind is declared beside the kind, in its ``page``
(:data:`SHOWN_IF_MOVED`, :data:`SHOWN_AT_ONCE`, :data:`SHOWN_LATER`; empty: the page does
not listen); :func:`page_kinds` lists the kinds it listens to.
"""

from __future__ import annotations

import functools
from collections import deque

from monitor.kernel.topics import DOING, LINKS, NOTICES
from monitor.lazylog import LazyLogger

TYPE_CHECKING = False

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Iterable
    from typing import Any, TypeVar

    from monitor.config import Config
    from monitor.kernel.notices import Notice
    from monitor.kernel.topics import Topics

    C = TypeVar("C", bound="Change")

log = LazyLogger(__name__)


# what the status page does when it hears a change (a kind's ``page``)
SHOWN_IF_MOVED = "if moved"  # what the page shows may have moved: told if its fingerprint did
SHOWN_AT_ONCE = "at once"  # told within the page's minimum gap
SHOWN_LATER = "later"  # told at the page's slower refresh (a tick's time and duration)

_KINDS: list[type[Change]] = []


class Change:
    """What changed. Equal when of one kind with equal fields (its slots). ``page``: what
    the status page does when it hears one (empty: it does not listen)."""

    __slots__: tuple[str, ...] = ()
    page = ""
    topic = ""  # what another process hears of it, said in a transaction (kernel/topics.py)

    def __init_subclass__(cls) -> None:
        if cls.__module__ == __name__:  # the service's kinds, all declared here: one a test
            _KINDS.append(cls)  # declares stays out of page_kinds() for the rest of the run

    def shown(self) -> str:
        """What the page does with this one (its kind's ``page``, unless it says better)."""
        return self.page

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._values() == self._values()

    def __hash__(self) -> int:
        return hash((type(self), self._values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({fields})"


# -- the kernel's ----------------------------------------------------------------------


class StoreWritten(Change):
    """This process committed (an event, a notice, a link, a lease, a marker): what a
    reader shows may differ."""

    __slots__ = ()
    page = SHOWN_IF_MOVED


class NoticesOpened(Change):
    """Notices a commit opened or reopened, or that the start-up sweep found pending: each
    one this process may have to wake (the policy says whom)."""

    __slots__ = ("notices",)

    def __init__(self, notices: tuple[Notice, ...]) -> None:
        self.notices = notices


class NoticesAcknowledged(Change):
    """Notices were acknowledged (a drain, a wake the gateway accepted): what is pending
    changed. ``reopened``: those the acknowledgement opened again (work that came after a
    notice froze), also published as :class:`NoticesOpened`."""

    __slots__ = ("reopened",)
    page = SHOWN_IF_MOVED

    def __init__(self, reopened: tuple[Notice, ...] = ()) -> None:
        self.reopened = reopened


class WatchesChanged(Change):
    """Which sessions are watched may have changed: a watch, a spawn, an ambient watch, a
    reset, a deletion."""

    __slots__ = ()
    page = SHOWN_IF_MOVED


class StoreMoved(Change):
    """Another connection committed (another process, another host): ``moves`` is the
    hub's count of such moves; ``topics``, what those commits touched, as far as the store
    can say (:mod:`monitor.kernel.topics`; None: anything may have moved)."""

    __slots__ = ("moves", "topics")
    page = SHOWN_IF_MOVED

    def __init__(self, moves: int, topics: Topics = None) -> None:
        self.moves = moves
        self.topics = topics

    def about(self, topic: str) -> bool:
        """Whether ``topic`` may have moved."""
        return self.topics is None or topic in self.topics


# -- upstream's ------------------------------------------------------------------------


class LinksChanged(Change):
    """Links were adopted or removed: said by the transaction that wrote them (through
    :class:`~monitor.kernel.commits.Commits`), once it committed."""

    __slots__ = ()
    topic = LINKS


class DoingChanged(Change):
    """What a session is doing changed (adapters/states.py): ``state`` since ``since``
    (ms), ``was`` before, and how long a person was waited for when that wait ended here
    (``waited``, ms); said by the check's transaction once it committed."""

    __slots__ = ("session_key", "since", "state", "waited", "was")
    page = SHOWN_AT_ONCE
    topic = DOING

    def __init__(
        self, session_key: str, state: str, since: int | None, was: str, waited: int | None
    ) -> None:
        self.session_key = session_key
        self.state = state
        self.since = since
        self.was = was
        self.waited = waited


class WatchedMayDiffer(Change):
    """Which files and nodes are watched may differ though no link was written: the roots
    and nodes changed, a rollout branched to a file of its own, a source found missing may
    come back in another folder."""

    __slots__ = ()
    topic = LINKS


class SourcesMoved(Change):
    """The native sources of these links changed (a file written to, a node's feed moved):
    they are due an early check. ``catch_up``: the check that follows arming a watch, whose
    missing sources must not re-arm it again. ``settling``: a database's WAL was written,
    and the commit becomes visible to readers a moment later (SQLite updates the WAL index
    after the frames): the keys are checked again shortly after, as well as at once."""

    __slots__ = ("catch_up", "keys", "settling")

    def __init__(
        self, keys: frozenset[str], catch_up: bool = False, settling: bool = False
    ) -> None:
        self.keys = keys
        self.catch_up = catch_up
        self.settling = settling


class SourcesWatched(Change):
    """The links whose sources a watcher hears as they change, from now on (``by`` names
    the watcher; an empty set: it hears none, a watch being armed again). A scheduled tick
    that finds nothing moved since the last full one, every link then quiet and heard, has
    nothing to read (``serve/ticks.py``)."""

    __slots__ = ("by", "keys")

    def __init__(self, by: str, keys: frozenset[str]) -> None:
        self.by = by
        self.keys = keys


class OwnershipChanged(Change):
    """This sidecar gained or lost ``ticks:shared`` on a store several share (``shared``:
    it ticks the links without a host now: OpenCode databases and paired nodes), as
    :class:`monitor.upstream.host_leases.HostLeases` took, lost or let lapse the lease. The
    tick and node watching follow it: the new holder ticks those links and arms their nodes'
    feeds at once; one that lost it (paused past its lease, say) stops before it ticks
    again."""

    __slots__ = ("holder", "shared")

    def __init__(self, shared: bool, holder: str) -> None:
        self.shared = shared
        self.holder = holder  # this sidecar's name in the leases


class HostsChanged(Change):
    """The hosts live on a store several sidecars share changed (their ids, as the host
    leases say at this sidecar's renewal): the watchers' shares moved
    (:mod:`monitor.delivery.shares`)."""

    __slots__ = ("hosts",)

    def __init__(self, hosts: frozenset[str]) -> None:
        self.hosts = hosts


# -- the tick's, delivery's, the configuration's ---------------------------------------


class NoticesUndecided(Change):
    """The start-up sweep found ``count`` pending notices an earlier sessionwatch left on a
    database the gateway shares, which cannot be told from the gateway's own: they are
    left to the gateway until their pair changes."""

    __slots__ = ("count",)
    page = SHOWN_AT_ONCE

    def __init__(self, count: int) -> None:
        self.count = count


class TickRan(Change):
    """A scheduled or early tick ended, at ``at_ms`` (wall clock, as shown) after
    ``duration_s``: ``idle`` when it had nothing to read (the links stand as the last one
    left them); ``failed``: why it failed as a whole; ``over_budget``: the adapters that ran
    past their budget."""

    __slots__ = ("at_ms", "duration_s", "failed", "idle", "over_budget")
    page = SHOWN_LATER

    def __init__(
        self,
        at_ms: int = 0,
        duration_s: float = 0.0,
        *,
        idle: bool = False,
        failed: str | None = None,
        over_budget: tuple[str, ...] = (),
    ) -> None:
        self.at_ms = at_ms
        self.duration_s = duration_s
        self.idle = idle
        self.failed = failed
        self.over_budget = over_budget

    def shown(self) -> str:
        """A failed tick is shown at once; a tick's time and duration, later."""
        return SHOWN_AT_ONCE if self.failed is not None else SHOWN_LATER


class WakeOutcome(Change):
    """A wake call for ``watcher`` ended, at ``at_ms`` (wall clock, as shown): ``result``
    (accepted, refused, unauthorized, throttled, redirected, no_token, failed, unanswered),
    the gateway's ``error``, and the ``url`` it went to."""

    __slots__ = ("at_ms", "error", "result", "url", "watcher")
    page = SHOWN_AT_ONCE

    def __init__(
        self, watcher: str, result: str = "", error: str = "", at_ms: int = 0, url: str = ""
    ) -> None:
        self.watcher = watcher
        self.result = result
        self.error = error
        self.at_ms = at_ms
        self.url = url


class TitlesRead(Change):
    """The sessions' titles were read again (from the catalog): ``titles`` by native id."""

    __slots__ = ("titles",)
    page = SHOWN_AT_ONCE

    def __init__(self, titles: dict[str, str] | None = None) -> None:
        self.titles = titles or {}

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self.titles.items()))))


class ConfigReloaded(Change):
    """A reload (``SIGHUP``) changed the configuration in force: ``old`` was, ``new`` is;
    each part applies its own section."""

    __slots__ = ("new", "old")
    page = SHOWN_AT_ONCE

    def __init__(self, old: Config, new: Config) -> None:
        self.old = old
        self.new = new


# what may have opened a notice a reader has not shown: this process's commit, another's
NOTICE_CHANGES: tuple[type[Change], ...] = (NoticesOpened, StoreMoved)


def notices_may_differ(change: Change) -> bool:
    """Whether one of :data:`NOTICE_CHANGES` may have moved an inbox (another process's
    commit, only if it may have touched notices)."""
    return not isinstance(change, StoreMoved) or change.about(NOTICES)


def doing_may_differ(change: Change) -> bool:
    """Whether ``change`` says what an adopted session is doing may have changed: this
    process's :class:`DoingChanged`, or another's commit that says so (a store that cannot
    say what moved says nothing here: its page is told ``changed``)."""
    if isinstance(change, StoreMoved):
        return change.topics is not None and DOING in change.topics
    return isinstance(change, DoingChanged)


def page_kinds() -> tuple[type[Change], ...]:
    """The kinds the status page listens to: those whose ``page`` says what it does."""
    return tuple(kind for kind in _KINDS if kind.page)


# -- the bus ---------------------------------------------------------------------------


class Subscription:
    """A registration on the bus (a callback's subscription to some kinds, a source's
    start); :meth:`unsubscribe` ends it (also on leaving a ``with`` block)."""

    __slots__ = ("_undo",)

    def __init__(self, undo: Callable[[], None]) -> None:
        self._undo = undo

    def unsubscribe(self) -> None:
        self._undo()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *_: object) -> None:
        self.unsubscribe()


class Bus:
    """Typed publish and subscribe, in process (see the module docstring)."""

    def __init__(self) -> None:
        self._subscribers: dict[type[Change], list[Callable[[Any], None]]] = {}
        self._first: dict[type[Change], Callable[[], object]] = {}

    def subscribe(
        self, kinds: type[C] | tuple[type[C], ...], callback: Callable[[C], None]
    ) -> Subscription:
        """Call ``callback`` with every change of ``kinds`` from now on."""
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        for kind in kinds:
            self._subscribers.setdefault(kind, []).append(callback)
            start = self._first.get(kind)
            if start is not None:
                start()
        return Subscription(functools.partial(self._unsubscribe, kinds, callback))

    def _unsubscribe(self, kinds: tuple[type[Change], ...], callback: Any) -> None:
        for kind in kinds:
            callbacks = self._subscribers.get(kind, [])
            if callback in callbacks:
                callbacks.remove(callback)

    def publish(self, change: Change) -> None:
        """Hand ``change`` to its kind's subscribers, then to those of every kind
        (``Change``). One that raises is a bug: said, and the others still hear it."""
        every = self._subscribers.get(Change, ()) if type(change) is not Change else ()
        for callback in (*self._subscribers.get(type(change), ()), *every):
            try:
                callback(change)
            except Exception:
                log.exception("a subscriber to %s failed", type(change).__name__)

    def wants(self, kind: type[Change]) -> bool:
        """Whether anyone listens for ``kind`` (a publisher may skip building it)."""
        return bool(self._subscribers.get(kind) or self._subscribers.get(Change))

    def on_first(self, kind: type[Change], start: Callable[[], object]) -> Subscription:
        """Call ``start`` whenever ``kind`` gets a subscriber (it must be idempotent), until
        the :class:`Subscription` ends: a source of changes that costs something runs only
        once someone listens."""
        self._first[kind] = start
        if self.wants(kind):
            start()
        return Subscription(functools.partial(self._no_first, kind, start))

    def _no_first(self, kind: type[Change], start: Callable[[], object]) -> None:
        if self._first.get(kind) is start:
            del self._first[kind]

    def listen(self, kinds: Iterable[type[Change]], *, keep: int = 1024) -> Listening:
        """The changes of ``kinds`` from now on, to iterate or wait for (see
        :class:`Listening`)."""
        return Listening(self, tuple(kinds), keep)


class Listening:
    """Changes of some kinds, heard since it was made: ``async for change in listening``, or
    :meth:`next` with a timeout. At most ``keep`` unread changes are kept (the oldest go
    first): a reader that acts on what changed reads the state again in any case. Ends
    (unsubscribes) with :meth:`close`, or on leaving an ``async with`` block."""

    def __init__(self, bus: Bus, kinds: tuple[type[Change], ...], keep: int) -> None:
        self._heard: deque[Change] = deque(maxlen=keep)
        self._arrived: asyncio.Event | None = None
        self._subscription = bus.subscribe(kinds, self._hear)

    def _hear(self, change: Change) -> None:
        self._heard.append(change)
        if self._arrived is not None:
            self._arrived.set()

    def pending(self) -> list[Change]:
        """What was heard and not read yet, now read."""
        heard = list(self._heard)
        self._heard.clear()
        return heard

    async def next(
        self, timeout: float | None = None, *, unless: asyncio.Event | None = None
    ) -> Change | None:
        """The next change; None after ``timeout`` s, or once ``unless`` is set (a stop)."""
        import asyncio

        while not self._heard:
            if unless is not None and unless.is_set():
                return None
            if self._arrived is None:
                self._arrived = asyncio.Event()
            self._arrived.clear()
            waits = [asyncio.ensure_future(self._arrived.wait())]
            if unless is not None:
                waits.append(asyncio.ensure_future(unless.wait()))
            try:
                done, _ = await asyncio.wait(
                    waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for wait in waits:
                    wait.cancel()
            if not done:
                return None
        return self._heard.popleft()

    def __aiter__(self) -> Listening:
        return self

    async def __anext__(self) -> Change:
        change = await self.next()
        assert change is not None  # no timeout, no stop: only a change ends the wait
        return change

    def close(self) -> None:
        self._subscription.unsubscribe()

    async def __aenter__(self) -> Listening:
        return self

    async def __aexit__(self, *_: object) -> None:
        self.close()
