"""The one way an event is recorded: inside a transaction, routed by the watch policy."""

from __future__ import annotations

from monitor.kernel.signal_log import record_event

TYPE_CHECKING = False

if TYPE_CHECKING:
    from monitor.kernel.bus import Change
    from monitor.kernel.drafts import EventDraft, Recorded
    from monitor.kernel.notices import Notice
    from monitor.kernel.policy import WatchPolicy
    from monitor.kernel.store.protocol import Conn


class Recorder:
    """Records events inside a :meth:`Kernel.commit` transaction, each routed by the watch
    policy, and what else the transaction changed that the parts act on (notices opened or
    acknowledged, watches); :class:`~monitor.kernel.commits.Commits` publishes all of it
    once the transaction committed, and nothing of a transaction that did not."""

    conn: Conn  # the transaction's connection, from :meth:`start`

    def __init__(self, now: int, policy: WatchPolicy) -> None:
        self.now = now
        self.recorded: list[Recorded] = []
        self.watches_changed = False  # a spawn or an ambient watch armed a cursor
        self.opened: list[Notice] = []  # notices opened other than by an event
        self.acknowledged: list[Notice] | None = None  # what an acknowledgement reopened
        self.said: list[Change] = []  # other changes the transaction names
        self._policy = policy

    def begin(self, conn: Conn) -> None:
        """A transaction begins on ``conn``; one that is retried starts afresh."""
        self.conn = conn
        self.recorded = []
        self.watches_changed = False
        self.opened = []
        self.acknowledged = None
        self.said = []

    def fresh(self) -> list[Recorded]:
        """The events recorded that were not duplicates."""
        return [r for r in self.recorded if not r.duplicate]

    def all_opened(self, fresh: list[Recorded]) -> list[Notice]:
        """Every notice the transaction opened: by its ``fresh`` events, otherwise, and
        again by an acknowledgement."""
        return [n for r in fresh for n in r.notices] + self.opened + (self.acknowledged or [])

    def open(self, notices: list[Notice]) -> None:
        """Notices this transaction opened other than by an event (found at start-up)."""
        self.opened.extend(notices)

    def say(self, change: Change) -> None:
        """A change of this transaction's that no other method names, published after it
        committed (:class:`~monitor.kernel.bus.NoticesUndecided`, say)."""
        self.said.append(change)

    def acknowledge(self, reopened: list[Notice]) -> None:
        """This transaction acknowledged notices (``outbox.acknowledge``: a drain, a wake
        the gateway accepted): what is pending changed, and ``reopened`` (work that came
        after a notice froze) opened."""
        self.acknowledged = [*(self.acknowledged or []), *reopened]

    def __call__(self, draft: EventDraft) -> Recorded:
        route = self._policy.route(draft.row)  # the policy's decision, acted on here
        result = record_event(self.conn, draft, self.now, route)
        self.recorded.append(result)
        if route.arms_watch and not result.duplicate:
            self.watches_changed = True  # a change of the commit's (Commits publishes it)
        return result
