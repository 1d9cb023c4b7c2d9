"""The tick: load the watched links, skip what must not be checked, check the rest under
the adapter budget (one batch per kind, the kinds concurrently), settle what changed.

A quiet link whose marker and state did not change costs no transaction of its own: all of
them are stamped in one. Why a link was skipped is noted for ``links`` when it changes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from adapters.base import Adapter, Follow, GatewayBound, Marker, Outcome, Probe, own_text_hash
from adapters.registry import GATEWAY_HOST_PREFIX, LOCAL_HOST, entry
from monitor.errors import SessionwatchError, StoreError, StoreLocked, StoreUnavailable
from monitor.kernel import Kernel
from monitor.kernel import leases as lease_rows
from monitor.kernel.bus import OwnershipChanged, WatchedMayDiffer
from monitor.kernel.cursors import watched_targets
from monitor.kernel.leases import SHARED as SHARED_LEASE
from monitor.kernel.recorder import Recorder
from monitor.kernel.sessions import SessionFlags, all_session_flags, recent_own
from monitor.upstream import links
from monitor.upstream.bindings import NONE, Bound, probe_refs
from monitor.upstream.links import UpstreamLink
from monitor.upstream.settle import BUDGET_EXCEEDED, LinkResult, settle

if TYPE_CHECKING:
    from contextlib import AsyncExitStack

    from monitor.kernel.bus import Bus
    from monitor.kernel.store.protocol import Conn
    from monitor.metrics import Metrics  # prometheus_client: the service's, not a command's

log = logging.getLogger(__name__)

RECHECKS = 3  # rounds for links whose marker another checker moved during a round


@dataclass(frozen=True, kw_only=True, slots=True)
class Snapshot:
    """What a tick reads in one snapshot: the watched links, the known sessions' id and run
    flag, each session's recent own messages, and the links whose state is not plain."""

    links: list[UpstreamLink]
    sessions: dict[tuple[str, str], SessionFlags]
    own: dict[tuple[str, str], list[tuple[int, str]]]
    stateful: dict[tuple[str, str], str | None]
    bound: Bound  # refs read instead of the links' own, links the gateway is busy with
    follows: dict[tuple[str, str], Follow]  # threads followed beside links, and where
    shared: bool = True  # this sidecar holds ticks:shared now, by the store's clock


@dataclass(frozen=True, kw_only=True, slots=True)
class TickSettings:
    budget_s: float = 45.0  # per adapter and tick
    missing_threshold: int = 3
    own_text_limit: int = 10
    host: str = LOCAL_HOST  # this sidecar's host id: it ticks the file links of this host


# a quiet link's scan time is stamped when its stamp is this old: a tick of 1,000 quiet links
# writes nothing most minutes (``links`` shows the stamp to within this)
STAMP_EVERY_MS = 5 * 60 * 1000


def _stamp_due(link: UpstreamLink, now: int) -> bool:
    return link.last_scanned_at is None or now - link.last_scanned_at >= STAMP_EVERY_MS


def _unchanged(link: UpstreamLink, outcome: Outcome, snapshot: Snapshot) -> bool:
    return (
        outcome.status == "quiet"
        and outcome.marker == link.marker
        and not outcome.reason
        and link.key not in snapshot.stateful
        and (outcome.followed is None or not outcome.followed.news)
    )


def _follows(conn: Conn, linked: list[UpstreamLink], bound: Bound) -> dict[tuple[str, str], Follow]:
    """Each followed thread with the sidecar's marker there, when it is kept for the
    link's current source and that thread."""
    if not bound.follows:
        return {}
    kept = links.load_follows(conn)
    found: dict[tuple[str, str], Follow] = {}
    for link in linked:
        follow = bound.follows.get(link.key)
        if follow is None:
            continue
        thread, beside = follow
        row = kept.get(link.key)
        marker: Marker | None = None
        if row is not None and row[:3] == (link.source_key, thread, beside):
            marker = row[3]
        found[link.key] = Follow(thread, marker, beside)
    return found


def _waiting(link: UpstreamLink, refused: str, kind: str | None) -> LinkResult:
    """A link whose findings the store refused: its marker stays, the next tick reads again."""
    return LinkResult(
        session_key=link.session_key,
        outcome="inconclusive",
        reason=refused,
        adapter=kind,
        unsettled=True,
    )


@dataclass(kw_only=True, slots=True)
class Plan:
    """What a tick does: the links it checks, per kind, and the ones it skips."""

    results: list[LinkResult] = field(default_factory=list)  # the skipped ones', so far
    skipped: list[tuple[UpstreamLink, str]] = field(default_factory=list)  # reasons to note
    batches: dict[str, list[tuple[UpstreamLink, Probe]]] = field(default_factory=dict)


@dataclass(slots=True)
class StoreTakes:
    """Whether the store takes one tick's writes. Once it refuses (locked, down, failing
    every write), the links after it do not wait for it too; one link's own failed write is
    that link's, and a second with none settled between is the store's."""

    refused: str | None = None  # the store's refusal
    failed: str | None = None  # one link's own failed write, with none settled since
    wrote: bool = False  # something was written: a refusal said earlier has ended

    def settled(self, result: LinkResult, *, store_wide: bool) -> None:
        if not result.unsettled:
            self.failed, self.wrote = None, True
        elif store_wide or self.failed is not None:
            self.refused = result.reason  # locked, down, or failing every write
        else:
            self.failed = result.reason  # this link's own; the next ones go on

    def bookkept(self, refusal: str | None) -> None:
        """A bookkeeping write's end: the store's refusal, or None when it was written."""
        if refusal is None:
            self.wrote = True
        else:
            self.refused = refusal


class Ticker:
    """Runs ticks; one at a time."""

    def __init__(
        self,
        kernel: Kernel,
        adapters: Mapping[str, Adapter],
        settings: TickSettings,
        metrics: Metrics | None = None,
        gateway_texts: Callable[[str, str], list[str]] | None = None,
        gateway_session: Callable[[str, str], str | None] | None = None,
    ) -> None:
        """On a shared store the links without a host (OpenCode databases, paired nodes)
        are ticked while this sidecar holds their lease: its leases say so on the bus
        (:class:`~monitor.kernel.bus.OwnershipChanged`), and each tick reads it in the
        store. ``gateway_texts(agent, key)``: the gateway's own recent user texts of a session, read
        from its store next to OpenClaw; each counts as the gateway's (self-echo), as the
        messages a gateway pushes through the API do. ``gateway_session(agent, key)``: the
        session's current id in the gateway's own store, which says whose binding a
        gateway-adopted Codex link probes (:mod:`monitor.upstream.bindings`)."""
        self.gateway_texts = gateway_texts
        self.gateway_session = gateway_session
        self.kernel = kernel
        self.adapters = adapters
        self.settings = settings
        self.metrics = metrics
        self._shared_holder: str | None = None  # our name in ticks:shared, while held
        self._leased = False  # a sidecar's leases say who ticks the links without a host
        self._own_host = f"{GATEWAY_HOST_PREFIX}{settings.host}"
        self._lock = asyncio.Lock()
        self._ambiguous_logged: set[str] = set()
        self.writes = TickWrites(kernel, settings.missing_threshold, metrics)

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        """Hear who ticks the links without a host until ``stack`` closes (started before
        the leases, whose first word it must hear). The tick in flight is waited for by
        whoever runs the ticks (:meth:`done`), before the leases are let go."""
        stack.enter_context(bus.subscribe(OwnershipChanged, self.owned))

    @property
    def busy(self) -> bool:
        """A tick runs."""
        return self._lock.locked()

    async def done(self) -> None:
        """Wait for the tick in flight, if any, to finish."""
        async with self._lock:
            return

    async def tick(self, only: set[str] | None = None) -> list[LinkResult]:
        """One pass over the watched links (or the ``only`` keys among them)."""
        async with self._lock:
            return await self._tick(only)

    def _gateways_own(self, link: UpstreamLink) -> list[tuple[int, str]]:
        """The gateway's recent user texts of the link's session, as own-message hashes; ids
        below zero are in no table, so a match consumes nothing that is stored."""
        if self.gateway_texts is None:
            return []
        texts = self.gateway_texts(link.agent_id, link.session_key)
        return [(-1 - i, own_text_hash(t)) for i, t in enumerate(texts)]

    def _load(self, conn: Conn) -> Snapshot:
        watched = links.load_links(conn, watched_targets(conn))
        sessions = all_session_flags(conn)
        bound = self.gateway_bound(conn, watched, sessions)
        return Snapshot(
            links=watched,
            sessions=sessions,
            own=recent_own(conn, self.settings.own_text_limit),
            stateful=links.stateful_links(conn),
            bound=bound,
            follows=_follows(conn, watched, bound),
            shared=self._holds_shared_now(conn),
        )

    def _holds_shared_now(self, conn: Conn) -> bool:
        """On a shared store, whether the lease of the links without a host is ours, read in
        the tick's own snapshot on the store's clock: a sidecar that was paused past its
        lease stops ticking them before it ticks again, whatever it last heard."""
        if not self.kernel.store.shared or not self._leased:
            return True  # a store of its own, or no leases at all (a one-shot `tick`)
        holder = self._shared_holder
        return holder is not None and lease_rows.holds(conn, SHARED_LEASE, holder)

    def owned(self, change: OwnershipChanged) -> None:
        """This sidecar's leases said who ticks the links without a host."""
        self._leased = True
        self._shared_holder = change.holder if change.shared else None

    def holds_shared(self) -> bool:
        """Whether this sidecar ticks the links without a host, as its leases last said
        (:class:`~monitor.kernel.bus.OwnershipChanged`); a tick checks it in the store.
        With no leases (a store of its own, a one-shot ``tick``), every link is its own."""
        shared = self.kernel.store.shared and self._leased
        return not shared or self._shared_holder is not None

    def gateway_bound(
        self,
        conn: Conn,
        linked: list[UpstreamLink],
        sessions: dict[tuple[str, str], SessionFlags] | None = None,
    ) -> Bound:
        """The refs adapters read instead of the links' own (the thread the gateway probes
        for its Codex links), and the links the gateway is busy with; next to the gateway's
        own store only."""
        lookup = self.gateway_session
        if lookup is None:
            return NONE
        known = all_session_flags(conn) if sessions is None else sessions

        def session_id(link: UpstreamLink) -> str | None:
            assert lookup is not None
            ours = known.get(link.key)
            return lookup(link.agent_id, link.session_key) or (ours[0] if ours else None)

        bound: list[tuple[UpstreamLink, GatewayBound]] = []
        for link in linked:
            adapter = self.adapters.get(link.kind or "")
            if isinstance(adapter, GatewayBound):
                bound.append((link, adapter))
        return probe_refs(conn, bound, session_id, self.kernel.clock()) if bound else NONE

    async def _tick(self, only: set[str] | None) -> list[LinkResult]:
        """One round, then the links another checker moved meanwhile, from their new
        markers (a few rounds at most: the next tick reads what is left)."""
        results = await self._round(only)
        for _ in range(RECHECKS):
            moved = {r.session_key for r in results if r.moved}
            if not moved:
                break
            results = [r for r in results if not r.moved] + await self._round(moved)
        return results

    async def _round(self, only: set[str] | None) -> list[LinkResult]:
        snapshot = await self.kernel.read(self._load)
        plan = self._plan(snapshot, only)
        checked = await asyncio.gather(*(self._check(k, w) for k, w in plan.batches.items()))
        return await self.writes.settle_checked(snapshot, plan, checked)

    def _plan(self, snapshot: Snapshot, only: set[str] | None) -> Plan:
        """Which links this tick checks, per kind, and which it skips, and why."""
        agents_per_key = Counter(link.session_key for link in snapshot.links)
        plan = Plan()
        shared = snapshot.shared
        for link in snapshot.links:
            if only is not None and link.session_key not in only:
                continue
            if not self._ours(link, shared):
                continue  # another host's file, or shared links another sidecar ticks
            skip = snapshot.bound.busy.get(link.key) or self._skip_reason(
                link, agents_per_key, snapshot.sessions
            )
            if skip:
                plan.results.append(
                    LinkResult(session_key=link.session_key, outcome="skipped", reason=skip)
                )
                if not link.foreign and snapshot.stateful.get(link.key) != skip:
                    plan.skipped.append((link, skip))
                continue
            probe = Probe(
                session_key=link.session_key,
                ref=snapshot.bound.refs.get(link.key, link.ref),
                marker=link.marker,
                own=(*snapshot.own.get(link.key, ()), *self._gateways_own(link)),
                # never scanned yet: the marker was set (adopted) at updated_at, so a file
                # rewritten before the first check is re-read for what came after that
                last_scanned_at=link.last_scanned_at or link.updated_at,
                follow=snapshot.follows.get(link.key),
            )
            assert link.kind is not None  # foreign links were skipped
            plan.batches.setdefault(link.kind, []).append((link, probe))
        return plan

    def _ours(self, link: UpstreamLink, shared: bool) -> bool:
        """On a shared store, a file link belongs to the host whose file it is, and a link
        without a host is ticked by whichever sidecar holds the shared lease. A store only
        this sidecar uses is all its own, whatever host id its links were written with.
        Foreign links are skipped (and said so) by whoever looks."""
        if not self.kernel.store.shared or link.kind is None or link.kind not in self.adapters:
            return True
        if entry(link.kind).form == "file":
            return link.host_id == self._own_host
        return shared

    def _skip_reason(
        self,
        link: UpstreamLink,
        agents: Counter[str],
        sessions: dict[tuple[str, str], SessionFlags],
    ) -> str | None:
        if agents[link.session_key] > 1:
            if link.session_key not in self._ambiguous_logged:
                log.warning(
                    "%s is linked under several agents; skipped as ambiguous", link.session_key
                )
                self._ambiguous_logged.add(link.session_key)
            return "ambiguous: linked under several agent ids"
        if link.kind is None:
            return f"foreign: {link.upstream_kind} links are read by the gateway, not by us"
        if link.kind not in self.adapters:
            return f"no adapter for {link.kind}"
        known = sessions.get(link.key)
        if known is None:  # a session we were never told of (a link the gateway wrote)
            return None
        session_id, run_active = known
        if not session_id:
            return "no session id"
        if run_active:
            return "run active"
        return None

    async def _check(
        self, kind: str, works: list[tuple[UpstreamLink, Probe]]
    ) -> tuple[str, list[tuple[UpstreamLink, Probe]], list[Outcome]]:
        try:
            outcomes = await asyncio.wait_for(
                self.adapters[kind].check([probe for _, probe in works]), self.settings.budget_s
            )
            if len(outcomes) != len(works):
                raise SessionwatchError(f"{kind} adapter answered {len(outcomes)} outcomes")
        except TimeoutError:
            outcomes = [Outcome(status="inconclusive", reason=BUDGET_EXCEEDED)] * len(works)
        except Exception as exc:
            log.exception("%s adapter failed", kind)
            outcomes = [Outcome(status="inconclusive", reason=f"adapter failed: {exc}")] * len(
                works
            )
        return kind, works, outcomes


class TickWrites:
    """What a tick writes: each link's findings in a transaction of its own, the quiet
    links' stamps and the skips' reasons in one each; a store that refuses them, and a
    link whose own write fails, said once."""

    def __init__(self, kernel: Kernel, missing_threshold: int, metrics: Metrics | None) -> None:
        self.kernel = kernel
        self.missing_threshold = missing_threshold
        self.metrics = metrics
        self._store_refused: str | None = None  # said once until the store takes a tick again
        self._link_failures: dict[tuple[str, str], str] = {}  # said once per link and reason

    async def settle_checked(
        self,
        snapshot: Snapshot,
        plan: Plan,
        checked: list[tuple[str, list[tuple[UpstreamLink, Probe]], list[Outcome]]],
    ) -> list[LinkResult]:
        """Settle what the checks found, link by link; stamp the quiet ones and note the
        skips in one transaction each; say a refusing store once."""
        results = plan.results
        idle: list[UpstreamLink] = []
        store = StoreTakes()
        for kind, works, outcomes in checked:
            for (link, _), outcome in zip(works, outcomes, strict=True):
                self._count_drift(kind, outcome)
                if _unchanged(link, outcome, snapshot):
                    if _stamp_due(link, self.kernel.clock()):
                        idle.append(link)
                    results.append(
                        LinkResult(session_key=link.session_key, outcome="quiet", adapter=kind)
                    )
                elif store.refused is not None:
                    results.append(_waiting(link, store.refused, kind))
                else:
                    result, store_wide = await self._settle(link, outcome)
                    store.settled(result, store_wide=store_wide)
                    results.append(replace(result, adapter=kind))
        skipped = plan.skipped
        for what, pending, write in (
            ("stamp the scan time of quiet links", idle, lambda c, now: links.touch(c, idle, now)),
            ("note why links were skipped", skipped, lambda c, now: links.note_skips(c, skipped)),
        ):
            if pending and store.refused is None:
                store.bookkept(await self._quietly(what, write))
        self._say_refused(store, sum(r.unsettled for r in results))
        return results

    def _say_refused(self, store: StoreTakes, waiting: int) -> None:
        """A store that refuses the tick's writes (locked by another process, failing) is
        said once, with how many links wait, and its end once: not at every tick."""
        if store.refused is not None:
            if self._store_refused is None:
                log.warning(
                    "the tick's writes wait: %s. %d link(s) with news keep their markers and"
                    " are read again once the state database takes writes (said once)",
                    store.refused,
                    waiting,
                )
            self._store_refused = store.refused
        elif self._store_refused is not None and store.wrote:
            log.warning("the state database takes the tick's writes again")
            self._store_refused = None

    async def _quietly(self, what: str, write: Callable[[Conn, int], None]) -> str | None:
        """A bookkeeping write the next tick redoes if it fails: the store's refusal, if
        it refused (said once by the tick), else None."""
        try:
            await self.kernel.commit(lambda r: write(r.conn, r.now))
        except StoreError as exc:
            return f"could not {what}: {exc}"
        except SessionwatchError as exc:
            log.warning("could not %s: %s", what, exc)
        return None

    async def _settle(self, link: UpstreamLink, outcome: Outcome) -> tuple[LinkResult, bool]:
        """The link's result, and whether a refusal was the whole store's: locked by
        another process or unreachable. Any other failed write (a constraint, a trigger)
        is first taken as this link's own: said once for the link, its marker stays, and
        the tick goes on; a second in a row means the store fails every write."""
        threshold = self.missing_threshold

        def run(record: Recorder) -> LinkResult:
            if outcome.rewatch:  # a file to watch (a new branch), once its marker is written
                record.say(WatchedMayDiffer())
            return settle(record, link, outcome, threshold)

        try:
            result: LinkResult = await self.kernel.commit(run)
        except (StoreLocked, StoreUnavailable) as exc:  # said once by the tick, not per link
            return _waiting(link, str(exc), None), True
        except StoreError as exc:
            self._link_failed(link, str(exc))
            return _waiting(link, f"could not record: {exc}", None), False
        except SessionwatchError as exc:
            log.warning("%s: could not settle the tick: %s", link.session_key, exc)
            failed = LinkResult(
                session_key=link.session_key, outcome="inconclusive", reason=str(exc)
            )
            return failed, False
        self._link_failures.pop(link.key, None)
        return result, False

    def _link_failed(self, link: UpstreamLink, reason: str) -> None:
        if self._link_failures.get(link.key) != reason:
            self._link_failures[link.key] = reason
            log.warning(
                "%s: the state database refused this link's findings (%s); its marker stays"
                " and the next tick reads them again",
                link.session_key,
                reason,
            )
        if self.metrics is not None:
            self.metrics.link_write_failures.inc()

    def _count_drift(self, kind: str, outcome: Outcome) -> None:
        metrics, drift = self.metrics, outcome.drift
        if metrics is None or drift is None:
            return
        for record_type, n in drift.unknown_types.items():
            metrics.drift_unknown.labels(kind, record_type).inc(n)
        if drift.unclassified:
            metrics.drift_unclassified.labels(kind).inc(drift.unclassified)
        if drift.invalid:
            metrics.invalid_lines.labels(kind).inc(drift.invalid)
        if drift.newer and drift.version:
            metrics.drift_newer_version.labels(kind, drift.version).set(1)
