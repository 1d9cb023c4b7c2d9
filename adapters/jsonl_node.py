"""Codex rollouts and Pi sessions on a paired node: the node reads, the sidecar classifies.

Both halves of the wire are here. On the node, :func:`read_lines` runs the same tailer as a
local link (:mod:`adapters.tailer`): from the marker's byte offset, the scan cap's worth, up
to the last complete line, with the same rotated/truncated fingerprints, the same "compressed
or archived by the harness" rule for a file gone from its path, and the same line-length
bound. Of the lines it read it sends only what the format's scanner would read
(:func:`adapters.jsonl_scan.select`): the lines its pre-filter lets through, and the
offsets of lines that are not records at all, each record as its format's ``wire`` reduces
it (Pi's: to what its classifier reads; Codex's: without the system prompt a
``session_meta`` carries), and the offset of the first line read. Tool output and agent text
never cross the wire.

On the sidecar, :class:`NodeJsonlAdapter` keeps the same marker as a local link (``offset``,
``head``, ``ino``, ``tail``, ``recent``, ``drift``, the format's state) plus ``file``, the
session's path below the node's root, and settles each answer with the local adapter's own
code (:mod:`adapters.jsonl_adapter`): the same classifier, the same re-read of a rewritten
file, the same drift. A long line is read whole by the node in one answer (up to the line
bound); a line past it blocks the link at its offset, as locally.
"""

from __future__ import annotations

import base64
import dataclasses
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

import orjson

from adapters import node_client, zst
from adapters.base import (
    Adapter,
    Boundary,
    Marker,
    NodeAddress,
    NodeRead,
    Outcome,
    OwnPool,
    Probe,
    Ref,
    Settings,
    as_int,
    as_text,
    non_negative_int,
)
from adapters.catalog import CatalogListing
from adapters.jsonl_check import (
    complete_lines,
    file_end,
    idle,
    kept_elsewhere,
    reread_marker,
    settled,
)
from adapters.jsonl_format import JsonlFormat, format_of
from adapters.jsonl_scan import Cutoff, parse_line, scan
from adapters.node_client import Gone, NodeError
from adapters.states import boundary_lines, last_boundary
from adapters.tailer import NotRegularFile, TailRead, read_tail
from monitor.errors import Declined, NotFound

if TYPE_CHECKING:
    import aiohttp  # a node is called only once one is configured

MAX_CAP = 16 * 1_048_576  # the most a node reads for one answer, whatever is asked
WireLine = list[Any]  # [offset, text] · [offset, None, base64] · [offset] (not a record)


NOT_A_RECORD = b"!"  # what a node sends for a line its format's wire found no record in


def projected(
    fmt: JsonlFormat[Any], lines: list[tuple[int, bytes | None]]
) -> list[tuple[int, bytes | None]]:
    """The lines as the format's ``wire`` keeps them: each record reduced to what the
    classifier reads; a line that holds no record as :data:`NOT_A_RECORD`, which the
    sidecar's scanner judges as it would the line itself (not JSON: counted, or where a
    strict format stops)."""
    wire = fmt.wire
    if wire is None:
        return lines
    out: list[tuple[int, bytes | None]] = []
    for offset, line in lines:
        if line is None:
            out.append((offset, None))
            continue
        record = parse_line(line, recover=not fmt.strict)
        out.append(
            (offset, orjson.dumps(wire(record)) if isinstance(record, dict) else NOT_A_RECORD)
        )
    return out


def to_wire(lines: list[tuple[int, bytes | None]]) -> list[WireLine]:
    out: list[WireLine] = []
    for offset, line in lines:
        if line is None:
            out.append([offset])
            continue
        try:
            out.append([offset, line.decode("utf-8")])
        except UnicodeDecodeError:  # the scanner reads odd bytes as they are
            out.append([offset, None, base64.b64encode(line).decode("ascii")])
    return out


def from_wire(raw: Any) -> list[tuple[int, bytes | None]]:
    """The node's lines; raises ValueError on anything else."""
    if not isinstance(raw, list):
        raise ValueError("lines is not a list")
    out: list[tuple[int, bytes | None]] = []
    for item in raw:
        if not isinstance(item, list) or not item or non_negative_int(item[0]) != item[0]:
            raise ValueError("a line is not [offset, ...]")
        if len(item) == 1:
            out.append((item[0], None))
        elif isinstance(item[1], str):
            out.append((item[0], item[1].encode("utf-8", "surrogatepass")))
        elif len(item) == 3 and isinstance(item[2], str):
            out.append((item[0], base64.b64decode(item[2], validate=True)))
        else:
            raise ValueError("a line is neither text nor base64")
    return out


# -- on the node ------------------------------------------------------------------------

NODE_READS: Mapping[str, Literal["GET", "POST"]] = {"baseline": "GET", "lines": "GET"}


def serve(asked: NodeRead) -> tuple[int, dict[str, Any]]:
    """``baseline``: where a new link starts; ``lines``: one answer from the marker the
    query gives (``offset``, ``ino``, ``head``, ``tail``; ``cap``, ``maxLine``; ``file``,
    the session's path below the root, as the marker has it)."""
    fmt = format_of(asked.kind)
    marker = {
        "offset": asked.number("offset", 0),
        "ino": asked.number("ino"),
        "head": asked.digest("head"),
        "tail": asked.digest("tail"),
    }
    cap = asked.number("cap", MAX_CAP) or 1
    max_line = asked.number("maxLine", MAX_CAP) or 1
    path = find_file(fmt, asked.root, str(asked.thread), asked.query.get("file"))
    if asked.read == "baseline":
        return 200, read_baseline(fmt, asked.root, path)
    return 200, read_lines(fmt, asked.root, path, marker, cap, max_line)


def find_file(fmt: JsonlFormat[Any], root: str, thread: str, file: str | None) -> str:
    """The session's plain file below ``root`` (its path, though only a compressed sibling
    may be there): ``file`` when it names one of the thread's files below the root, else
    found by walking the root. Raises :class:`NotFound` (``no_such_thread``)."""
    real_root = os.path.realpath(root)

    def inside(path: str) -> str | None:  # resolved at every use: a link may lead out
        real = os.path.realpath(path)
        return real if real.startswith(real_root + os.sep) else None

    if file:
        path = inside(os.path.join(real_root, file))
        if path is not None and _thread_of(fmt, path) == thread:
            return path
    for dirpath, dirnames, names in os.walk(real_root):
        dirnames.sort()
        for name, plain in _sessions_of(fmt, os.path.basename(dirpath), names, thread):
            found = inside(os.path.join(dirpath, name))
            if found is not None:
                return os.path.join(os.path.dirname(found), plain)
    raise NotFound(f"no {fmt.kind} session {thread!r} under the node's {fmt.kind} root")


def _sessions_of(
    fmt: JsonlFormat[Any], folder: str, names: list[str], thread: str
) -> Iterator[tuple[str, str]]:
    """The files of a folder that are ``thread``'s session (each name, and its plain name:
    a compressed one stands for its plain file), in name order."""
    for name in sorted(names):
        plain = zst.plain_of(name) if fmt.compressed else name
        session = plain.endswith(".jsonl") and fmt.candidate(folder, plain) is True
        if session and _thread_of(fmt, plain) == thread:
            yield name, plain


def _thread_of(fmt: JsonlFormat[Any], path: str) -> str:
    return fmt.thread_id(os.path.basename(path).removesuffix(".jsonl"))


def relative(root: str, path: str) -> str:
    return os.path.relpath(path, os.path.realpath(root))


def read_baseline(fmt: JsonlFormat[Any], root: str, path: str) -> dict[str, Any]:
    """Where a newly adopted session starts, and its first line (the format's state), as
    a local baseline reads them."""
    where, first = file_end(fmt, path)
    line = to_wire(projected(fmt, [(0, first)]))[0] if first is not None else None
    return {"file": relative(root, path), **where, "first": line}


def read_lines(
    fmt: JsonlFormat[Any], root: str, path: str, marker: Marker, cap: int, max_line: int
) -> dict[str, Any]:
    """One answer: what a local check would read from the marker on (see the module)."""
    offset = non_negative_int(marker.get("offset"))
    head, ino, tail = marker.get("head"), marker.get("ino"), marker.get("tail")
    cap = max(1, min(cap, MAX_CAP))
    file = relative(root, path)
    try:
        read = read_tail(path, offset, cap, head, ino, 0, tail)
        if read.status == "long":  # read the long line whole, or know it is too long
            read = read_tail(path, offset, max_line + 1, head, ino, 0, tail)
            if read.status in ("long", "waiting"):
                return _long(read, offset, max_line, file)
        if read.status in ("rotated", "truncated"):
            return {"status": read.status, "file": file}
        if read.status in ("idle", "waiting"):
            return {"status": "idle", "file": file, **_where(read)}
        pick, read = complete_lines(fmt, path, read, max_line)
        if pick.long_at is not None and pick.long_at == pick.first:
            return _blocked(read.end, max_line)
    except OSError as exc:
        return _unread(fmt, root, path, file, exc)
    return {
        "status": "lines",
        "file": file,
        **_where(read),
        "size": read.size,
        "lines": to_wire(projected(fmt, pick.lines)),
        "first": pick.first,
        "boundary": _boundary(fmt, read),
    }


def _boundary(fmt: JsonlFormat[Any], read: TailRead) -> list[WireLine]:
    """The few lines of the read that say what the session is doing, as the format's
    ``state_wire`` reduces them (``adapters.states.boundary_lines``); offsets are not
    needed (sent as 0)."""
    found = boundary_lines(fmt, read.chunk, 0, read.end - read.start)
    reduce = fmt.state_wire
    lines: list[tuple[int, bytes | None]] = []
    for line in found:
        record = parse_line(line, recover=not fmt.strict) if reduce is not None else None
        lines.append(
            (0, orjson.dumps(reduce(record)) if reduce and isinstance(record, dict) else line)
        )
    return to_wire(lines)


def _long(read: TailRead, offset: int, max_line: int, file: str) -> dict[str, Any]:
    """A line longer than the scan cap, read up to the line bound: too long (blocked), or
    not ended yet (waiting, said with how much of it is there)."""
    if read.status == "long":
        return _blocked(offset, max_line)
    said = f"reading a long line at offset {offset}: {len(read.chunk)} bytes so far"
    return {"status": "waiting", "file": file, "reason": said}


def _unread(fmt: JsonlFormat[Any], root: str, path: str, file: str, exc: OSError) -> dict[str, Any]:
    """A session file that could not be read: kept elsewhere by the harness, missing, or
    an error with its reason."""
    if isinstance(exc, FileNotFoundError):
        kept = kept_elsewhere(fmt, path, root)
        if kept:
            return {"status": "kept", "file": file, "reason": kept}
        return {"status": "missing", "file": file}
    reason = str(exc) if isinstance(exc, NotRegularFile) else exc.strerror or str(exc)
    return {"status": "error", "file": file, "reason": reason}


def _where(read: TailRead) -> dict[str, Any]:
    return {"end": read.end, "head": read.head, "ino": read.ino, "tail": read.tail}


def _blocked(offset: int, max_line: int) -> dict[str, Any]:
    reason = f"a line longer than max_line_bytes ({max_line}) starts at {offset}"
    return {"status": "blocked", "offset": offset, "reason": reason}


# -- on the sidecar ---------------------------------------------------------------------


class NodeJsonlAdapter(node_client.NodeSource):
    """Links of ``kind`` (``codex-node``, ``pi-node``): the node's ``fmt`` sessions."""

    def __init__(
        self, kind: str, fmt: JsonlFormat[Any], nodes: Mapping[str, NodeAddress], settings: Settings
    ) -> None:
        self.kind = kind
        self.format = fmt
        self.nodes = nodes
        self.cap = settings.scan_cap
        self.max_line = settings.max_line

    async def catalog(self) -> CatalogListing:
        return await node_client.node_catalog(self.nodes, self.kind, self.format.kind)

    def _path(self, ref: Ref, what: str) -> tuple[str, str]:
        """The node a ref names, and the path of ``what`` of its session there."""
        path = f"/v1/sources/{self.format.kind}/{ref.get('threadId')}/{what}"
        return str(ref.get("nodeId")), path

    async def baseline(self, ref: Ref) -> Marker:
        name, path = self._path(ref, "baseline")
        async with node_client.session() as http:
            try:
                answer = await node_client.call(http, self.nodes, name, path)
            except Gone:
                raise Declined(f"node {name} has no such {self.format.kind} session") from None
            except NodeError as exc:
                raise Declined(f"cannot read the session from the node: {exc}") from None
        try:
            first = from_wire([answer["first"]])[0][1] if answer.get("first") else None
        except (ValueError, TypeError) as exc:
            raise Declined(f"the node's answer is not usable: {exc}") from None
        state = self.format.state_from_first(parse_line(first, recover=False) if first else None)
        reason = self.format.declines(state)
        if reason:
            raise Declined(reason)
        where = {k: answer.get(k) for k in ("offset", "head", "ino", "tail")}
        return {"file": answer.get("file"), **where, **state.to_marker()}

    async def check(self, probes: list[Probe]) -> list[Outcome]:
        return await node_client.each(probes, self._check_one)

    async def _check_one(
        self, http: aiohttp.ClientSession, probe: Probe, again: bool = False
    ) -> Outcome:
        marker = probe.marker
        name, path = self._path(probe.ref, "lines")
        try:
            answer = await node_client.call(
                http, self.nodes, name, path, params=self._params(marker)
            )
        except Gone:
            return Outcome(status="missing", reason="the node has no such session")
        except NodeError as exc:
            return Outcome(status="inconclusive", reason=str(exc))
        status = answer.get("status")
        file = _text(answer, "file") or marker.get("file")
        said = _said(str(status), answer, marker)
        if said is not None:
            return said
        if status in ("rotated", "truncated") and not again:
            fresh = reread_marker(probe, str(status), f"{self.format.kind} {file} on node {name}")
            return await self._check_one(http, probe._replace(marker={**fresh, "file": file}), True)
        if status not in ("idle", "lines"):
            return Outcome(status="inconclusive", reason=f"node {name}: {_reason(answer)}")
        try:
            read = _read_of(answer)
            lines = from_wire(answer.get("lines", [])) if status == "lines" else []
            boundary = self._boundary(answer.get("boundary"))
        except (ValueError, TypeError) as exc:
            return Outcome(status="inconclusive", reason=f"the node's answer is not usable: {exc}")
        if status == "idle":
            return idle(marker, read)
        probe = probe._replace(marker={**marker, "file": file})
        return self._settled(probe, answer, read, lines, boundary)

    def _params(self, marker: Marker) -> dict[str, str]:
        """The read a marker asks the node for (see :func:`serve`)."""
        params = {"cap": str(self.cap), "maxLine": str(self.max_line)}
        params["offset"] = str(non_negative_int(marker.get("offset")))
        for key in ("head", "tail", "file"):
            if isinstance(marker.get(key), str):
                params[key] = marker[key]
        if isinstance(marker.get("ino"), int):
            params["ino"] = str(marker["ino"])
        return params

    def _settled(
        self,
        probe: Probe,
        answer: dict[str, Any],
        read: TailRead,
        lines: list[tuple[int, bytes | None]],
        boundary: Boundary | None,
    ) -> Outcome:
        """The node's lines, classified and settled as a local check's; ``boundary``: what
        the lines the node sent for it say the session is doing (not taken when the scan
        stopped short of the read's end, at an invalid row: those lines are not read)."""
        state = self.format.state_from_marker(probe.marker)
        own = OwnPool(probe.own)
        result = scan(self.format, lines, state, own, Cutoff.of(probe.marker))
        first = answer.get("first")  # a node before 2026-12 sends none: its first line's
        first = first if isinstance(first, int) else (lines[0][0] if lines else None)
        outcome = settled(self.format, probe, read, first, result, state, own)
        if result.stopped_at is not None or outcome.status != "activity":
            return outcome
        return dataclasses.replace(outcome, boundary=boundary)

    def _boundary(self, raw: Any) -> Boundary | None:
        """What the session is doing, derived here from the lines the node sent for it (a
        node of an earlier release sends none: none is derived, the state stays). Raises
        ValueError on lines that are not lines."""
        if raw is None:
            return None
        chunk = b"".join(line + b"\n" for _, line in from_wire(raw) if line is not None)
        return last_boundary(self.format, chunk, 0, len(chunk))


def _reason(answer: dict[str, Any]) -> str:
    return str(answer.get("reason") or answer.get("status"))


def _said(status: str, answer: dict[str, Any], marker: Marker) -> Outcome | None:
    """The outcome an answer of no lines says by its status alone, if it does."""
    reason = _reason(answer)
    if status == "missing":
        return Outcome(status="missing", reason="no such file on the node")
    if status in ("kept", "waiting"):
        return Outcome(status="quiet", marker=marker, reason=reason)
    if status == "blocked":
        at = non_negative_int(answer.get("offset"))
        return Outcome(status="blocked", blocked_offset=at, reason=reason)
    return None


def _text(answer: dict[str, Any], key: str) -> str | None:
    value = answer.get(key)
    return as_text(value)


def _read_of(answer: dict[str, Any]) -> TailRead:
    ino = answer.get("ino")
    return TailRead(
        status="lines" if answer.get("status") == "lines" else "idle",
        end=non_negative_int(answer.get("end")),
        size=non_negative_int(answer.get("size")),
        head=_text(answer, "head"),
        tail=_text(answer, "tail"),
        ino=as_int(ino),
    )


def remote(settings: Settings, kind: str, serves: str) -> Adapter:
    return NodeJsonlAdapter(kind, format_of(serves), settings.nodes, settings)
