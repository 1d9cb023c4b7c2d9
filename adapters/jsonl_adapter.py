"""The adapter of a JSONL format (Claude, Codex, Pi): each link's file checked on the
adapter's reading threads (:mod:`adapters.jsonl_check`: the marker and what a check reads),
baselines, the catalog's scans one at a time, and ``sessionwatch replay``: a file read from
its start through the same check, tick by tick, writing nothing.
"""

from __future__ import annotations

import functools
import mmap
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapters import zst
from adapters.base import (
    Drift,
    FileSource,
    Marker,
    Outcome,
    Probe,
    Ref,
    Settings,
    Source,
    non_negative_int,
    text_hash,
)
from adapters.jsonl_check import (
    READ_TIMEOUT_S,
    HeldLines,
    RootCheck,
    TailSettings,
    baseline_file,
    check_file,
    first_record,
    resolve_file,
)
from adapters.jsonl_format import JsonlFormat
from adapters.states import Doing, last_boundary
from adapters.threads import DaemonReads, SourceBusy
from monitor.errors import BadInput, Declined
from monitor.lazylog import LazyLogger

if TYPE_CHECKING:
    from adapters.catalog import CatalogEntry, CatalogListing  # built only by the catalog

log = LazyLogger(__name__)  # ``replay`` is a one-shot command, and rarely logs


class JsonlAdapter(FileSource):
    """Tails linked JSONL files, each link's read in its own daemon thread."""

    def __init__(
        self, fmt: JsonlFormat[Any], settings: Settings, *, read_timeout: float = READ_TIMEOUT_S
    ) -> None:
        self.kind = fmt.kind
        self.format = fmt
        self.root = settings.root(fmt.kind)
        self.settings = TailSettings(
            cap=settings.scan_cap, max_line=settings.max_line, root=self.root
        )
        self.reads = DaemonReads(fmt.kind, timeout=read_timeout)
        self.held: HeldLines = {}

    @property
    def scan_cap(self) -> int:
        return self.settings.cap

    @scan_cap.setter
    def scan_cap(self, cap: int) -> None:
        self.settings = self.settings._replace(cap=cap)

    def resolve(self, path: str, thread: str | None) -> Source:
        """A file inside the kind's root; its thread id comes from its name. A compressed
        file (or a plain path only its compressed sibling is left of) names the plain file,
        which the harness writes back when the session is resumed."""
        real = self._resolve_plain(path) if self.format.compressed else None
        real = real or resolve_file(self.kind, path, self.root)
        thread_id = self.format.thread_id(os.path.basename(real).removesuffix(".jsonl"))
        ref: Marker = {"filePath": real}
        if self.format.ref_thread:
            ref["threadId"] = thread_id
        return Source(ref=ref, thread_id=thread_id)

    def _resolve_plain(self, path: str) -> str | None:
        plain = zst.plain_of(path)
        packed = zst.compressed_sibling(plain)
        if os.path.exists(plain) or not os.path.exists(packed):
            return None
        return zst.plain_of(resolve_file(self.kind, packed, self.root))

    async def catalog(self) -> CatalogListing:
        from adapters.jsonl_catalog import scan_files

        return await _scanned(scan_files, self.format, self.root)

    def entry_of(self, ref: Ref) -> CatalogEntry | None:
        """The catalog entry of one linked file (its title), read from its head and tail
        only; None when it cannot be read now."""
        from adapters.jsonl_catalog import file_entry

        path = ref.get("filePath")
        if not isinstance(path, str) or not path:
            return None
        try:
            return file_entry(self.format, path)
        except (OSError, ValueError):
            return None

    async def catalog_matching(self, digest: str) -> CatalogListing:
        """The entries whose id's digest starts with ``digest``: only their files are read."""
        from adapters.jsonl_catalog import scan_files

        return await _scanned(scan_files, self.format, self.root, digest)

    def replay(
        self, path: str, thread: str | None, own_texts: list[str]
    ) -> Iterator[dict[str, Any]]:
        return replay_file(self.format, path, own_texts, self.settings)

    async def baseline(self, ref: Ref) -> Marker:
        path = str(ref.get("filePath", ""))
        try:
            return await self.reads.run(f"baseline:{path}", baseline_file, self.format, path)
        except (SourceBusy, TimeoutError):
            raise Declined(f"cannot read {path}: the read did not return") from None
        except OSError as exc:
            raise Declined(f"cannot read {path}: {exc.strerror or exc}") from None

    async def check(self, probes: list[Probe]) -> list[Outcome]:
        settings, held = self.settings, self.held
        roots = RootCheck(settings.root)  # directories resolved once per batch
        jobs = [
            (p.session_key, functools.partial(check_file, self.format, p, settings, held, roots))
            for p in probes
        ]
        results = await self.reads.run_batch(jobs)
        return [self._outcome(p, r) for p, r in zip(probes, results, strict=True)]

    def _outcome(self, probe: Probe, result: Outcome | BaseException) -> Outcome:
        if isinstance(result, Outcome):
            return result
        if isinstance(result, SourceBusy):
            reason = "the previous read of this source has not returned"
        elif isinstance(result, TimeoutError):
            reason = str(result)
        else:  # one link's failure is its own
            log.error("%s: check failed: %r", probe.session_key, result)
            reason = type(result).__name__
        return Outcome(status="inconclusive", reason=reason)


MAX_TICKS = 10_000_000
_BOOKKEEPING = (
    *("pending", "head", "tail", "ino", "recent", "drift", "echo", "seenAt", "changes"),
)


def replay_file(
    fmt: JsonlFormat[Any], path: str, own_texts: list[str], settings: TailSettings
) -> Iterator[dict[str, Any]]:
    """``sessionwatch replay``: the file read from offset 0, tick by tick, through the same
    check as the monitor (tailer, long lines, tolerant parsing, classifier, self-echo),
    writing nothing anywhere. Yields one ``turn`` object per detected turn, then the
    ``summary``: turns, compactions, where the monitor would block, the drift it met."""
    if settings.cap < 1 or settings.max_line < 1:
        raise BadInput("--scan-cap and --max-line-bytes must be positive")
    if fmt.compressed and path.endswith(zst.SUFFIX):
        yield from _replay_compressed(fmt, path, own_texts, settings)
        return
    _replayable(fmt, path, settings.cap)
    own = list(enumerate(text_hash(t) for t in own_texts))
    replay = _Replay(fmt, path, settings._replace(root="", doing=False), own)
    while (outcome := replay.ticked()) is not None:
        for turn in outcome.turns:
            yield {"type": "turn", "offset": turn.offset, "id": turn.native_id}
        if outcome.marker is None or outcome.marker == replay.marker:
            break
        replay.marker = outcome.marker
    yield replay.summary()


def _replayable(fmt: JsonlFormat[Any], path: str, cap: int) -> None:
    """A BadInput saying why the file cannot be replayed: unreadable, or its first record
    refused (as an adoption would refuse it)."""
    try:
        fmt.state_from_first(first_record(path, cap))
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    except Declined as exc:
        raise BadInput(str(exc)) from None


@dataclass
class _Replay:
    """A replay's ticks so far: the marker, what was counted, where it blocked."""

    fmt: JsonlFormat[Any]
    path: str
    settings: TailSettings
    own: list[tuple[int, str]]
    marker: Marker = field(default_factory=lambda: {"offset": 0})
    held: HeldLines = field(default_factory=dict)
    ticks: int = 0
    turns: int = 0
    compactions: int = 0
    blocked: dict[str, Any] | None = None

    def ticked(self) -> Outcome | None:
        """One more tick's outcome, counted; None once the replay blocked or ran out."""
        if self.ticks >= MAX_TICKS:
            return None
        self.ticks += 1
        probe = Probe("replay", {"filePath": self.path}, self.marker, own=tuple(self.own))
        outcome = check_file(self.fmt, probe, self.settings, self.held)
        if outcome.status in ("missing", "inconclusive"):
            raise BadInput(f"cannot read {self.path}: {outcome.reason}")
        if outcome.status == "blocked":
            self.blocked = {"offset": outcome.blocked_offset, "reason": _short(outcome.reason)}
            return None
        self.own = [o for o in self.own if o[0] not in outcome.consumed_own]
        self.compactions += len(outcome.compactions)
        self.turns += len(outcome.turns)
        return outcome

    def doing(self) -> Doing:
        """What the session is doing where the replay ended: of the whole file read, once
        (:func:`adapters.states.last_boundary` looks back from its end only as far as it
        needs; read tick by tick, the monitor comes to the same)."""
        end = non_negative_int(self.marker.get("offset"))
        if not end:
            return Doing()
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return Doing().after(last_boundary(self.fmt, m, 0, min(end, len(m))))

    def summary(self) -> dict[str, Any]:
        return {
            "type": "summary",
            "humanTurns": self.turns,
            "compactions": self.compactions,
            "ticks": self.ticks,
            "blocked": self.blocked,
            "state": self.doing().to_json(),
            "drift": Drift.from_json(self.marker.get("drift")).to_json(),
            "marker": {k: v for k, v in self.marker.items() if k not in _BOOKKEEPING},
        }


def _replay_compressed(
    fmt: JsonlFormat[Any], path: str, own_texts: list[str], settings: TailSettings
) -> Iterator[dict[str, Any]]:
    """A compressed file, replayed as the plain file it stands for: decompressed into a
    private temporary file (bounded memory), which is removed afterwards."""
    import tempfile

    with tempfile.NamedTemporaryFile(prefix="sessionwatch-replay-", suffix=".jsonl") as out:
        try:
            for chunk in zst.chunks(path):
                out.write(chunk)
        except OSError as exc:
            raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
        out.flush()
        yield from replay_file(fmt, out.name, own_texts, settings)


def _short(reason: str | None) -> str:
    """The blocking reason without its offset (the summary gives the offset)."""
    text = reason or "blocked"
    return text.split(" at offset ")[0].split(" starts at ")[0]


_SCANS: Any = None  # the one thread the formats' catalog scans take turns on


async def _scanned(fn: Callable[..., CatalogListing], *args: Any) -> CatalogListing:
    """``fn(*args)`` on the catalog's own thread, one scan at a time: scans are CPU-bound
    Python, and three formats' at once on three threads took half as long again as one
    after the other (the lock they contend for), 1.6 s against 1.0 s for 10,000 files."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    global _SCANS
    if _SCANS is None:
        _SCANS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="catalog")
    found: CatalogListing = await asyncio.get_running_loop().run_in_executor(_SCANS, fn, *args)
    return found
