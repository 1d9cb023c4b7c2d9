"""The ``[session]`` settings the kernel obeys, read from the configuration; the kernel and
its halves import them from here, and nothing here imports them back."""

from __future__ import annotations

from monitor.records import NamedTuple

TYPE_CHECKING = False

if TYPE_CHECKING:
    from monitor.config import Config


class KernelSettings(NamedTuple):
    """The ``[session]`` settings the kernel obeys."""

    main_key: str = "main"
    group_scope: str = "per-group"
    notify_on_create: bool = True
    store_path_template: str = ""  # ``[session] store_path``; see monitor.kernel.store_paths
    own_text_limit: int = 10  # own messages remembered per session for self-echo
    # the SQLite file's name, where the store opened it under another (a new database made
    # beside it): where OpenClaw's layout is read from (see monitor.kernel.watcher_stores)
    database_name: str = ""

    @classmethod
    def of(cls, config: Config) -> KernelSettings:
        session = config.session
        return cls(
            main_key=session.main_key,
            group_scope=session.group_scope,
            notify_on_create=session.notify_on_create,
            store_path_template=session.store_path,
            own_text_limit=config.monitor.own_text_limit,
        )
