"""A scripted upstream format, first-class like any other: the tests register it with one
registry line (``adapters.registry.register``), as a new format would be, and drive the
real monitor with it (in the spirit of httpx's ``MockTransport``).

A source is a text file under the kind's root, ``<name>.fake``, one record per line:

- ``> text``: a direct human turn (compared with the session's own messages for self-echo);
- ``< text``: the agent's turn: nothing to report;
- ``? text``: looks like a user's record, but no rule classifies it (drift: unclassified);
- ``!``: a record that cannot be read: the source blocks at its offset;
- ``<word> ...``: any other first word is a record type this format never had (drift).

The marker is ``{"offset", "drift"}``: after the last complete line read, and the drift met
so far (what ``links`` shows). A missing file is
``missing``; anything else that cannot be read is ``inconclusive``. ``fail`` makes the next
``check`` raise it (an adapter bug, which the monitor must contain).

Its node protocol is here too (:class:`adapters.base.NodeProtocol`), so that a format that
is not JSONL is served by a node through its own module: the registry entry that names this
module as its ``node`` also gives ``fake-node``. The node answers ``baseline`` (where a new
link starts) and ``records`` (from an offset: each complete line's type, offset and the hash
of its text; no text crosses the wire); :class:`FakeNodeAdapter` classifies them with the
local classifier (:func:`_outcome`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from adapters import node_client
from adapters.base import (
    Adapter,
    Drift,
    FileSource,
    Marker,
    NodeAddress,
    NodeRead,
    Outcome,
    OwnPool,
    Probe,
    Ref,
    Settings,
    Source,
    Turn,
    non_negative_int,
    text_hash,
)
from adapters.catalog import CatalogEntry, CatalogListing, catalog_id
from adapters.node_client import Gone, NodeError
from monitor.errors import BadInput, Declined, NotFound, OutsideRoots

if TYPE_CHECKING:
    import aiohttp  # a node is called only once one is configured

KIND = "fake"
SUFFIX = ".fake"


class FakeAdapter(FileSource):
    kind = KIND

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root) if root else ""
        self.fail: Exception | None = None

    def resolve(self, path: str, thread: str | None) -> Source:
        real = os.path.realpath(path)
        if not self.root or os.path.commonpath([self.root, real]) != self.root:
            raise OutsideRoots(f"{path} is not inside the configured {KIND} root {self.root}")
        if not os.path.isfile(real):
            raise Declined(f"cannot read {path}: no such file")
        return Source(ref={"filePath": real}, thread_id=os.path.basename(real)[: -len(SUFFIX)])

    async def baseline(self, ref: Ref) -> Marker:
        try:
            data = _read(ref)
        except OSError as exc:
            raise Declined(f"cannot read {ref.get('filePath')}: {exc.strerror}") from None
        return {"offset": data.rfind(b"\n") + 1}

    async def check(self, probes: list[Probe]) -> list[Outcome]:
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail
        return [_check(p) for p in probes]

    async def catalog(self) -> CatalogListing:
        found = CatalogListing()
        if not self.root or not os.path.isdir(self.root):
            return found
        for name in sorted(os.listdir(self.root)):
            path = os.path.join(self.root, name)
            if name.endswith(SUFFIX) and os.path.isfile(path):
                turns = [r[1] for r in _records(_read({"filePath": path})) if r[0] == ">"]
                stat = os.stat(path)
                found.entries.append(
                    CatalogEntry(
                        catalog_id=catalog_id(KIND, path),
                        kind=KIND,
                        native_id=name[: -len(SUFFIX)],
                        path=path,
                        cwd=None,
                        title=turns[0] if turns else None,
                        updated_at=int(stat.st_mtime * 1000),
                        size=stat.st_size,
                    )
                )
        return found

    def replay(
        self, path: str, thread: str | None, own_texts: list[str]
    ) -> Iterable[dict[str, Any]]:
        probe = Probe(
            session_key="replay",
            ref={"filePath": path},
            marker={"offset": 0},
            own=tuple(enumerate(text_hash(t) for t in own_texts)),
        )
        outcome = _check(probe)
        if outcome.status in ("missing", "inconclusive"):
            raise BadInput(f"cannot read {path}: {outcome.reason}")
        turns = [{"type": "turn", "offset": t.offset, "id": None} for t in outcome.turns]
        return [*turns, {"type": "summary", "humanTurns": len(turns)}]


def _read(ref: dict[str, Any]) -> bytes:
    with open(str(ref.get("filePath", "")), "rb") as f:
        return f.read()


def _records(data: bytes, start: int = 0) -> Iterable[tuple[str, str, int]]:
    """``(type, text, offset)`` of each complete line from ``start``."""
    offset = start
    while (end := data.find(b"\n", offset)) >= 0:
        line = data[offset:end].decode("utf-8", "replace")
        kind, _, text = line.partition(" ")
        yield kind, text, offset
        offset = end + 1


Hashed = tuple[str, str, int]  # a record as the classifier reads it: type, text hash, offset


def _hashed(data: bytes, start: int) -> tuple[list[Hashed], int]:
    """The complete lines from ``start`` (0 when the file is now shorter: truncated, read
    again from the start), and the offset past the last."""
    start = 0 if start > len(data) else start
    records = [(kind, text_hash(text), offset) for kind, text, offset in _records(data, start)]
    return records, max(start, data.rfind(b"\n") + 1)


def _check(probe: Probe) -> Outcome:
    try:
        data = _read(probe.ref)
    except FileNotFoundError:
        return Outcome(status="missing", reason="no such file")
    except OSError as exc:
        return Outcome(status="inconclusive", reason=exc.strerror or str(exc))
    return _outcome(probe, *_hashed(data, non_negative_int(probe.marker.get("offset"))))


def _outcome(probe: Probe, records: list[Hashed], end: int) -> Outcome:
    """What the records read from the marker on say (locally, or as a node sent them)."""
    own, drift, turns = OwnPool(probe.own), Drift(), []
    for kind, digest, offset in records:
        if kind == "!":
            return Outcome(
                status="blocked",
                blocked_offset=offset,
                reason=f"unreadable record at offset {offset}",
                drift=drift or None,
            )
        if kind == ">" and not own.consume(digest):
            turns.append(Turn(offset=offset, native_id=None, text_hash=digest))
        _drifted(kind, drift)
    seen = Drift.from_json(probe.marker.get("drift")).merged(drift)
    return Outcome(
        status="activity" if turns else "quiet",
        marker={"offset": end, **({"drift": seen.to_json()} if seen else {})},
        turns=turns,
        dedupe_id=f"{end}",
        consumed_own=own.consumed,
        drift=drift or None,
    )


def _drifted(kind: str, drift: Drift) -> None:
    """A record no rule classifies (``?``), or of a type the format never had, counted."""
    if kind == "?":
        drift.unclassified += 1
    elif kind not in (">", "<"):
        drift.count_type(kind)


def build(settings: Settings) -> Adapter:
    return FakeAdapter(settings.root(KIND))


# -- its node protocol: on the node ------------------------------------------------------

NODE_READS: Mapping[str, Literal["GET", "POST"]] = {"baseline": "GET", "records": "GET"}


def serve(asked: NodeRead) -> tuple[int, dict[str, Any]]:
    """``baseline``: ``{"offset"}``; ``records`` from ``offset``: ``{"records": [[type,
    hash, offset], ...], "end"}``. A thread is ``<thread>.fake`` right under the root."""
    start = asked.number("offset", 0) or 0
    path = os.path.join(asked.root, f"{asked.thread}{SUFFIX}")
    try:
        data = _read({"filePath": path})
    except FileNotFoundError:
        raise NotFound(f"no {KIND} session {asked.thread!r} under the node's root") from None
    except OSError as exc:
        return 503, {"error": {"code": "unreadable", "message": exc.strerror or str(exc)}}
    records, end = _hashed(data, start)
    if asked.read == "baseline":
        return 200, {"offset": end}
    return 200, {"records": [list(r) for r in records], "end": end}


# -- its node protocol: on the sidecar ---------------------------------------------------


class FakeNodeAdapter(node_client.NodeSource):
    """Links of ``fake-node``: the node's ``.fake`` sessions, classified here."""

    def __init__(self, kind: str, nodes: Mapping[str, NodeAddress]) -> None:
        self.kind = kind
        self.nodes = nodes

    async def catalog(self) -> CatalogListing:
        return await node_client.node_catalog(self.nodes, self.kind, KIND)

    async def _read(
        self, http: aiohttp.ClientSession, ref: Ref, read: str, offset: int
    ) -> dict[str, Any]:
        path = f"/v1/sources/{KIND}/{ref.get('threadId')}/{read}"
        params = {"offset": str(offset)}
        return await node_client.call(http, self.nodes, str(ref.get("nodeId")), path, params=params)

    async def baseline(self, ref: Ref) -> Marker:
        async with node_client.session() as http:
            try:
                answer = await self._read(http, ref, "baseline", 0)
            except NodeError as exc:
                raise Declined(f"cannot read the session from the node: {exc}") from None
        return {"offset": non_negative_int(answer.get("offset"))}

    async def check(self, probes: list[Probe]) -> list[Outcome]:
        return await node_client.each(probes, self._check_one)

    async def _check_one(self, http: aiohttp.ClientSession, probe: Probe) -> Outcome:
        offset = non_negative_int(probe.marker.get("offset"))
        try:
            answer = await self._read(http, probe.ref, "records", offset)
        except Gone:
            return Outcome(status="missing", reason="the node has no such session")
        except NodeError as exc:
            return Outcome(status="inconclusive", reason=str(exc))
        try:
            records = [(str(k), str(h), non_negative_int(o)) for k, h, o in answer["records"]]
        except (KeyError, TypeError, ValueError) as exc:
            return Outcome(status="inconclusive", reason=f"the node's answer is not usable: {exc}")
        return _outcome(probe, records, non_negative_int(answer.get("end")))


def remote(settings: Settings, kind: str, serves: str) -> Adapter:
    return FakeNodeAdapter(kind, settings.nodes)
