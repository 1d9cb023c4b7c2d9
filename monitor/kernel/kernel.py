"""The kernel's facade: policy and orchestration over the store, and no SQL of its own.

The CLI, the HTTP API and the upstream monitor all call this; none reimplements its logic.
Each method is one transaction; each table's SQL lives in the module that owns it
(:mod:`signal_log`, :mod:`cursors`, :mod:`sessions`, :mod:`retention`). A layer above that
owns tables of its own (the upstream monitor's links) joins a transaction through
:meth:`Kernel.commit`, and has its rows deleted with a session through ``on_delete``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from monitor.clock import Clock, now_ms
from monitor.errors import BadInput, SessionwatchError
from monitor.kernel import cursors, retention, sessions
from monitor.kernel.changes import ChangeHub
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.gateway_sessions import GatewaySessions
from monitor.kernel.keys import (
    normalize_key,
    parse_agent_key,
    session_scope,
)
from monitor.kernel.notices import (
    PROVENANCE_AMBIENT,
    PROVENANCE_EXPLICIT,
    CreatedNotices,
    Notice,
)
from monitor.kernel.policy import WatchPolicy
from monitor.kernel.settings import KernelSettings
from monitor.kernel.signal_log import (
    EventDraft,
    NewEvent,
    Recorded,
    delete_session_log,
    read_head,
    record_event,
)
from monitor.kernel.store import open_store
from monitor.kernel.views import Views
from monitor.kernel.watcher_stores import LEGACY_DEFAULT, StorePathRule
from monitor.lazylog import LazyLogger

TYPE_CHECKING = False

if TYPE_CHECKING:
    from pathlib import Path
    from typing import TypeVar

    from monitor.kernel.sessions import SessionRow
    from monitor.kernel.store.protocol import Conn, StateStore
    from monitor.metrics import Metrics

log = LazyLogger(__name__)

if TYPE_CHECKING:
    T = TypeVar("T")
    NoticesOpened = Callable[[list[Notice]], None]
    # Deletes a higher layer's rows of a session scope (``keys.session_scope``) in the
    # kernel's transaction: how ``delete`` reaches tables the kernel does not own.
    ScopeDeleter = Callable[[Conn, str, tuple[str, ...]], object]


class Recorder:
    """Records events inside a :meth:`Kernel.commit` transaction; the kernel observes what
    was recorded (metrics, wake calls) once the transaction committed."""

    def __init__(self, conn: Conn, now: int) -> None:
        self.conn = conn
        self.now = now
        self.recorded: list[Recorded] = []

    def __call__(self, draft: EventDraft) -> Recorded:
        result = record_event(self.conn, draft, self.now)
        self.recorded.append(result)
        return result


class Kernel(Views):
    """Signal log, cursors, notices and reconciliation over one state database; its
    read-only answers are :class:`Views`'."""

    def __init__(
        self,
        store: StateStore,
        settings: KernelSettings,
        *,
        on_notices: NoticesOpened | None = None,
        metrics: Metrics | None = None,
        on_delete: Sequence[ScopeDeleter] = (),
        on_watches_changed: Callable[[], None] | None = None,
    ) -> None:
        """``on_notices``: called after a commit with the notices it opened or reopened, and
        with those a sidecar opened that the sweep found (the service's delivery, which
        wakes whom they concern). ``on_watches_changed``: called after a commit that may
        have changed which sessions are watched (a watch, a spawn, an ambient watch, a reset
        or a deletion); the service re-arms file watching with it, whoever asked."""
        self.store = store
        self.settings = settings
        self.clock: Clock = store.clock
        self.created_notices = CreatedNotices()
        self.changes = ChangeHub(store)  # the one watcher of the store's changes
        self.metrics = metrics
        self._on_notices = on_notices
        self._on_delete = tuple(on_delete)
        self._watches_changed = on_watches_changed
        self._next_prune_at = 0
        # pending notices an upgrade could not tell from the gateway's own (see sweep)
        self.undecided_notices = 0
        self.policy = WatchPolicy(
            main_key=settings.main_key,
            group_scope=settings.group_scope,
            rule=StorePathRule.for_database(
                None if store.shared else store.path, settings.store_path_template
            ),
        )
        self._gateway_sessions = GatewaySessions(store, settings, self.policy, self.created_notices)

    @classmethod
    async def open(
        cls,
        path: Path | str,
        settings: KernelSettings | None = None,
        *,
        clock: Clock = now_ms,
        direct: bool = False,
        metrics: Metrics | None = None,
        on_notices: NoticesOpened | None = None,
        on_delete: Sequence[ScopeDeleter] = (),
        on_watches_changed: Callable[[], None] | None = None,
    ) -> Kernel:
        """``path``: a SQLite file or a ``postgresql://`` URL (see :func:`open_store`);
        ``direct``: SQLite on the calling thread, for one-shot commands."""
        store = await open_store(
            path, clock=clock, direct=direct, on_error=metrics.db_errors.inc if metrics else None
        )
        return await cls.on_store(
            store,
            settings,
            metrics=metrics,
            on_notices=on_notices,
            on_delete=on_delete,
            on_watches_changed=on_watches_changed,
        )

    @classmethod
    async def on_store(
        cls,
        store: StateStore,
        settings: KernelSettings | None = None,
        *,
        metrics: Metrics | None = None,
        on_notices: NoticesOpened | None = None,
        on_delete: Sequence[ScopeDeleter] = (),
        on_watches_changed: Callable[[], None] | None = None,
    ) -> Kernel:
        """The kernel over a store already open (which it closes from now on, also when
        this fails): the service opens the store first, for the delivery it hands
        ``on_notices``."""
        kernel = cls(
            store,
            settings or KernelSettings(),
            on_notices=on_notices,
            metrics=metrics,
            on_delete=on_delete,
            on_watches_changed=on_watches_changed,
        )
        try:  # read first: opening writes only when there is something to fix
            last, legacy = await store.read(
                lambda c: (
                    retention.last_prune_at(c),
                    cursors.any_with_store_path(c, LEGACY_DEFAULT),
                )
            )
            if legacy:
                await store.write(kernel._migrate_legacy_store_paths)
        except BaseException:
            await store.close()
            raise
        kernel._next_prune_at = last + retention.PRUNE_INTERVAL_MS
        return kernel

    def _migrate_legacy_store_paths(self, conn: Conn) -> int:
        """Cursors an earlier sidecar wrote with the store path "default" get the real one."""
        return cursors.migrate_store_paths(conn, LEGACY_DEFAULT, self.policy.default_store_path)

    async def close(self) -> None:
        await self.changes.close()
        await self.store.close()

    # -- transactions of the layers above ----------------------------------------------

    async def commit(self, fn: Callable[[Recorder], T]) -> T:
        """Run ``fn`` as one write transaction (``recorder.conn``): the events it records
        through the recorder commit with whatever else it writes, and are observed after."""
        now = self.clock()
        recorders: list[Recorder] = []

        def run(conn: Conn) -> T:
            recorder = Recorder(conn, now)
            recorders[:] = [recorder]  # a retried transaction starts a fresh recorder
            return fn(recorder)

        result = await self.store.write(run)
        self._observe(recorders[0].recorded if recorders else [])
        if recorders and recorders[0].recorded:
            await self._maybe_prune(now)
        return result

    def _observe(self, recorded: list[Recorded]) -> None:
        """After a commit: count what was recorded, and hand on the notices it opened."""
        fresh = [r for r in recorded if not r.duplicate]
        if self.metrics:
            for r in fresh:
                self.metrics.recorded(r.event.kind, len(r.notices))
        self._opened([n for r in fresh for n in r.notices])

    def _opened(self, notices: list[Notice]) -> None:
        if notices and self._on_notices is not None:
            self._on_notices(notices)

    async def read(self, fn: Callable[[Conn], T]) -> T:
        """Run ``fn`` on a read snapshot."""
        return await self.store.read(fn)

    # -- recording ---------------------------------------------------------------------

    async def record(self, event: NewEvent) -> Recorded:
        """Validate and record one event; raises :class:`BadInput` or ``StoreError``."""
        now = self.clock()
        draft = event.draft(now)
        row = draft.row
        watcher = row.actor_id if row.kind == EventKind.CHILD_SPAWNED else None
        ambient = self.policy.ambient_watcher(
            EventKind(row.kind), ActorType(row.actor_type), row.session_key, row.agent_id
        )
        if ambient is not None:
            watcher = ambient
            draft = draft._replace(ambient_watcher=ambient)
        if watcher is not None:
            path = self.policy.default_store_path(watcher)
            draft = draft._replace(watcher_store_path=path)
        result = await self.store.write(lambda conn: record_event(conn, draft, now), small=True)
        self._observe([result])
        if watcher is not None and not result.duplicate:
            self._changed()
        await self._maybe_prune(now)
        return result

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
        watched = await self.store.write(
            lambda conn: cursors.register_watch(
                conn,
                watcher=w,
                target=t,
                store_path=path,
                provenance=provenance,
                now=now,
                head_of=lambda key, agent: read_head(conn, key, agent)[0],
            )
        )
        if watched:
            self._changed()
        return watched

    def why_not_watched(self, watcher: str, target: str, *, ambient: bool = False) -> str | None:
        """The reason a watch of ``target`` by ``watcher`` answers false, in words."""
        return self.policy.why_not_watched(
            normalize_key(watcher), normalize_key(target), ambient=ambient
        )

    def _changed(self) -> None:
        if self._watches_changed is not None:
            self._watches_changed()

    def default_store_path(self, key: str) -> str:
        """The store path a watch of ``key`` gets when the caller names none."""
        return self.policy.default_store_path(normalize_key(key))

    async def notices(
        self, *, watcher: str, store_path: str | None = None, drain: bool = False
    ) -> list[Notice]:
        """The watcher's pending notices; with ``drain`` they are acknowledged in the same
        transaction (interleaved work reopens exactly one notice, seen on the next call)."""
        w = normalize_key(watcher)
        if parse_agent_key(w) is None:
            raise BadInput(f'watcher "{w}" is not an agent-qualified session key')
        path = self.policy.store_path(store_path, w)
        now = self.clock()

        reopened: list[Notice] = []

        def run(conn: Conn) -> list[Notice]:
            pending = cursors.list_pending(conn, watcher=w, store_path=path)
            if drain:
                reopened[:] = cursors.acknowledge(conn, pending, now)
            return [c.notice() for c in pending]

        notices = await (self.store.write(run) if drain else self.store.peek(run))
        if drain and self.metrics:
            self.metrics.notices_drained.inc(len(notices))
        self._opened(reopened)
        return notices

    async def sweep(self) -> list[Notice]:
        """Startup recovery: freeze unfrozen work, then list every pending notice (and wake
        the watchers of those a sidecar opened)."""

        def run(conn: Conn) -> tuple[list[Notice], list[Notice], int]:
            cursors.heal_unfrozen(conn)
            every = [c.notice() for c in cursors.list_pending(conn)]
            ours = [c.notice() for c in cursors.list_pending(conn, opened_here=True)]
            return every, ours, cursors.undecided_legacy(conn)

        pending, ours, self.undecided_notices = await self.store.write(run)
        self._opened(ours)
        return pending

    # -- the gateway's sessions ----------------------------------------------------------

    async def upsert_session(
        self,
        key: str,
        *,
        agent_id: str | None = None,
        session_id: str | None = None,
        store_path: str | None = None,
        run_active: bool | None = None,
    ) -> SessionRow:
        """Create or update what the sidecar knows of a gateway session (see
        :meth:`GatewaySessions.upsert`)."""
        return await self._gateway_sessions.upsert(
            key,
            agent_id=agent_id,
            session_id=session_id,
            store_path=store_path,
            run_active=run_active,
        )

    async def remember_own_message(
        self, key: str, digest: str, *, agent_id: str | None = None, limit: int | None = None
    ) -> int:
        """Remember an OpenClaw-side user message for self-echo, by its hash (see
        :meth:`GatewaySessions.remember_own_message`)."""
        return await self._gateway_sessions.remember_own_message(
            key, digest, agent_id=agent_id, limit=limit
        )

    # -- lifecycle of sessions ---------------------------------------------------------

    async def reset(self, key: str) -> None:
        """A watcher's reset: its cursors and self-echo memory go; targets' history stays."""
        k = normalize_key(key)

        def run(conn: Conn) -> None:
            cursors.delete_watcher_cursors(conn, k)
            sessions.forget_session_own(conn, k)

        await self.store.write(run)
        self._changed()

    async def delete(self, key: str, *, agent_id: str | None = None) -> None:
        """Delete a session: its events, head, cursors on both sides, our rows, and what the
        layers above keep of it (``on_delete``: the upstream link)."""
        k = normalize_key(key)
        scope, params = session_scope(k, agent_id)

        def run(conn: Conn) -> None:
            cursors.delete_session_cursors(conn, k)
            delete_session_log(conn, scope, params)
            sessions.delete_sessions(conn, scope, params)
            for deleter in self._on_delete:
                deleter(conn, scope, params)

        await self.store.write(run)
        self._changed()

    async def prune(self, now: int | None = None) -> retention.PruneResult:
        at = self.clock() if now is None else now
        result = await self.store.write(lambda conn: retention.prune(conn, at))
        self._next_prune_at = at + retention.PRUNE_INTERVAL_MS
        return result

    async def maybe_prune(self) -> None:
        """Retention, when an hour has passed since the last: after each recording, and from
        the service's tick loop, so that a log others write to (the gateway) is pruned too."""
        await self._maybe_prune(self.clock())

    async def _maybe_prune(self, now: int) -> None:
        if now < self._next_prune_at:
            return
        self._next_prune_at = now + retention.PRUNE_INTERVAL_MS
        try:
            await self.prune(now)
        except SessionwatchError as exc:
            log.warning("retention failed: %s", exc)
