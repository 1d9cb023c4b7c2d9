"""The one way an event is recorded: inside a transaction, routed by the watch policy."""

from __future__ import annotations

from monitor.kernel.signal_log import record_event

TYPE_CHECKING = False

if TYPE_CHECKING:
    from monitor.kernel.policy import WatchPolicy
    from monitor.kernel.signal_log import EventDraft, Recorded
    from monitor.kernel.store.protocol import Conn


class Recorder:
    """Records events inside a :meth:`Kernel.commit` transaction, each routed by the watch
    policy; the kernel observes what was recorded once the transaction committed."""

    conn: Conn  # the transaction's connection, from :meth:`start`

    def __init__(self, now: int, policy: WatchPolicy) -> None:
        self.now = now
        self.recorded: list[Recorded] = []
        self.watches_changed = False  # a spawn or an ambient watch armed a cursor
        self._policy = policy

    def begin(self, conn: Conn) -> None:
        """A transaction begins on ``conn``; one that is retried starts afresh."""
        self.conn = conn
        self.recorded = []
        self.watches_changed = False

    def __call__(self, draft: EventDraft) -> Recorded:
        route = self._policy.route(draft.row)  # the policy's decision, acted on here
        result = record_event(self.conn, draft, self.now, route)
        self.recorded.append(result)
        if route.arms_watch and not result.duplicate:
            self.watches_changed = True  # a change of the commit's (Commits publishes it)
        return result
