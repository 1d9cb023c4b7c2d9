"""The kernel's rules that need no database: who watches whom ambiently, which store path a
watch names, and whom a notice wakes."""

from __future__ import annotations

from monitor.errors import BadInput
from monitor.kernel.events import ActorType, EventKind
from monitor.kernel.keys import is_group_key, is_subagent_key, main_key_for, parse_agent_key
from monitor.kernel.notices import Notice
from monitor.kernel.watcher_stores import StorePathRule
from monitor.records import NamedTuple

TYPE_CHECKING = False

if TYPE_CHECKING:
    from monitor.kernel.events import StateEvent

MAX_STORE_PATH = 4096


class EventRoute(NamedTuple):
    """What recording an event does besides storing it, as the watch policy decides
    (``WatchPolicy.route``): ``seed``, a spawn's parent, starts watching the child from this
    event; ``ambient``, an agent's main session, starts watching a group ambiently; either
    cursor names ``store_path``, the watcher's store."""

    seed: str | None = None
    ambient: str | None = None
    store_path: str | None = None

    @property
    def arms_watch(self) -> bool:
        """Recording it arms a cursor: which sessions are watched may change."""
        return self.store_path is not None and (self.seed or self.ambient) is not None


NO_ROUTE = EventRoute()  # most events: stored, and their watchers' cursors moved


class WatchPolicy:
    """``main_key`` and ``group_scope`` as configured (``[session]``); store paths by
    ``rule`` (see :mod:`monitor.kernel.watcher_stores`)."""

    def __init__(self, *, main_key: str, group_scope: str, rule: StorePathRule) -> None:
        self.main_key = main_key
        self.group_scope = group_scope
        self.rule = rule

    def ambient_watcher(self, kind: str, actor: str, key: str, agent_id: str) -> str | None:
        """A group session's human turn makes the agent's main session watch it ambiently:
        that main session, else None. ``kind`` and ``actor`` as stored: a member of
        :class:`EventKind` or :class:`ActorType` equals its value, so no member is looked up
        for each event recorded."""
        if (
            self.group_scope == "per-group"
            and kind == EventKind.HUMAN_DIRECT_MESSAGE
            and actor == ActorType.HUMAN
            and is_group_key(key)
        ):
            return main_key_for(agent_id, self.main_key)
        return None

    def route(self, row: StateEvent) -> EventRoute:
        """What recording ``row`` does besides storing it, whoever records it: a spawn seeds
        the parent's cursor, a group's human turn arms its agent's main session's ambient
        watch; either watcher's cursor names its default store path. The recorder acts on
        it, and what it armed becomes the commit's changes."""
        ambient = self.ambient_watcher(row.kind, row.actor_type, row.session_key, row.agent_id)
        if ambient is not None:
            return EventRoute(ambient=ambient, store_path=self.default_store_path(ambient))
        if row.kind == EventKind.CHILD_SPAWNED and row.actor_id:
            return EventRoute(seed=row.actor_id, store_path=self.default_store_path(row.actor_id))
        return NO_ROUTE

    def why_not_watched(self, watcher: str, target: str, *, ambient: bool = False) -> str | None:
        """Why ``watcher`` cannot watch ``target``, in words; None when it can."""
        for role, key in (("watcher", watcher), ("target", target)):
            if parse_agent_key(key) is None:
                return f'the {role} "{key}" is not an agent-qualified key (agent:<agentId>:<rest>)'
        if watcher == target:
            return "a session does not watch itself"
        if ambient and not self.ambient_allowed(watcher, target):
            return (
                "an ambient watch needs [session] group_scope per-group, the agent's main"
                " session as watcher and a group session as target"
            )
        return None

    def ambient_allowed(self, watcher: str, target: str) -> bool:
        target_key = parse_agent_key(target)
        if self.group_scope != "per-group" or target_key is None:
            return False
        main = main_key_for(target_key.agent_id, self.main_key)
        return watcher == main and target != main and is_group_key(target)

    def store_path(self, store_path: str | None, key: str) -> str:
        """The explicit store path, else the watcher's default."""
        if store_path is None or not store_path.strip():
            return self.default_store_path(key)
        path = store_path.strip()
        if len(path) > MAX_STORE_PATH or any(ch in path for ch in "\r\n\x00"):
            raise BadInput(f"store path must be one line of at most {MAX_STORE_PATH} characters")
        if not path.startswith("/") or "/../" in f"{path}/":
            # the gateway's session stores are absolute paths; a relative one would mean
            # a different store from each working directory
            raise BadInput(f"store path must be an absolute path without '..': {path!r}")
        return path

    def default_store_path(self, key: str) -> str:
        parsed = parse_agent_key(key)
        # A bare key never holds a cursor, so it has no store to name.
        return self.rule.resolve(parsed.agent_id) if parsed else ""

    @staticmethod
    def wakes(notice: Notice) -> bool:
        """Every explicit watcher that is not a sub-agent is woken (a main session, or a
        coordinator that watched a peer); sub-agent and ambient watchers are not."""
        return not notice.queue_only and not is_subagent_key(notice.watcher)
