"""The seam every upstream format implements, and the values that cross it.

An adapter is one object, built by its module's ``build(settings)`` (see
:mod:`adapters.registry`, the only list of kinds). The upstream monitor calls nothing else:

- ``resolve(path, thread) -> Source``: the ref and thread id of a source a person or the
  gateway names (a file under the kind's root, a database and a session id, a node and a
  thread). Raises :class:`OutsideRoots`, :class:`NotFound`, :class:`BadInput`, or
  :class:`Declined` (the source exists but cannot be adopted: adoption still succeeds,
  without a link).
- ``baseline(ref) -> marker``: where monitoring of a newly adopted source starts (the current
  end). Raises :class:`Declined` with a reason when the baseline cannot be trusted.
- ``check(probes) -> outcomes``: one outcome per probe, in order. It must not raise for one
  link's failure (that link's outcome is ``inconclusive``); an exception escaping ``check``
  makes every link of the batch inconclusive. ``missing`` means the source is gone (three in
  a row remove the link); ``blocked`` stops at an offset it cannot read past; every outcome
  may carry the :class:`Drift` the check met.
- ``catalog() -> CatalogListing``: the adoptable sessions of the kind; a source that cannot be read
  is an entry of ``errors``, never an exception.
- ``catalog_key(ref) -> str``: the text a source's catalog id is the digest of, so that a
  link finds its catalog entry.
- ``watched_paths(ref) -> list[str]``: the local files whose change should wake an early
  check of the link (a transcript; an OpenCode database and its ``-wal``); none for a
  source on another machine. The tick stays the truth either way.
- ``replay(path, thread, own_texts)``: ``sessionwatch replay``: the source read from its
  start through the same check, writing nothing; ``turn`` objects, then a ``summary``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

import orjson

from monitor.errors import BadInput
from monitor.records import NamedTuple

if TYPE_CHECKING:
    from adapters.catalog import CatalogListing

Marker = dict[str, Any]  # where a check resumes; the adapter's own
_DIGEST = re.compile(r"^[0-9a-f]{1,64}$")
Ref = dict[str, Any]  # which source a link names (a file, a database and a thread, a node)
CheckStatus = Literal["activity", "quiet", "missing", "blocked", "inconclusive"]


def normalize_text(text: str) -> str:
    """Trimmed, whitespace collapsed: how prompts are compared for self-echo and dedupe."""
    return " ".join(text.split())


def unknown_blocks(content: Any, known: frozenset[str]) -> bool:
    """Whether a message's content (its blocks) holds a block of a type not in ``known``."""
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") not in known for b in content
    )


def content_text(content: Any, block_types: frozenset[str]) -> str:
    """The text of a message's content: a string, or its text blocks joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        b["text"]
        for b in content
        if isinstance(b, dict) and b.get("type") in block_types and isinstance(b.get("text"), str)
    )


def text_hash(text: str) -> str:
    """Prompts are compared by the hash of their normalized text, never stored as text.

    Text parsed from odd bytes may hold lone surrogates; they are hashed as they are."""
    return normalized_hash(normalize_text(text))


def normalized_hash(normalized: str) -> str:
    """:func:`text_hash` of text that :func:`normalize_text` made: a classifier normalizes
    a prompt once, to see whether it is blank, and hashes what it got."""
    return hashlib.sha256(normalized.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def non_negative_int(value: Any) -> int:
    """A count or an offset read from outside (a marker, a node's answer); anything else
    reads as 0."""
    return value if is_count(value) else 0


def is_count(value: Any) -> bool:
    """Whether a value read from outside is a count or an offset: an integer (not a bool)
    of 0 or more."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# Reading JSON from outside (a record, a marker, a node's answer): a field of the expected
# type, or None. One name for each check, so that a reader's branches are its format's.


def as_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def as_dict(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def as_list(value: Any) -> list[Any]:
    """``value`` when it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def member(value: Any, key: str) -> Any:
    """``value[key]`` when ``value`` is an object that has it, else None."""
    return value.get(key) if isinstance(value, dict) else None


def own_text_hash(text: str) -> str:
    """The hash an OpenClaw-side message is remembered by for self-echo filtering: the same
    one upstream prompts are compared with. A blank message is refused."""
    normalized = normalize_text(text)
    if not normalized:
        raise BadInput("own message text is empty")
    return normalized_hash(normalized)


class Verdict(NamedTuple):
    """What a classifier found in one record (most records give None: nothing to report).
    A named tuple, as :class:`Turn`: one is made per record parsed, and a frozen dataclass
    takes twice as long to make.

    ``turn``: the text hash of a direct human turn. ``compaction``: the native id of a
    compaction the harness wrote itself. ``unclassified``: the record looks like a user's,
    but no rule of ours classifies it (format drift). ``unknown_type``: a record type this
    format never had. ``version``: the format version the record declares.
    """

    turn: str | None = None
    compaction: str | None = None
    unclassified: bool = False
    unknown_type: str | None = None
    version: str | None = None


UNCLASSIFIED = Verdict(unclassified=True)


class Turn(NamedTuple):
    """One direct human turn found upstream."""

    offset: int | None
    native_id: str | None
    text_hash: str


# The values that cross the seam are named tuples (monitor.records), as the one-shot
# commands' records are: ``sessionwatch replay`` is a one-shot command too, and a frozen
# dataclass costs its start-up about 0.9 ms to make, a named tuple about 0.06. Outcome and
# Drift stay dataclasses: their lists and counts are made fresh for each one.


class Follow(NamedTuple):
    """A thread the gateway stopped probing that the sidecar follows on a marker of its own
    (a gateway-adopted Codex thread's source, once the gateway works on its own branch):
    the thread, the sidecar's marker there (None: none kept for this branch yet), and the
    thread the gateway probes instead (the branch: a marker kept beside another branch is
    not this one's)."""

    thread: str
    marker: Marker | None
    beside: str = ""


class Probe(NamedTuple):
    """One link to check: its ref and marker, the session's own recent messages as
    ``(id, text hash)`` pairs oldest first, when the link was last scanned (ms; never
    scanned: when its marker was set), and a thread followed beside it, if any."""

    session_key: str
    ref: Ref
    marker: Marker
    own: tuple[tuple[int, str], ...] = ()
    last_scanned_at: int | None = None
    follow: Follow | None = None


class OwnPool:
    """The session's remembered OpenClaw-side messages. Each suppresses at most one upstream
    prompt (the oldest that matches goes first); what was used is in ``consumed``, for the
    monitor to forget in the same transaction as the marker."""

    def __init__(self, entries: Iterable[tuple[int, str]] = ()) -> None:
        self._entries = list(entries)
        self.consumed: list[int] = []

    @classmethod
    def of_texts(cls, texts: Iterable[str]) -> OwnPool:
        return cls(enumerate(text_hash(t) for t in texts))

    def consume(self, digest: str) -> bool:
        for i, (entry, seen) in enumerate(self._entries):
            if seen == digest:
                del self._entries[i]
                self.consumed.append(entry)
                return True
        return False


@dataclass
class Drift:
    """What a format's reader met that it does not know, per link, cumulative.

    ``version``: the newest format version a record declared, ``newer`` when it is newer
    than the newest we tested; ``unknown_types``: record types never seen, with counts;
    ``unclassified``: records that look like a user's but that no rule classifies;
    ``invalid``: complete lines that are not JSON at all, and where the last one was.
    """

    version: str | None = None
    newer: bool = False
    unknown_types: dict[str, int] = field(default_factory=dict)
    unclassified: int = 0
    invalid: int = 0
    last_invalid_offset: int | None = None

    MAX_TYPES: ClassVar[int] = 32

    def count_type(self, kind: str, n: int = 1) -> None:
        if kind in self.unknown_types or len(self.unknown_types) < self.MAX_TYPES:
            self.unknown_types[kind] = self.unknown_types.get(kind, 0) + n

    def see_version(self, version: str, tested: str) -> None:
        if version == self.version:
            return
        if self.version is None or version_key(version) > version_key(self.version):
            self.version = version
            self.newer = version_key(version) > version_key(tested)

    def merged(self, other: Drift) -> Drift:
        out = Drift(
            version=self.version,
            newer=self.newer,
            unknown_types=dict(self.unknown_types),
            unclassified=self.unclassified + other.unclassified,
            invalid=self.invalid + other.invalid,
            last_invalid_offset=other.last_invalid_offset or self.last_invalid_offset,
        )
        if other.version is not None and (
            out.version is None or version_key(other.version) >= version_key(out.version)
        ):
            out.version, out.newer = other.version, other.newer
        for kind, n in other.unknown_types.items():
            out.count_type(kind, n)
        return out

    def __bool__(self) -> bool:
        return bool(self.version or self.unknown_types or self.unclassified or self.invalid)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "newerThanTested": self.newer,
            "unknownTypes": dict(self.unknown_types),
            "unclassifiedUserRecords": self.unclassified,
            "invalidLines": self.invalid,
            "lastInvalidOffset": self.last_invalid_offset,
        }

    @classmethod
    def from_json(cls, raw: Any) -> Drift:
        if not isinstance(raw, dict):
            return cls()
        types = raw.get("unknownTypes")
        version = raw.get("version")
        last = raw.get("lastInvalidOffset")
        return cls(
            version=version if isinstance(version, str) else None,
            newer=raw.get("newerThanTested") is True,
            unknown_types={str(k): int(v) for k, v in types.items() if isinstance(v, int)}
            if isinstance(types, dict)
            else {},
            unclassified=_count(raw.get("unclassifiedUserRecords")),
            invalid=_count(raw.get("invalidLines")),
            last_invalid_offset=last if isinstance(last, int) else None,
        )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@functools.lru_cache(maxsize=64)  # each check's drift compares the versions it meets anew
def version_key(version: str) -> tuple[int, ...]:
    """``"2.1.152"`` as ``(2, 1, 152)``; non-numeric parts count as 0."""
    parts = []
    for part in version.strip().lstrip("v").split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


class Boundary(NamedTuple):
    """A record that marks a turn's boundary (see :mod:`adapters.states`): the state it
    leaves, and when (ms; None when the record has no time). Of several lines: the state
    they leave, since when, whether they changed to it themselves (a boundary of another
    state came before), and the first of their boundaries (its state and time: where a
    state kept from before them ended)."""

    state: str
    at: int | None
    changed: bool = False
    first: str | None = None
    first_at: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    status: CheckStatus
    marker: Marker | None = None
    turns: list[Turn] = field(default_factory=list)
    dedupe_id: str | None = None
    latest_at: int | None = None
    reason: str | None = None
    blocked_offset: int | None = None
    invalid_lines: int = 0
    compactions: list[str] = field(default_factory=list)  # native ids, in file order
    consumed_own: list[int] = field(default_factory=list)  # own messages that suppressed
    drift: Drift | None = None  # what this check met that is new (for logs and metrics)
    rewatch: bool = False  # the check read a file it was not watched by: watch again
    # the read stopped at the scan cap with more of the file written: check again at once,
    # not a tick later (a prompt behind a burst of output waits for no tick)
    more: bool = False
    # the byte offset a plain read continued from (the marker's; None for a re-read or a
    # source without offsets): a turn at an offset below the end another checker recorded
    # in the same range was recorded by it (see monitor.upstream.settle)
    read_from: int | None = None
    followed: Followed | None = None  # what the probe's followed thread holds
    # the last record among those read that marks a turn's boundary (None: none did)
    boundary: Boundary | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Followed:
    """What a check found in the probe's :class:`Follow` thread: read from ``since`` (the
    marker the probe carried), up to ``outcome.marker``."""

    thread: str
    since: Marker | None
    outcome: Outcome
    beside: str = ""

    @property
    def news(self) -> bool:
        return bool(self.outcome.turns) or self.outcome.marker != self.since


class Source(NamedTuple):
    """A resolved source: the ref a link stores, and the native thread id."""

    ref: Ref
    thread_id: str


class NodeAddress(NamedTuple):
    """A paired node: its base URL, the file holding its token (read on use), and for an
    ``https`` node the SHA-256 fingerprint of its certificate (hex), which is pinned."""

    url: str
    token_file: str
    fingerprint: str | None = None


DEFAULT_SCAN_CAP = 1_048_576
DEFAULT_MAX_LINE = 64 * 1_048_576


class Settings(NamedTuple):
    """What the configuration tells the adapters; the composition root builds it.

    ``roots``: per kind, its root directory (or, for a format kept in a database, the
    database file), already expanded."""

    roots: Mapping[str, str] = MappingProxyType({})
    nodes: Mapping[str, NodeAddress] = MappingProxyType({})
    scan_cap: int = DEFAULT_SCAN_CAP
    max_line: int = DEFAULT_MAX_LINE
    export_concurrency: int = 4
    replay_lookback: int = 50
    node_pages: int = 4

    def root(self, kind: str) -> str:
        return self.roots.get(kind, "")


class Adapter(Protocol):
    """One upstream format. See the module docstring for the contract."""

    kind: str

    def resolve(self, path: str, thread: str | None) -> Source: ...

    async def baseline(self, ref: Ref) -> Marker: ...

    async def check(self, probes: list[Probe]) -> list[Outcome]: ...

    async def catalog(self) -> CatalogListing: ...

    def catalog_key(self, ref: Ref) -> str: ...

    def watched_paths(self, ref: Ref) -> list[str]: ...

    def replay(
        self, path: str, thread: str | None, own_texts: list[str]
    ) -> Iterable[dict[str, Any]]: ...


class FileSource:
    """What every adapter of the file form shares: a link's ref names its file
    (``filePath``), which keys its catalog entry and is what is watched."""

    def catalog_key(self, ref: Ref) -> str:
        return str(ref.get("filePath", ""))

    def watched_paths(self, ref: Ref) -> list[str]:
        path = ref.get("filePath")
        return [path] if isinstance(path, str) and path else []


def session_key_in(db: str, session_id: str) -> str:
    """What names a session of a database form (a resolved database path): its catalog
    entry's key, as :meth:`DatabaseSource.catalog_key` gives it for a link."""
    return f"{db}\n{session_id}"


class DatabaseSource:
    """What every adapter of the database form shares: a link's ref names the database
    (``dbPath``) and a session in it (``threadId``); the database and its WAL are watched
    (the harness commits to its WAL, and to the file itself at a checkpoint)."""

    def database(self, ref: Ref) -> str:
        """The database a ref names (a subclass may give a default)."""
        return str(ref.get("dbPath") or "")

    def catalog_key(self, ref: Ref) -> str:
        return session_key_in(os.path.realpath(self.database(ref)), str(ref.get("threadId", "")))

    def watched_paths(self, ref: Ref) -> list[str]:
        db = self.database(ref)
        return [db, f"{db}-wal"] if db else []


class NodeRead(NamedTuple):
    """One read a node is asked for: ``read`` (a name its format's protocol lists in
    ``NODE_READS``) of the sources of ``kind`` below ``root`` (a directory, or a database
    form's file), of ``thread`` (None: of the root, as a batch), with the request's query and
    body (empty for a GET)."""

    kind: str
    root: str
    read: str
    thread: str | None
    query: Mapping[str, str]
    body: bytes = b""

    def number(self, key: str, default: int | None = None) -> int | None:
        """A non-negative integer of the query (``default`` when absent)."""
        raw = self.query.get(key)
        if raw is None:
            return default
        if not raw.isdigit() or len(raw) > 18:
            raise BadInput(f"{key} must be a non-negative integer")
        return int(raw)

    def digest(self, key: str) -> str | None:
        """A hex digest of the query (None when absent)."""
        raw = self.query.get(key)
        if raw is not None and not _DIGEST.match(raw):
            raise BadInput(f"{key} must be a hex digest")
        return raw

    def ids(self, most: int) -> list[str]:
        """A batch's body, ``{"ids": [...]}``: the session ids asked for, at most ``most``."""
        try:
            body = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            raise BadInput('the body must be JSON: {"ids": [...]}') from None
        ids = body.get("ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise BadInput("ids must be a list of session ids")
        if len(ids) > most:
            raise BadInput(f"at most {most} ids a request")
        return ids


class NodeProtocol(Protocol):
    """A format's node protocol, both halves of the wire, in the module ``Entry.node`` names
    beside the format: what the node answers and what the sidecar makes of it.

    On the node, ``serve`` answers one :class:`NodeRead`, run in a thread, as the HTTP status
    and JSON body to send: a :class:`~monitor.errors.BadInput` for a malformed query is a
    400, a :class:`~monitor.errors.NotFound` a 404 ``no_such_thread``, an
    :class:`~monitor.errors.ItemGone` a 404 ``no_such_item``. ``NODE_READS`` names each read
    and its HTTP method: ``GET /v1/sources/{kind}/{thread}/{read}`` for a thread's,
    ``POST /v1/sources/{kind}/{read}`` for a batch. On the sidecar, ``remote`` is the
    adapter of the node form's links (``kind``), reading what the node serves of
    ``serves``. The module may be the format's own (beside its local ``build``)."""

    NODE_READS: Mapping[str, Literal["GET", "POST"]]

    def serve(self, asked: NodeRead) -> tuple[int, dict[str, Any]]: ...

    def remote(self, settings: Settings, kind: str, serves: str) -> Adapter: ...


@runtime_checkable
class GatewayBound(Protocol):
    """An adapter of links the gateway writes and drives, whose probed source its own state
    names (a Codex thread the gateway continues on a branch of its own): the tick reads that
    state and hands the adapter the ref to read."""

    def binding_entry(self, agent_id: str, session_key: str) -> tuple[str, str, str]:
        """Where the session's binding is kept: plugin id, namespace, entry key."""
        ...

    def probed_ref(self, ref: Ref, thread_id: str, stored: Any, session_id: str | None) -> Ref:
        """The ref to read, given the stored binding (parsed JSON, None when there is none)."""
        ...

    def busy(self, stored: Any, now_ms: int) -> str | None:
        """Why the link is not to be checked now (the gateway is driving the source), or
        None."""
        ...

    def followed(self, ref: Ref) -> tuple[str, str] | None:
        """The thread followed beside the probed one on the sidecar's own marker (the
        source, once the gateway probes another thread), with the probed one; or None."""
        ...


def parse_time(value: Any) -> datetime | None:
    """An ISO 8601 timestamp (``Z`` for UTC), or None."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
