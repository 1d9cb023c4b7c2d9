"""The upstream monitor: adoption, and the tick over watched links (SPEC.md section 7).

Per link, what a tick found is settled in one transaction: the ``human_direct_message`` (or
``upstream_missing``) event and the marker (or link deletion) that depends on it commit
together, compare-and-set against the link as it was when the scan began.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sqlite3
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from adapters.base import Adapter, Outcome, Probe, non_negative_int
from adapters.claude_node import ClaudeNodeAdapter, Node, NodeError
from adapters.registry import VOCABULARY, build_adapters, host_id_for
from monitor.catalog import (
    KINDS,
    Catalog,
    CatalogEntry,
    catalog_id,
    parse_since,
    scan_catalog,
    select,
)
from monitor.config import Config
from monitor.errors import BadInput, Declined, NotFound, SessionwatchError
from monitor.events import ActorType, EventKind
from monitor.kernel import Kernel, read_session, write_session_row
from monitor.keys import normalize_key, resolve_agent, session_scope
from monitor.links import (
    UPSTREAM_KINDS,
    UpstreamLink,
    list_links,
    note_link_status,
    resolve_ref,
    upsert_link,
)
from monitor.settle import LinkResult, settle
from monitor.signal_log import Recorded, make_draft, record_event

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Work:
    link: UpstreamLink
    probe: Probe


def _load(conn: sqlite3.Connection, own_limit: int) -> tuple[list[UpstreamLink], dict[Any, Any]]:
    rows = conn.execute(
        "SELECT l.session_key, l.agent_id, l.catalog_id, l.host_id, l.thread_id, l.upstream_kind,"
        " l.upstream_ref_json, l.last_marker_json, l.last_scanned_at, l.created_at, l.updated_at"
        " FROM session_upstream_links l WHERE EXISTS (SELECT 1 FROM session_watch_cursors c"
        " WHERE c.target_session_key = l.session_key) ORDER BY l.session_key, l.agent_id"
    ).fetchall()
    links = [UpstreamLink.from_row(r) for r in rows]
    sessions = {
        (r[0], r[1]): (r[2], bool(r[3]))
        for r in conn.execute(
            "SELECT session_key, agent_id, session_id, run_active FROM sessionwatch_sessions"
        )
    }
    own: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for row_id, key, agent, digest in conn.execute(
        "SELECT id, session_key, agent_id, text_hash FROM (SELECT id, session_key, agent_id,"
        " text_hash, row_number() OVER (PARTITION BY session_key, agent_id ORDER BY id DESC)"
        " AS n FROM sessionwatch_own_messages) WHERE n <= ? ORDER BY id",
        (own_limit,),
    ):
        own[(key, agent)].append((row_id, digest))
    stateful = {
        (r[0], r[1]): r[2]
        for r in conn.execute(
            "SELECT session_key, agent_id, last_reason FROM sessionwatch_link_state"
            " WHERE missing_streak > 0 OR blocked_offset IS NOT NULL OR last_outcome IS NOT NULL"
        )
    }
    return links, {"sessions": sessions, "own": own, "stateful": stateful}


def _unchanged(link: UpstreamLink, outcome: Outcome, stateful: dict[Any, str | None]) -> bool:
    return (
        outcome.status == "quiet"
        and outcome.marker == link.marker
        and not outcome.reason
        and (link.session_key, link.agent_id) not in stateful
    )


class UpstreamMonitor:
    """Adopts native sources and runs ticks; one tick at a time."""

    def __init__(
        self, kernel: Kernel, config: Config, adapters: dict[str, Adapter] | None = None
    ) -> None:
        self.kernel = kernel
        self.config = config
        m = config.monitor
        self.adapters = adapters or build_adapters(
            scan_cap=m.scan_cap_bytes,
            export_concurrency=m.export_concurrency,
            replay_lookback=m.replay_lookback,
            nodes={n: Node(url=c.url, token_file=c.token_file) for n, c in config.nodes.items()},
            node_pages=m.node_pages,
            opencode_db=str(config.roots.path_of("opencode")),
            roots={k: str(config.roots.path_of(k)) for k in ("claude", "codex", "pi")},
            max_line=m.max_line_bytes,
        )
        self._lock = asyncio.Lock()
        self._ambiguous_logged: set[str] = set()
        self.on_links_changed: Callable[[], None] | None = None  # the file watcher re-arms

    def links_changed(self) -> None:
        if self.on_links_changed:
            self.on_links_changed()

    # -- adoption ----------------------------------------------------------------------

    async def adopt(
        self,
        *,
        kind: str,
        path: str,
        session_key: str,
        agent_id: str | None = None,
        session_id: str | None = None,
        thread: str | None = None,
    ) -> dict[str, Any]:
        """Adopt a native source: baseline its marker at the end and record ``adopted``.

        A baseline that cannot be trusted declines the link; the adoption still succeeds.
        """
        key = normalize_key(session_key)
        agent = resolve_agent(key, agent_id)
        declined: str | None = None
        ref: dict[str, Any] = {}
        marker: dict[str, Any] = {}
        thread_id = ""
        try:
            ref, thread_id = resolve_ref(kind, path, thread, self.config)
            marker = await self.adapters[kind].baseline(ref)
        except Declined as exc:
            declined = str(exc)
        now = self.kernel.clock()
        catalog = VOCABULARY[kind].catalog_id
        # As OpenClaw records an adoption: once per session key, by the person who adopted.
        adopted = make_draft(
            session_key=key,
            agent_id=agent,
            kind=EventKind.ADOPTED,
            actor_type=ActorType.HUMAN,
            session_id=session_id,
            now=now,
            payload={"catalogId": catalog, "hostId": host_id_for(kind, ref)},
            dedupe_key=f"adopted:{key}",
        )

        recorded: list[Recorded] = []

        def run(conn: sqlite3.Connection) -> UpstreamLink | None:
            known = read_session(conn, key, agent)
            # A session without an id takes the given one, else the native session id; an
            # existing session keeps its id.
            sid = None if known and known["sessionId"] else (session_id or thread_id or None)
            write_session_row(conn, key, agent, session_id=sid, now=now)
            recorded.append(record_event(conn, adopted, now))
            if declined is not None:
                return None
            return upsert_link(
                conn,
                key=key,
                agent_id=agent,
                kind=kind,
                ref=ref,
                marker=marker,
                thread_id=thread_id,
                now=now,
            )

        link = await self.kernel.store.write(run)
        self.kernel.observe(recorded)
        self.links_changed()
        return {"link": link.as_json() if link else None, "declined": declined}

    # -- the tick ----------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A tick is running."""
        return self._lock.locked()

    async def tick(self, only: set[str] | None = None) -> list[LinkResult]:
        """One pass over the watched links (or the ``only`` keys among them)."""
        async with self._lock:
            return await self._tick(only)

    async def _tick(self, only: set[str] | None) -> list[LinkResult]:
        links, extra = await self.kernel.store.read(
            lambda c: _load(c, self.config.monitor.own_text_limit)
        )
        agents_per_key: dict[str, int] = defaultdict(int)
        for link in links:
            agents_per_key[link.session_key] += 1
        results: list[LinkResult] = []
        skipped: list[tuple[UpstreamLink, str]] = []
        batches: dict[str, list[_Work]] = defaultdict(list)
        for link in links:
            if only is not None and link.session_key not in only:
                continue
            skip = self._skip_reason(link, agents_per_key, extra["sessions"])
            if skip:
                results.append(
                    LinkResult(session_key=link.session_key, outcome="skipped", reason=skip)
                )
                if not link.foreign and extra["stateful"].get(link.key) != skip:
                    skipped.append((link, skip))
                continue
            probe = Probe(
                session_key=link.session_key,
                ref=link.ref,
                marker=link.marker,
                own=tuple(extra["own"].get((link.session_key, link.agent_id), ())),
                last_scanned_at=link.last_scanned_at,
            )
            assert link.kind is not None  # foreign links were skipped
            batches[link.kind].append(_Work(link=link, probe=probe))
        checked = await asyncio.gather(*(self._check(k, w) for k, w in batches.items()))
        idle: list[UpstreamLink] = []
        for kind, works, outcomes in checked:
            for work, outcome in zip(works, outcomes, strict=True):
                link = work.link
                self._count_drift(link.kind, outcome)
                if _unchanged(link, outcome, extra["stateful"]):
                    idle.append(link)
                    quiet = LinkResult(session_key=link.session_key, outcome="quiet", adapter=kind)
                    results.append(quiet)
                else:
                    result = await self._settle(link, outcome)
                    results.append(dataclasses.replace(result, adapter=kind))
        if idle:
            await self._touch(idle)
        if skipped:
            await self._note_skips(skipped)
        return results

    async def _note_skips(self, skipped: list[tuple[UpstreamLink, str]]) -> None:
        """Why a watched link was not checked (a run active, no session id, an ambiguous
        key) shows in ``links``; written only when the reason changes."""

        def run(conn: sqlite3.Connection) -> None:
            for link, reason in skipped:
                note_link_status(conn, link, "skipped", reason)

        try:
            await self.kernel.store.write(run)
        except SessionwatchError as exc:
            log.warning("could not note why links were skipped: %s", exc)

    async def _touch(self, links: list[UpstreamLink]) -> None:
        """Quiet links whose marker and state did not change: one transaction for all."""
        now = self.kernel.clock()
        rows = [(now, x.session_key, x.agent_id, x.updated_at) for x in links]
        try:
            await self.kernel.store.write(
                lambda c: c.executemany(
                    "UPDATE session_upstream_links SET last_scanned_at = ? WHERE session_key = ?"
                    " AND agent_id = ? AND updated_at = ?",
                    rows,
                )
            )
        except SessionwatchError as exc:
            log.warning("could not stamp the scan time of quiet links: %s", exc)

    def _skip_reason(
        self, link: UpstreamLink, agents: dict[str, int], sessions: dict[Any, Any]
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
        known = sessions.get((link.session_key, link.agent_id))
        if known is None:  # a session we were never told of (a link the gateway wrote)
            return None
        session_id, run_active = known
        if not session_id:
            return "no session id"
        if run_active:
            return "run active"
        return None

    async def _check(self, kind: str, works: list[_Work]) -> tuple[str, list[_Work], list[Outcome]]:
        budget = self.config.monitor.adapter_budget_s
        try:
            outcomes = await asyncio.wait_for(
                self.adapters[kind].check([w.probe for w in works]), budget
            )
            if len(outcomes) != len(works):
                raise SessionwatchError(f"{kind} adapter answered {len(outcomes)} outcomes")
        except TimeoutError:
            outcomes = [Outcome(status="inconclusive", reason="adapter budget exceeded")] * len(
                works
            )
        except Exception as exc:
            log.exception("%s adapter failed", kind)
            outcomes = [Outcome(status="inconclusive", reason=f"adapter failed: {exc}")] * len(
                works
            )
        return kind, works, outcomes

    async def _settle(self, link: UpstreamLink, outcome: Outcome) -> LinkResult:
        now = self.kernel.clock()
        threshold = self.config.monitor.missing_threshold
        try:
            result, recorded = await self.kernel.store.write(
                lambda c: settle(c, link, outcome, now, threshold)
            )
        except SessionwatchError as exc:
            log.warning("%s: could not settle the tick: %s", link.session_key, exc)
            return LinkResult(session_key=link.session_key, outcome="inconclusive", reason=str(exc))
        self.kernel.observe(recorded)
        return result

    def _count_drift(self, kind: str | None, outcome: Outcome) -> None:
        metrics, drift = self.kernel.metrics, outcome.drift
        if metrics is None or drift is None or kind is None:
            return
        for record_type, n in drift.unknown_types.items():
            metrics.drift_unknown.labels(kind, record_type).inc(n)
        if drift.unclassified:
            metrics.drift_unclassified.labels(kind).inc(drift.unclassified)
        if drift.invalid:
            metrics.invalid_lines.labels(kind).inc(drift.invalid)
        if drift.newer and drift.version:
            metrics.drift_newer_version.labels(kind, drift.version).set(1)

    async def find_catalog(
        self,
        kind: str | None = None,
        *,
        cwd: str | None = None,
        since: str | None = None,
        search: str | None = None,
        limit: int | None = None,
    ) -> Catalog:
        """The native sessions under the configured roots and on every configured node,
        filtered and ranked (see :mod:`monitor.catalog`), each with the session key it is
        adopted under, if any."""
        kinds = (check_kind(kind),) if kind is not None else (*KINDS, "claude-node")
        since_ms = parse_since(since, self.kernel.clock()) if since else None
        local = tuple(k for k in kinds if k in KINDS)
        found = await asyncio.to_thread(scan_catalog, self.config.roots, local)
        if "claude-node" in kinds:
            await self._node_sessions(found)
        links = await self.kernel.store.read(list_links)
        adopted: dict[tuple[str, str], str] = {}
        for link in links:
            ref = link["ref"]
            where = ref.get("nodeId") if link["kind"] == "claude-node" else ref.get("filePath")
            adopted[(str(where or ref.get("dbPath")), link["threadId"])] = link["sessionKey"]
            if "filePath" in ref:
                adopted[(ref["filePath"], "")] = link["sessionKey"]
        found.entries = [
            replace(
                e,
                session_key=adopted.get((e.node or e.path, e.native_id))
                or adopted.get((e.path, "")),
            )
            for e in found.entries
        ]
        found.entries.sort(key=lambda e: (-e.updated_at, e.catalog_id))
        return select(found, cwd=cwd, since_ms=since_ms, search=search, limit=limit)

    async def _node_sessions(self, found: Catalog) -> None:
        adapter = self.adapters["claude-node"]
        assert isinstance(adapter, ClaudeNodeAdapter)
        for name in sorted(self.config.nodes):
            try:
                threads = await adapter.threads(name)
            except NodeError as exc:
                found.errors.append({"path": f"node {name}", "reason": str(exc)})
                continue
            for t in threads:
                thread = str(t.get("threadId") or "")
                if not thread:
                    continue
                found.entries.append(
                    CatalogEntry(
                        catalog_id=catalog_id("claude-node", f"{name}\n{thread}"),
                        kind="claude-node",
                        native_id=thread,
                        path=name,
                        cwd=_str_or_none(t.get("cwd")),
                        title=_str_or_none(t.get("title")),
                        updated_at=non_negative_int(t.get("updatedAt")),
                        size=non_negative_int(t.get("size")),
                        prompt=_str_or_none(t.get("prompt")),
                        node=name,
                    )
                )

    async def catalog(self, kind: str | None = None, **filters: Any) -> dict[str, Any]:
        return (await self.find_catalog(kind, **filters)).as_json()

    async def adopt_catalog(
        self,
        catalog_id: str,
        *,
        session_key: str,
        agent_id: str | None = None,
        session_id: str | None = None,
    ) -> dict[str, Any]:
        """Adopt a catalog entry by its id, or by the short id the table shows (the path
        form is :meth:`adopt`)."""
        wanted = catalog_id.strip()
        kind, _, digest = wanted.rpartition(":")
        found = await self.find_catalog(check_kind(kind) if kind else None)
        if kind:
            matches = [e for e in found.entries if e.catalog_id == wanted]
        else:
            matches = [
                e for e in found.entries if len(digest) >= 4 and e.short_id.startswith(digest)
            ]
            if not matches:
                matches = [e for e in found.entries if e.catalog_id.endswith(":" + digest)]
        if not matches:
            raise NotFound(f"no catalog session {catalog_id!r}")
        if len(matches) > 1:
            ids = ", ".join(e.catalog_id for e in matches[:5])
            raise BadInput(f"catalog id {catalog_id!r} is ambiguous: {ids}")
        entry = matches[0]
        return await self.adopt(
            kind=entry.kind,
            path=entry.path,
            thread=entry.native_id if entry.kind in ("opencode", "claude-node") else None,
            session_key=session_key,
            agent_id=agent_id,
            session_id=session_id,
        )

    async def adopt_source(
        self,
        *,
        session_key: str,
        agent_id: str | None = None,
        session_id: str | None = None,
        catalog_id: str | None = None,
        kind: str | None = None,
        path: str | None = None,
        node: str | None = None,
        thread: str | None = None,
    ) -> dict[str, Any]:
        """Adopt by catalog id, or by kind and path (``thread`` for OpenCode), or a paired
        node's thread (kind ``claude-node`` with ``node`` and ``thread``): the API and the
        CLI take the same forms."""
        if catalog_id is not None:
            if kind or path or node or thread:
                raise BadInput("give either a catalog id, or a kind with a path (or a node)")
            return await self.adopt_catalog(
                catalog_id, session_key=session_key, agent_id=agent_id, session_id=session_id
            )
        if kind is None:
            raise BadInput("a kind is required (or a catalog id)")
        kind = check_kind(kind)
        source = (node or path) if kind == "claude-node" else path
        if source is None:
            raise BadInput("a node is required" if kind == "claude-node" else "a path is required")
        return await self.adopt(
            kind=kind,
            path=source,
            thread=thread,
            session_key=session_key,
            agent_id=agent_id,
            session_id=session_id,
        )

    async def unlink(self, session_key: str, *, agent_id: str | None = None) -> bool:
        """Remove a session's link (all agents' for a bare key without ``agent_id``)."""
        scope, params = session_scope(normalize_key(session_key), agent_id)

        def run(conn: sqlite3.Connection) -> bool:
            conn.execute(f"DELETE FROM sessionwatch_link_state WHERE {scope}", params)
            return (
                conn.execute(f"DELETE FROM session_upstream_links WHERE {scope}", params).rowcount
                > 0
            )

        return await self.kernel.store.write(run)

    async def blocked_count(self) -> int:
        def run(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT count(*) FROM sessionwatch_link_state s JOIN session_upstream_links l"
                " ON l.session_key = s.session_key AND l.agent_id = s.agent_id"
                " WHERE s.blocked_offset IS NOT NULL AND s.link_updated_at = l.updated_at"
            ).fetchone()
            return int(row[0])

        return await self.kernel.store.read(run)

    async def tick_done(self) -> None:
        """Wait for the tick in flight, if any, to finish."""
        async with self._lock:
            return

    # -- listing -----------------------------------------------------------------------

    async def links(self) -> list[dict[str, Any]]:
        return await self.kernel.store.read(list_links)


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def check_kind(kind: str) -> str:
    if kind not in UPSTREAM_KINDS:
        raise BadInput(f'unknown upstream kind "{kind}" (known: {", ".join(UPSTREAM_KINDS)})')
    return kind
