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
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from adapters.base import (
    Adapter,
    Drift,
    FileSource,
    Marker,
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
from monitor.errors import BadInput, Declined, OutsideRoots

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


def _check(probe: Probe) -> Outcome:
    try:
        data = _read(probe.ref)
    except FileNotFoundError:
        return Outcome(status="missing", reason="no such file")
    except OSError as exc:
        return Outcome(status="inconclusive", reason=exc.strerror or str(exc))
    start = non_negative_int(probe.marker.get("offset"))
    if start > len(data):
        start = 0  # truncated: read again from the start
    own, drift, turns = OwnPool(probe.own), Drift(), []
    end = start
    for kind, text, offset in _records(data, start):
        if kind == "!":
            return Outcome(
                status="blocked",
                blocked_offset=offset,
                reason=f"unreadable record at offset {offset}",
                drift=drift or None,
            )
        if kind == ">" and not own.consume(text_hash(text)):
            turns.append(Turn(offset=offset, native_id=None, text_hash=text_hash(text)))
        elif kind == "?":
            drift.unclassified += 1
        elif kind not in (">", "<"):
            drift.count_type(kind)
        end = data.index(b"\n", offset) + 1
    seen = Drift.from_json(probe.marker.get("drift")).merged(drift)
    return Outcome(
        status="activity" if turns else "quiet",
        marker={"offset": end, **({"drift": seen.to_json()} if seen else {})},
        turns=turns,
        dedupe_id=f"{end}",
        consumed_own=own.consumed,
        drift=drift or None,
    )


def build(settings: Settings) -> Adapter:
    return FakeAdapter(settings.root(KIND))
