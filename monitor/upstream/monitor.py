"""The upstream monitor: the upstream parts over one set of adapters built from the
registry (:class:`~monitor.upstream.configured.Adapters`), and link administration. Each
part is called as itself, never through a name given here: ``monitor.ticker`` runs ticks
(a part of the service of its own), ``monitor.sessions`` is the catalog, ``monitor.adoption``
adopts; the monitor lists, counts and unlinks links, and replaces the adapters on a reload.

Per link, what a tick found is settled in one transaction (:mod:`monitor.upstream.settle`):
the ``human_direct_message`` (or ``upstream_missing``) event and the marker (or link
deletion) that depends on it commit together, compare-and-set against the link as it was
when the scan began.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from adapters.base import Adapter
from adapters.registry import entry
from monitor.config import Config, NodeConfig, RootsConfig
from monitor.kernel import Kernel
from monitor.kernel.bus import ConfigReloaded, LinksChanged, WatchedMayDiffer
from monitor.kernel.cursors import watched_targets
from monitor.kernel.keys import normalize_key, session_scope
from monitor.upstream import links
from monitor.upstream.adoption import Adoption
from monitor.upstream.configured import Adapters
from monitor.upstream.links import SessionDoing, UpstreamLink
from monitor.upstream.session_catalog import SessionCatalog
from monitor.upstream.tick import Ticker, TickSettings

if TYPE_CHECKING:
    from contextlib import AsyncExitStack

    from monitor.kernel.bus import Bus
    from monitor.kernel.recorder import Recorder
    from monitor.metrics import Metrics  # prometheus_client: the service's, not a command's


class UpstreamMonitor:
    """The upstream parts over one set of adapters, and the links' administration."""

    bus: Bus  # handed at start (a one-shot command's monitor is never started)
    configured: tuple[RootsConfig, Mapping[str, NodeConfig]] | None = None  # built from these
    quiet_after_s = 600.0  # a turn with no record read for this long reads as quiet

    def __init__(
        self,
        kernel: Kernel,
        adapters: Mapping[str, Adapter],
        settings: TickSettings,
        *,
        metrics: Metrics | None = None,
    ) -> None:
        self.kernel = kernel
        self.adapters = adapters = Adapters(adapters)  # the one holder the parts read
        from monitor.openclaw.files import gateway_transcripts

        # next to OpenClaw, on its own store
        transcripts = gateway_transcripts(None if kernel.store.shared else kernel.store.path)
        self.ticker = Ticker(
            kernel,
            adapters,
            settings,
            metrics,
            gateway_texts=transcripts.recent if transcripts else None,
            gateway_session=transcripts.session_id if transcripts else None,
        )
        self.sessions = SessionCatalog(kernel, adapters)
        self.adoption = Adoption(kernel, adapters, self.sessions, host=settings.host)

    @classmethod
    def from_config(
        cls,
        kernel: Kernel,
        config: Config,
        *,
        metrics: Metrics | None = None,
    ) -> UpstreamMonitor:
        m = config.monitor
        monitor = cls(
            kernel,
            Adapters.of(config),
            TickSettings(
                budget_s=m.adapter_budget_s,
                missing_threshold=m.missing_threshold,
                own_text_limit=m.own_text_limit,
                host=config.host.effective,
            ),
            metrics=metrics,
        )
        monitor.configured = (config.roots, config.nodes)
        monitor.quiet_after_s = m.quiet_after_s
        return monitor

    # -- links -------------------------------------------------------------------------

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        """Hear its section of each reload until ``stack`` closes."""
        self.bus = bus
        stack.enter_context(bus.subscribe(ConfigReloaded, self._reloaded))

    def live_fields(self, new: Config) -> tuple[str, ...]:
        """The roots and the nodes apply live: the adapters are built again from them. New
        ones the formats refuse refuse the file (raised here, before any part applies it)."""
        if (new.roots, new.nodes) != self.configured:
            Adapters.of(new)
        return ("roots", "nodes", "monitor.quiet_after_s")

    def _reloaded(self, change: ConfigReloaded) -> None:
        """Its sections of a reload: the roots and the nodes (checked before it was
        published: a failure here is a bug, said by the bus)."""
        old, new = change.old, change.new
        if (old.roots, old.nodes) != (new.roots, new.nodes):
            self.reconfigure(new)
        self.quiet_after_s = new.monitor.quiet_after_s

    def reconfigure(self, config: Config) -> None:
        """New roots and nodes: the adapters are built again and replace the old whole
        (a tick in flight finishes with the adapters it started with)."""
        self.adapters.replace(Adapters.of(config))
        self.configured = (config.roots, config.nodes)
        self.bus.publish(WatchedMayDiffer())

    def now(self) -> links.Now:
        """The time a listing reads what sessions are doing at (the store's clock)."""
        return links.Now(self.kernel.clock(), int(self.quiet_after_s * 1000))

    async def links(self) -> list[links.LinkView]:
        now = self.now()
        return await self.kernel.read(lambda c: links.list_links(c, watched_targets(c), now))

    async def doing(self, states: frozenset[str]) -> list[SessionDoing]:
        """The adopted sessions doing one of ``states`` now (all, when empty), the longest
        first."""
        now = self.now()
        return await self.kernel.read(lambda c: links.sessions_doing(c, states, now))

    async def doing_hours(self, keys: list[str]) -> dict[str, tuple[str | None, ...]]:
        """What each of ``keys`` was doing most of each of the last 24 hours."""
        now = self.now().at
        return await self.kernel.read(lambda c: links.doing_hours(c, keys, now))

    async def doing_versions(self, states: frozenset[str]) -> list[tuple[SessionDoing, int]]:
        """:meth:`doing`, each with its state version (0: no event yet), in one read."""
        now = self.now()
        return await self.kernel.read(lambda c: links.doing_versions(c, states, now))

    async def fingerprint(self) -> int:
        """Moves when a link or its state does (see :func:`links.fingerprint`)."""
        return await self.kernel.read(links.fingerprint)

    async def _watched(self) -> list[tuple[UpstreamLink, Adapter]]:
        """The watched links an adapter of ours reads, each with its adapter."""
        found = []
        for view in await self.links():
            link = view.link
            adapter = self.adapters.get(link.kind) if link.kind else None
            if adapter is not None and view.watched:
                found.append((link, adapter))
        return found

    async def watched_paths(self) -> dict[str, set[str]]:
        """Local file -> the session keys of the watched links whose early check its change
        wakes (each adapter names its files: a transcript, an OpenCode database's WAL)."""
        by_path: dict[str, set[str]] = {}
        watched = await self._watched()
        refs = await self.kernel.read(
            lambda c: self.ticker.gateway_bound(c, [link for link, _ in watched]).refs
        )
        for link, adapter in watched:
            for path in adapter.watched_paths(refs.get(link.key, link.ref)):
                by_path.setdefault(path, set()).add(link.session_key)
        return by_path

    async def watched_nodes(self) -> dict[str, set[str]]:
        """Paired node -> the session keys of the watched links on it, whose early check a
        change the node reports wakes (:mod:`monitor.serve.node_watch`)."""
        by_node: dict[str, set[str]] = {}
        if not self.ticker.holds_shared():  # another sidecar ticks them, and hears their feeds
            return by_node
        for link, _ in await self._watched():
            if link.kind and entry(link.kind).remote:
                by_node.setdefault(str(link.ref.get("nodeId", "")), set()).add(link.session_key)
        return by_node

    async def unlink(self, session_key: str, *, agent_id: str | None = None) -> bool:
        """Remove a session's link (all agents' for a bare key without ``agent_id``)."""
        scope, params = session_scope(normalize_key(session_key), agent_id)

        def run(record: Recorder) -> int:
            removed = links.delete_links(record.conn, scope, params)
            if removed:
                record.say(LinksChanged())
            return removed

        return await self.kernel.commit(run) > 0

    async def blocked_count(self) -> int:
        return await self.kernel.read(links.blocked_count)
