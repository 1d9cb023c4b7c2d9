"""The kernel's facade: policy and orchestration over the store, and no SQL of its own.

The CLI, the HTTP API and the upstream monitor all call this; none reimplements its logic.
Each method is one transaction; each table's SQL lives in the module that owns it
(:mod:`signal_log`, :mod:`cursors`, :mod:`sessions`, :mod:`retention`). A layer above that
owns tables of its own (the upstream monitor's links) joins a transaction through
:meth:`Kernel.commit`, and has its rows deleted with a session through ``on_delete``
(:mod:`gateway_sessions`: the gateway's sessions, their resets and deletions).

Every event is recorded one way, whoever records it (the API, the CLI, the tick, a node's
findings, a created session): through a :class:`Recorder` in :meth:`Kernel.commit`, which
routes it by the watch policy (spawns and ambient watches), and after the commit counts it,
publishes what changed on :attr:`Kernel.bus` (:mod:`monitor.kernel.bus`) and runs retention when
it is due.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from monitor.clock import Clock, now_ms
from monitor.errors import BadInput
from monitor.kernel import cursors, outbox, retention
from monitor.kernel.bus import Bus, NoticesUndecided
from monitor.kernel.changes import ChangeHub
from monitor.kernel.commits import Commits
from monitor.kernel.drafts import NewEvent, Recorded
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.gateway_sessions import GatewaySessions
from monitor.kernel.keys import normalize_key, parse_agent_key
from monitor.kernel.notices import PROVENANCE_AMBIENT, PROVENANCE_EXPLICIT, Inbox, created_text
from monitor.kernel.policy import WatchPolicy
from monitor.kernel.recorder import Recorder
from monitor.kernel.settings import KernelSettings
from monitor.kernel.signal_log import read_head
from monitor.kernel.store import open_store
from monitor.kernel.views import Views
from monitor.kernel.watcher_stores import LEGACY_DEFAULT, StorePathRule

TYPE_CHECKING = False

if TYPE_CHECKING:
    from contextlib import AsyncExitStack
    from pathlib import Path
    from typing import Any, TypeVar

    from monitor.kernel.notices import Notice
    from monitor.kernel.store.protocol import Conn, StateStore
    from monitor.metrics import Metrics

    T = TypeVar("T")
    from monitor.kernel.gateway_sessions import ScopeDeleter


class Kernel(Views):
    """Signal log, cursors, notices and reconciliation over one state database; its
    read-only answers are :class:`Views`'."""

    def __init__(
        self,
        store: StateStore,
        settings: KernelSettings,
        *,
        metrics: Metrics | None = None,
        on_delete: Sequence[ScopeDeleter] = (),
        bus: Bus | None = None,
    ) -> None:
        """``on_delete``: what deletes a higher layer's rows of a session in the kernel's
        transaction (the upstream links). What changed is published on ``bus`` (the
        service's, else one of the kernel's own)."""
        self.store = store
        self.settings = settings
        self.clock: Clock = store.clock
        self.bus = bus or Bus()  # what each commit changed, for the parts that act on it
        self.changes = ChangeHub(store, self.bus)  # the one watcher of others' commits
        self.metrics = metrics
        # pending notices an upgrade could not tell from the gateway's own (see sweep)
        self.undecided_notices = 0
        self.policy = WatchPolicy(
            main_key=settings.main_key,
            group_scope=settings.group_scope,
            rule=StorePathRule.for_database(
                None if store.shared else settings.database_name or store.path,
                settings.store_path_template,
            ),
        )
        self.commits = Commits(store, self.policy, self.bus, metrics)
        self.retention = self.commits.retention
        # the gateway's sessions: what the sidecar knows of them, their own messages, resets
        # and deletions
        self.gateway_sessions = GatewaySessions(self.commits, settings, on_delete)

    @classmethod
    async def open(
        cls,
        path: Path | str,
        settings: KernelSettings | None = None,
        *,
        clock: Clock = now_ms,
        direct: bool = False,
        metrics: Metrics | None = None,
        on_delete: Sequence[ScopeDeleter] = (),
    ) -> Kernel:
        """``path``: a SQLite file or a ``postgresql://`` URL (see :func:`open_store`);
        ``direct``: SQLite on the calling thread, for one-shot commands."""
        on_error = metrics.db_errors.inc if metrics else None
        store = await open_store(path, clock=clock, direct=direct, on_error=on_error)
        return await cls.on_store(store, settings, metrics=metrics, on_delete=on_delete)

    @classmethod
    async def on_store(
        cls,
        store: StateStore,
        settings: KernelSettings | None = None,
        *,
        metrics: Metrics | None = None,
        on_delete: Sequence[ScopeDeleter] = (),
        bus: Bus | None = None,
    ) -> Kernel:
        """The kernel over a store already open (which it closes from now on, also when
        this fails)."""
        kernel = cls(
            store, settings or KernelSettings(), metrics=metrics, on_delete=on_delete, bus=bus
        )
        try:
            await kernel._prepare()
        except BaseException:
            await store.close()
            raise
        return kernel

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        """The service's kernel, over a store that is a part of its own (started before,
        closed after): ready once started, its watch of other processes' commits ended
        when ``stack`` closes."""
        await self._prepare()
        stack.push_async_callback(self.changes.close)

    async def _prepare(self) -> None:
        """Read first: opening writes only when there is something to fix."""
        last, legacy = await self.store.read(
            lambda c: (
                retention.last_prune_at(c),
                cursors.any_with_store_path(c, LEGACY_DEFAULT),
            )
        )
        self.retention.next_at = last + retention.PRUNE_INTERVAL_MS
        if legacy:
            await self.commits.write(self._migrate_legacy_store_paths)

    def _migrate_legacy_store_paths(self, conn: Conn) -> int:
        """Cursors an earlier sidecar wrote with the store path "default" get the real one."""
        return cursors.migrate_store_paths(conn, LEGACY_DEFAULT, self.policy.default_store_path)

    async def close(self) -> None:
        await self.changes.close()
        await self.store.close()

    # -- transactions of the layers above ----------------------------------------------

    async def commit(
        self, fn: Callable[[Recorder], T], *, small: bool = False, now: int | None = None
    ) -> T:
        """One write transaction of a layer above (see :meth:`Commits.commit`)."""
        return await self.commits.commit(fn, small=small, now=now)

    async def read(self, fn: Callable[[Conn], T]) -> T:
        """Run ``fn`` on a read snapshot."""
        return await self.store.read(fn)

    # -- recording ---------------------------------------------------------------------

    async def record(self, event: NewEvent) -> Recorded:
        """Validate and record one event; raises :class:`BadInput` or ``StoreError``."""
        now = self.clock()
        draft = event.draft(now)
        return await self.commit(lambda record: record(draft), small=True, now=now)

    async def spawn(self, *, parent: str, child: str, run_id: str) -> Recorded:
        """``child_spawned`` on the child, seeding the parent's cursor at its sequence."""
        parent_key = normalize_key(parent)
        if parse_agent_key(parent_key) is None:
            raise BadInput(f'parent "{parent_key}" is not an agent-qualified session key')
        if not run_id.strip():
            raise BadInput("run id is empty")
        if normalize_key(child) == parent_key:
            raise BadInput("a session cannot spawn itself: parent and child are the same key")
        return await self.record(
            NewEvent(
                session_key=child,
                kind=EventKind.CHILD_SPAWNED,
                actor_type=ActorType.AGENT,
                actor_id=parent_key,
                run_id=run_id,
            )
        )

    # -- watches and notices -----------------------------------------------------------

    async def watch(
        self, *, watcher: str, target: str, store_path: str | None = None, ambient: bool = False
    ) -> bool:
        """Register a watch; ``False`` when the pair cannot be watched (bare keys, self,
        an ambient watch the group scope does not allow)."""
        w, t = normalize_key(watcher), normalize_key(target)
        path = self.policy.store_path(store_path, w)
        if self.policy.why_not_watched(w, t, ambient=ambient):
            return False
        provenance = PROVENANCE_AMBIENT if ambient else PROVENANCE_EXPLICIT
        now = self.clock()

        def run(r: Recorder) -> bool:
            conn = r.conn
            r.watches_changed = cursors.register_watch(
                conn,
                watcher=w,
                target=t,
                store_path=path,
                provenance=provenance,
                now=now,
                head_of=lambda key, agent: read_head(conn, key, agent)[0],
            )
            return r.watches_changed

        return await self.commits.commit(run)

    def why_not_watched(self, watcher: str, target: str, *, ambient: bool = False) -> str | None:
        """The reason a watch of ``target`` by ``watcher`` answers false, in words."""
        return self.policy.why_not_watched(
            normalize_key(watcher), normalize_key(target), ambient=ambient
        )

    def default_store_path(self, key: str) -> str:
        """The store path a watch of ``key`` gets when the caller names none."""
        return self.policy.default_store_path(normalize_key(key))

    async def notices(
        self, *, watcher: str, store_path: str | None = None, drain: bool = False
    ) -> list[Notice]:
        """The watcher's pending stale-state notices (see :meth:`inbox`)."""
        return (await self.inbox(watcher=watcher, store_path=store_path, drain=drain)).notices

    async def inbox(
        self, *, watcher: str, store_path: str | None = None, drain: bool = False
    ) -> Inbox:
        """What the watcher reads: its pending notices and its created-session batch; with
        ``drain`` both are taken in the same transaction (interleaved work reopens exactly
        one notice, seen on the next call)."""
        w = normalize_key(watcher)
        if parse_agent_key(w) is None:
            raise BadInput(f'watcher "{w}" is not an agent-qualified session key')
        path = self.policy.store_path(store_path, w)
        now = self.clock()

        def read(conn: Conn) -> Inbox:
            pending = cursors.list_pending(conn, watcher=w, store_path=path)
            return Inbox([c.notice() for c in pending], created_text(conn, w))

        if not drain:
            return await self.store.peek(read)

        def take(r: Recorder) -> Inbox:
            pending = cursors.list_pending(r.conn, watcher=w, store_path=path)
            r.acknowledge(outbox.acknowledge(r.conn, pending, now))
            return Inbox([c.notice() for c in pending], created_text(r.conn, w, drain=True))

        inbox = await self.commits.commit(take)
        if self.metrics:
            self.metrics.notices_drained.inc(len(inbox.notices))
        return inbox

    async def follow(
        self, *, watcher: str, store_path: str | None = None, after: int | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        """What a follower of the watcher's notices reads next: the notices that opened
        after outbox row ``after`` (even those acknowledged since: a wake accepted a moment
        after the notice opened), then what is pending now; and the row to follow from.
        ``after`` None: the first read, which starts at the newest row."""
        w = normalize_key(watcher)
        if parse_agent_key(w) is None:
            raise BadInput(f'watcher "{w}" is not an agent-qualified session key')
        path = self.policy.store_path(store_path, w)

        def run(conn: Conn) -> tuple[list[dict[str, Any]], int]:
            last = outbox.last_id(conn)
            opened = [] if after is None else outbox.opened_since(conn, w, after)
            pending = cursors.list_pending(conn, watcher=w, store_path=path)
            inbox = Inbox([c.notice() for c in pending], created_text(conn, w))
            seen = [{"target": e.target, "text": e.text} for e in opened]
            return seen + inbox.as_json(), last

        return await self.store.peek(run)

    async def sweep(self) -> list[Notice]:
        """Startup recovery: freeze unfrozen work, then list every pending notice (and wake
        the watchers of those a sidecar opened)."""

        now = self.clock()

        def run(r: Recorder) -> tuple[list[Notice], int]:
            conn = r.conn
            outbox.append(conn, cursors.heal_unfrozen(conn), now)
            every = [c.notice() for c in cursors.list_pending(conn)]
            r.open([c.notice() for c in cursors.list_pending(conn, opened_here=True)])
            undecided = cursors.undecided_legacy(conn)
            r.say(NoticesUndecided(undecided))
            return every, undecided

        pending, self.undecided_notices = await self.commits.commit(run)
        return pending
