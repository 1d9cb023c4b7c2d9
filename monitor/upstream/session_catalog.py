"""The session catalog for people: every adapter's adoptable sessions, filtered and ranked.

Each format lists its own sessions (``Adapter.catalog``, see :mod:`adapters.base`); this
module merges them, marks the ones already adopted with their session key, and filters:
kind, working directory, age, and a fuzzy ``search`` (rapidfuzz: each word of the query
against the best-matching word of the title, the working directory and the first prompt,
so typos and word order do not matter). The first prompt is only ever shown, never written.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from adapters.base import Adapter
from adapters.catalog import CatalogEntry, CatalogListing, catalog_id
from monitor.errors import BadInput
from monitor.kernel import Kernel
from monitor.paths import expand_user
from monitor.upstream import links


def _matches_cwd(entry: CatalogEntry, want: str) -> bool:
    have = entry.cwd or ""
    return have == want or have.startswith(want.rstrip("/") + "/")


_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now_ms: int) -> int:
    """``--since``: an age (``30m``, ``6h``, ``2d``, ``1w``) or a date (``2026-11-30``),
    as the earliest update time in ms."""
    raw = text.strip()
    unit = _AGE_UNITS.get(raw[-1:].lower())
    if unit is not None and raw[:-1].isdigit():
        return now_ms - int(raw[:-1]) * unit * 1000
    try:
        at = datetime.fromisoformat(raw)
    except ValueError:
        raise BadInput(
            "since must be an age (a number and s, m, h, d or w, such as 30m, 6h or 2d) or an"
            " ISO date or date and time (such as 2026-11-30 or 2026-11-30T09:00+01:00),"
            f" got {text!r}"
        ) from None
    return int((at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() * 1000)


def _word_score(word: str, candidate: str, **_: Any) -> float:
    from rapidfuzz import fuzz

    score = fuzz.ratio(word, candidate)
    # A prefix or a part of a longer word of the text is nearly as good; a shorter word of
    # the text inside the query's word is not ("in" is not a match for "billing").
    if len(word) >= 3 and len(candidate) >= len(word):
        score = max(score, fuzz.partial_ratio(word, candidate) * 0.95)
    return float(score)


def _search_score(query: str, text: str, **_: Any) -> float:
    """The mean, over the query's words, of each one's best match among the text's words."""
    from rapidfuzz import process

    words, candidates = query.split(), text.split()
    if not words or not candidates:
        return 0.0
    best = (process.extractOne(w, candidates, scorer=_word_score) for w in words)
    return float(sum(b[1] for b in best if b is not None)) / len(words)


SEARCH_CUTOFF = 75.0


def select(
    catalog: CatalogListing,
    *,
    cwd: str | None = None,
    since_ms: int | None = None,
    search: str | None = None,
    limit: int | None = None,
) -> CatalogListing:
    """The entries that pass the filters, newest first or (with ``search``) best first."""
    want = None if cwd is None else os.path.realpath(expand_user(cwd))
    entries = [
        e
        for e in catalog.entries
        if (want is None or _matches_cwd(e, want))
        and (since_ms is None or e.updated_at >= since_ms)
    ]
    if search is not None and search.strip():
        from rapidfuzz import process, utils

        texts = [" ".join(filter(None, (e.title, e.prompt, e.cwd))) for e in entries]
        ranked = process.extract(
            search,
            texts,
            scorer=_search_score,
            processor=utils.default_process,
            score_cutoff=SEARCH_CUTOFF,
            limit=None,
        )
        entries = [
            replace(entries[i], score=float(score))
            for _, score, i in sorted(ranked, key=lambda r: (-r[1], r[2]))
        ]
    return CatalogListing(entries=entries[:limit], skipped=catalog.skipped, errors=catalog.errors)


class SessionCatalog:
    """Every adapter's sessions, each with the session key it is adopted under, if any."""

    def __init__(self, kernel: Kernel, adapters: Mapping[str, Adapter]) -> None:
        self.kernel = kernel
        self.adapters = adapters
        # per linked file: its size and change time when its title was read, and the title
        self._titles: dict[str, tuple[int, int, str | None]] = {}

    async def titles(self, linked: list[links.UpstreamLink]) -> dict[tuple[str, str], str | None]:
        """The title of each link whose format reads one session's entry by itself (a
        file's head and tail), read again only when the file changed; the others are
        left out (their titles come from the catalog)."""
        work = []
        for link in linked:
            entry_of = getattr(self.adapters.get(link.kind or ""), "entry_of", None)
            if entry_of is not None:
                work.append((link, entry_of))
        if not work:
            return {}
        return await asyncio.to_thread(self._read_titles, work)

    def _read_titles(
        self, work: list[tuple[links.UpstreamLink, Any]]
    ) -> dict[tuple[str, str], str | None]:
        found: dict[tuple[str, str], str | None] = {}
        for link, entry_of in work:
            path = str(link.ref.get("filePath", ""))
            try:
                st = os.stat(path)
            except (OSError, ValueError):
                found[link.key] = None
                continue
            kept = self._titles.get(path)
            if kept is None or kept[:2] != (st.st_size, st.st_mtime_ns):
                entry = entry_of(link.ref)
                kept = (st.st_size, st.st_mtime_ns, entry.title if entry else None)
                self._titles[path] = kept
            found[link.key] = kept[2]
        return found

    async def find(
        self,
        kind: str | None = None,
        *,
        cwd: str | None = None,
        since: str | None = None,
        search: str | None = None,
        limit: int | None = None,
    ) -> CatalogListing:
        """The sessions of ``kind`` (of every kind when None), filtered and ranked."""
        kinds = self._kinds(kind)
        since_ms = parse_since(since, self.kernel.clock()) if since else None
        found = CatalogListing()
        for part in await asyncio.gather(*(self.adapters[k].catalog() for k in kinds)):
            found.extend(part)
        adopted: dict[str, list[str]] = {}
        for link in await self.kernel.read(links.all_links):
            adapter = self.adapters.get(link.kind or "")
            if adapter is not None:
                key = catalog_id(link.kind or "", adapter.catalog_key(link.ref))
                adopted.setdefault(key, []).append(link.session_key)
        found.entries = [
            _with_keys(e, sorted(adopted.get(e.catalog_id, []))) for e in found.entries
        ]
        found.entries.sort(key=lambda e: (-e.updated_at, e.catalog_id))
        return select(found, cwd=cwd, since_ms=since_ms, search=search, limit=limit)

    def _kinds(self, kind: str | None) -> list[str]:
        """``kind`` (refused by name when no adapter reads it), or every kind when None."""
        if kind is not None and kind not in self.adapters:
            raise BadInput(f'unknown upstream kind "{kind}" (known: {", ".join(self.adapters)})')
        return [kind] if kind is not None else list(self.adapters)

    async def by_id(self, kind: str | None, digest: str) -> list[CatalogEntry]:
        """The entries of ``kind`` (of every kind when None) whose id's digest starts with
        ``digest``. A format that can find them by id reads only those sessions; the
        others are listed whole."""
        kinds = self._kinds(kind)

        async def of(k: str) -> CatalogListing:
            adapter = self.adapters[k]
            matching = getattr(adapter, "catalog_matching", None)
            if matching is not None:
                found: CatalogListing = await matching(digest)
                return found
            return await adapter.catalog()

        parts = await asyncio.gather(*(of(k) for k in kinds))
        return [
            e for part in parts for e in part.entries
            if e.digest.startswith(digest)
        ]  # fmt: skip


def _with_keys(entry: CatalogEntry, keys: list[str]) -> CatalogEntry:
    if not keys and entry.session_key is None and not entry.also_keys:
        return entry  # most of them: no copy
    return replace(entry, session_key=keys[0] if keys else None, also_keys=tuple(keys[1:]))
