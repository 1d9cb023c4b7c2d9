"""The gateway's sessions: what the sidecar knows of them (``PUT /v1/sessions/{key}``), the
hashes of their OpenClaw-side messages (for self-echo), a watcher's reset and a session's
deletion."""

from __future__ import annotations

from monitor.errors import BadInput
from monitor.kernel import cursors, sessions
from monitor.kernel.drafts import make_draft
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.keys import (
    is_internal_key,
    is_main_key,
    main_key_for,
    normalize_key,
    parse_agent_key,
    resolve_agent,
    session_scope,
)
from monitor.kernel.notices import queue_created
from monitor.kernel.sessions import SessionRow
from monitor.kernel.signal_log import delete_session_log

TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from monitor.kernel.commits import Commits
    from monitor.kernel.recorder import Recorder
    from monitor.kernel.settings import KernelSettings
    from monitor.kernel.store.protocol import Conn

    # Deletes a higher layer's rows of a session scope in the kernel's transaction: how a
    # deletion reaches tables the kernel does not own.
    ScopeDeleter = Callable[[Conn, str, tuple[str, ...]], object]


class GatewaySessions:
    """The kernel's known sessions (:attr:`Kernel.gateway_sessions`); it commits through the
    kernel's :class:`~monitor.kernel.commits.Commits`, so a ``created`` event is recorded as
    every event is."""

    def __init__(
        self, commits: Commits, settings: KernelSettings, on_delete: Sequence[ScopeDeleter] = ()
    ) -> None:
        """``on_delete``: what deletes a higher layer's rows of a session scope
        (``keys.session_scope``) in the deletion's transaction (the upstream links)."""
        self.commits = commits
        self.store = commits.store
        self.settings = settings
        self.policy = commits.policy
        self._on_delete = tuple(on_delete)

    async def remember_own_message(
        self, key: str, digest: str, *, agent_id: str | None = None, limit: int | None = None
    ) -> int:
        """Remember an OpenClaw-side user message for self-echo, by its hash (the caller's
        ``adapters.base.own_text_hash``: the kernel knows no adapters); keeps ``limit``."""
        k = normalize_key(key)
        agent = resolve_agent(k, agent_id)
        now = self.store.clock()
        keep = self.settings.own_text_limit if limit is None else limit
        await self.commits.write(
            lambda conn: sessions.remember_own(conn, k, agent, digest, now, keep)
        )
        return keep

    async def upsert(
        self,
        key: str,
        *,
        agent_id: str | None = None,
        session_id: str | None = None,
        store_path: str | None = None,
        run_active: bool | None = None,
    ) -> SessionRow:
        """Create or update what the sidecar knows of a gateway session.

        Creating one (not the main session, not internal, cron or draft) records ``created``
        and queues one bounded "New session created" notice for the agent's main session,
        in the same transaction (``session.notifyOnCreate = false`` turns the notice off).
        """
        k = normalize_key(key)
        agent = resolve_agent(k, agent_id)
        path = self.policy.store_path(store_path, k) if store_path is not None else None
        created_draft = None
        if not is_main_key(k, self.settings.main_key) and not is_internal_key(k):
            created_draft = make_draft(
                session_key=k,
                agent_id=agent,
                kind=EventKind.CREATED,
                actor_type=ActorType.SYSTEM,
                session_id=session_id,
                now=self.store.clock(),
            )
        main = main_key_for(agent, self.settings.main_key)

        def run(record: Recorder) -> SessionRow:
            conn = record.conn
            existed = sessions.write_session_row(
                conn,
                k,
                agent,
                session_id=session_id,
                store_path=path,
                run_active=run_active,
                now=record.now,
            )
            if not existed and created_draft is not None:
                fresh = not record(created_draft).duplicate
                if fresh and self.settings.notify_on_create:
                    queue_created(conn, main, k, record.now)
            row = sessions.read_session(conn, k, agent)
            assert row is not None  # written above, in this transaction
            return row

        return await self.commits.commit(run)

    async def reset(self, key: str) -> None:
        """A watcher's reset: its cursors and self-echo memory go; targets' history stays."""
        k = normalize_key(key)
        if parse_agent_key(k) is None:
            raise BadInput(
                f'"{k}" is a bare key: a reset names one agent-qualified session'
                " (agent:<agentId>:<rest>)"
            )

        def run(r: Recorder) -> None:
            cursors.delete_watcher_cursors(r.conn, k)
            sessions.forget_session_own(r.conn, k)
            r.watches_changed = True

        await self.commits.commit(run)

    async def delete(self, key: str, *, agent_id: str | None = None) -> None:
        """Delete a session: its events, head, cursors on both sides, our rows, and what the
        layers above keep of it (``on_delete``: the upstream link)."""
        k = normalize_key(key)
        if parse_agent_key(k) is None and agent_id is None:
            raise BadInput(
                f'"{k}" is a bare key, a session of every agent: name one with agentId'
                " (--agent on the command line)"
            )
        scope, params = session_scope(k, agent_id)

        def run(r: Recorder) -> None:
            cursors.delete_session_cursors(r.conn, k)
            delete_session_log(r.conn, scope, params)
            sessions.delete_sessions(r.conn, scope, params)
            for deleter in self._on_delete:
                deleter(r.conn, scope, params)
            r.watches_changed = True

        await self.commits.commit(run)
