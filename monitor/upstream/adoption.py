"""Adoption: tie a session key to a native source, baselined at its current end.

A source is named by a catalog id (or the short id the catalog table shows), or by kind and
path (a file; a database and a session id; a paired node and a thread): the API and the CLI
take the same forms, checked by the same rules. The source is resolved and baselined by its
adapter; the ``adopted`` event, the gateway session record and the link commit together. A
baseline that cannot be trusted declines the link; the adoption itself still succeeds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from adapters.base import Adapter, Marker
from adapters.registry import LOCAL_HOST, entry, host_id_for
from monitor.errors import BadInput, Declined, NotFound, OutsideRoots
from monitor.kernel import Kernel
from monitor.kernel.bus import LinksChanged
from monitor.kernel.drafts import make_draft
from monitor.kernel.events import CATALOG_ID, HOST_ID, ActorType, EventKind
from monitor.kernel.keys import normalize_key, resolve_agent
from monitor.kernel.recorder import Recorder
from monitor.kernel.sessions import read_session, write_session_row
from monitor.paths import expand_user
from monitor.upstream.links import UpstreamLink, keys_linked_to, read_link, upsert_link
from monitor.upstream.session_catalog import SessionCatalog

if TYPE_CHECKING:
    from monitor.kernel.store.protocol import Conn


def check_kind(kind: str) -> str:
    """A registered kind, else a :class:`BadInput` naming the known ones."""
    return entry(kind).name


class AdoptedLink(NamedTuple):
    """What an adoption did: the link it made, or why the source declined (the adoption
    is recorded either way)."""

    link: UpstreamLink | None
    declined: str | None
    # what a person should know: the key moved from another source, the source is linked
    # to other keys too
    warnings: tuple[str, ...] = ()


class Adoption:
    def __init__(
        self,
        kernel: Kernel,
        adapters: Mapping[str, Adapter],
        catalog: SessionCatalog,
        host: str = LOCAL_HOST,
    ) -> None:
        """``host``: this sidecar's host id; the file links it adopts are written
        ``gateway:<host>``."""
        self.kernel = kernel
        self.host = host
        self.adapters = adapters
        self.catalog = catalog

    async def adopt(
        self,
        *,
        kind: str,
        path: str,
        session_key: str,
        agent_id: str | None = None,
        session_id: str | None = None,
        thread: str | None = None,
    ) -> AdoptedLink:
        """Adopt a native source: baseline its marker at the end and record ``adopted``."""
        key = normalize_key(session_key)
        agent = resolve_agent(key, agent_id)
        form = entry(kind)
        adapter = self.adapters.get(kind)
        if adapter is None:
            raise BadInput(f"no adapter for {kind} is configured")
        declined: str | None = None
        ref: Marker = {}
        marker: Marker = {}
        thread_id = ""
        try:
            source = adapter.resolve(path if form.remote else _expanded(path), thread)
            ref, thread_id = source.ref, source.thread_id
            marker = await adapter.baseline(ref)
        except Declined as exc:
            declined = str(exc)
        # As OpenClaw records an adoption: once per session key, by the person who adopted.
        adopted = make_draft(
            session_key=key,
            agent_id=agent,
            kind=EventKind.ADOPTED,
            actor_type=ActorType.HUMAN,
            session_id=session_id,
            now=self.kernel.clock(),
            payload={CATALOG_ID: form.catalog_id, HOST_ID: host_id_for(kind, ref, self.host)},
            dedupe_key=f"adopted:{key}",
        )

        warnings: list[str] = []

        def run(record: Recorder) -> UpstreamLink | None:
            conn, now = record.conn, record.now
            warnings[:] = [] if declined is not None else _warnings(conn, key, agent, ref)
            known = read_session(conn, key, agent)
            # A session without an id takes the given one, else the native session id; an
            # existing session keeps its id.
            sid = None if known and known.session_id else (session_id or thread_id or None)
            write_session_row(conn, key, agent, session_id=sid, now=now)
            record(adopted)
            if declined is not None:
                return None
            record.say(LinksChanged())  # said once this transaction committed, and only then
            return upsert_link(
                conn,
                key=key,
                agent_id=agent,
                kind=kind,
                ref=ref,
                marker=marker,
                thread_id=thread_id,
                now=now,
                host=self.host,
            )

        link = await self.kernel.commit(run)
        return AdoptedLink(link, declined, tuple(warnings))

    async def adopt_catalog(
        self,
        catalog_id: str,
        *,
        session_key: str,
        agent_id: str | None = None,
        session_id: str | None = None,
    ) -> AdoptedLink:
        """Adopt a catalog entry by its id, or by the short id the table shows."""
        wanted = catalog_id.strip()
        kind, _, digest = wanted.rpartition(":")
        if kind:
            check_kind(kind)
            found = await self.catalog.by_id(kind, digest) if digest else []
            matches = [e for e in found if e.catalog_id == wanted]
        else:
            matches = await self.catalog.by_id(None, digest) if len(digest) >= 4 else []
        if not matches:
            raise NotFound(f"no catalog session {catalog_id!r}")
        if len(matches) > 1:
            ids = ", ".join(e.catalog_id for e in matches[:5])
            raise BadInput(f"catalog id {catalog_id!r} is ambiguous: {ids}")
        chosen = matches[0]
        return await self.adopt(
            kind=chosen.kind,
            path=chosen.path,
            thread=chosen.native_id if entry(chosen.kind).needs_thread else None,
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
    ) -> AdoptedLink:
        """Adopt by catalog id, or by kind and path (with ``thread`` for a database), or a
        paired node's thread (``node`` and ``thread``)."""
        if catalog_id is not None:
            if kind or path or node or thread:
                raise BadInput("give either a catalog id, or a kind with a path (or a node)")
            return await self.adopt_catalog(
                catalog_id, session_key=session_key, agent_id=agent_id, session_id=session_id
            )
        if kind is None:
            raise BadInput("a kind is required (or a catalog id)")
        remote = entry(kind).remote
        source = (node or path) if remote else path
        if source is None:
            raise BadInput("a node is required" if remote else "a path is required")
        return await self.adopt(
            kind=kind,
            path=source,
            thread=thread,
            session_key=session_key,
            agent_id=agent_id,
            session_id=session_id,
        )


def _expanded(path: str) -> str:
    """A path a client gave; one whose ``~user`` has no home is outside every root; one
    that holds a NUL byte is no path at all (:class:`BadInput`)."""
    if "\x00" in path:
        raise BadInput("a path cannot hold a NUL byte")
    try:
        return expand_user(path)
    except BadInput as exc:
        raise OutsideRoots(str(exc)) from None


def _warnings(conn: Conn, key: str, agent: str, ref: Marker) -> list[str]:
    """What an adoption of ``ref`` under ``key`` changes beyond itself: the key's link to
    another source is replaced; the source stays linked to other keys too."""
    said = []
    before = read_link(conn, key, agent)
    if before is not None and before.ref != ref:
        said.append(f"{key} was linked to {_shown(before.ref)}; it now follows this source")
    others = [k for k in keys_linked_to(conn, ref) if k != key]
    if others:
        said.append(f"this source is also linked to {', '.join(sorted(others))}")
    return said


def _shown(ref: Marker) -> str:
    return str(ref.get("filePath") or ref.get("dbPath") or ref.get("threadId") or ref)
