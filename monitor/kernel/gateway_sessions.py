"""What the sidecar knows of the gateway's sessions (``PUT /v1/sessions/{key}``) and the
hashes of their OpenClaw-side messages (for self-echo)."""

from __future__ import annotations

from monitor.kernel import sessions
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.keys import (
    is_internal_key,
    is_main_key,
    main_key_for,
    normalize_key,
    resolve_agent,
)
from monitor.kernel.sessions import SessionRow
from monitor.kernel.signal_log import make_draft, record_event

TYPE_CHECKING = False

if TYPE_CHECKING:
    from monitor.kernel.notices import CreatedNotices
    from monitor.kernel.policy import WatchPolicy
    from monitor.kernel.settings import KernelSettings
    from monitor.kernel.store.protocol import Conn, StateStore


class GatewaySessions:
    """The kernel's known sessions (the :class:`~monitor.kernel.kernel.Kernel` offers each
    method as its own)."""

    def __init__(
        self,
        store: StateStore,
        settings: KernelSettings,
        policy: WatchPolicy,
        created_notices: CreatedNotices,
    ) -> None:
        self.store = store
        self.settings = settings
        self.policy = policy
        self.created_notices = created_notices

    async def remember_own_message(
        self, key: str, digest: str, *, agent_id: str | None = None, limit: int | None = None
    ) -> int:
        """Remember an OpenClaw-side user message for self-echo, by its hash (the caller's
        ``adapters.base.own_text_hash``: the kernel knows no adapters); keeps ``limit``."""
        k = normalize_key(key)
        agent = resolve_agent(k, agent_id)
        now = self.store.clock()
        keep = self.settings.own_text_limit if limit is None else limit
        await self.store.write(
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
        and queues one bounded "New session created" notice for the agent's main session.
        """
        k = normalize_key(key)
        agent = resolve_agent(k, agent_id)
        path = self.policy.store_path(store_path, k) if store_path is not None else None
        now = self.store.clock()
        created_draft = None
        if not is_main_key(k, self.settings.main_key) and not is_internal_key(k):
            created_draft = make_draft(
                session_key=k,
                agent_id=agent,
                kind=EventKind.CREATED,
                actor_type=ActorType.SYSTEM,
                session_id=session_id,
                now=now,
            )

        def run(conn: Conn) -> tuple[SessionRow, bool]:
            existed = sessions.write_session_row(
                conn,
                k,
                agent,
                session_id=session_id,
                store_path=path,
                run_active=run_active,
                now=now,
            )
            created = not existed and created_draft is not None
            if created and created_draft is not None:
                created = not record_event(conn, created_draft, now).duplicate
            row = sessions.read_session(conn, k, agent)
            assert row is not None  # written above, in this transaction
            return row, created

        info, created = await self.store.write(run)
        if created and self.settings.notify_on_create:
            self.created_notices.add(main_key_for(agent, self.settings.main_key), k)
        return info
