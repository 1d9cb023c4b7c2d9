"""Codex threads the gateway adopted through Codex's app-server (``codex-app-server`` links).

The gateway writes these links itself, on its own marker ``{turnId, userMessageCount}``, and
its monitor checks them every minute by asking the app-server for the probed thread's newest
100 turns. This adapter computes the same record from the thread's rollout file, within a
second of the append, so that whichever of the two sees a prompt first records it, once:

- the thread read is the one the gateway probes: the tick passes it in the ref as
  ``probeThreadId`` (the supervision branch once the gateway made it, else the source);
- its rollout is found through Codex's own ``state_5.sqlite`` (``threads.rollout_path``, the
  live generation) or its file name, in ``sessions/``, ``archived_sessions/``, plain or
  compressed; a file that points back through ``session_meta.history_base`` (a revert, a
  fork) is read after the part of its base it names;
- turns are what the app-server lists: one per ``task_started`` turn id; a user message is a
  ``UserMessage`` item (paginated rollouts, by its ``turn_id``) or a ``user_message`` event
  (legacy rollouts, in the open turn); a steer adds a second one to a turn, a compaction is
  a turn with none, a legacy rollback drops turns;
- the window, the counts after the marker, the self-echo against the gateway's own texts
  and the dedupe id ``<newest turn id>:<its user-message count>`` are the gateway monitor's,
  and the marker advances even when no prompt was a person's;
- once the gateway probes its branch, the source is read too (:func:`followed`), on the
  sidecar's own marker, which the tick keeps beside the link (a person may go on typing
  there, and the gateway no longer reads it).

A thread the gateway started (``thread_source: "openclaw"``) is read like any other: on a
gateway's link, self-echo decides. A rollout this reader does not know (another
``history_mode``, no turn ids) is drift, said once, and the link is left to the gateway
meanwhile; a rollout that cannot be found is never "missing" here, as it is never missing
for the gateway's own check (an archived or compressed thread stays readable).

Reads are incremental: a file's turns are kept with the offset they were read to, so a
check reads only the bytes appended since; lines are parsed only when their bytes name a
turn's start or end, a user message or a rollback.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import logging
import os
import re
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, NamedTuple

import orjson

from adapters.base import (
    Drift,
    Follow,
    Followed,
    Marker,
    Outcome,
    Probe,
    Ref,
    Settings,
    Source,
    Turn,
    normalize_text,
    text_hash,
)
from adapters.catalog import CatalogListing
from adapters.codex import KNOWN_TYPES, may_be_turn, unknown_subtype
from adapters.tailer import open_regular
from adapters.zst import SUFFIX, chunks
from monitor.errors import BadInput

log = logging.getLogger(__name__)

KIND = "codex-app-server"
TURN_LIMIT = 100  # the gateway's ``thread/turns/list`` page: the newest 100 turns
HISTORY_MODES = (None, "legacy", "paginated")
BASE_DEPTH = 16  # history_base links followed at most (a revert of a fork of a revert ...)
ARCHIVE_DIR = "archived_sessions"
STATE_DB = "state_5.sqlite"
PROJECTION_DB = "thread_history_1.sqlite"  # what a paginated thread's listing reads
# the bytes a line must hold to matter to the turn list; any other line is skipped unparsed
_NEEDLES = (
    b'"session_meta"',
    b'"task_started"',
    b'"task_complete"',
    b'"turn_aborted"',
    b'"UserMessage"',
    b'"user_message"',
    b'"thread_rolled_back"',
)


class Message(NamedTuple):
    """One user message of a turn, as the gateway's self-echo compares it: the hash of its
    text blocks joined (each trimmed, whitespace collapsed), each block's hash, and whether
    it carries the provenance line of a prompt the gateway sent (:data:`PROVENANCE`)."""

    joined: str
    blocks: tuple[str, ...]
    sent: bool = False


# The line the gateway's Codex plugin puts before a prompt it sends into a thread it runs
# (``[OpenClaw conversation info: sender={...}]``, its ``buildCodexHistoryProvenancePrefix``):
# such a prompt is the gateway's, never a person's typing in the thread. Its own monitor
# compares only texts: the transcript text it compares with is set after the prompt is
# already in the thread (about 40 ms later, seen with OpenClaw 2026.9.6), and it is the text
# without this line, so the monitor takes its own run's prompt for a person's a minute
# later. The sidecar, checking first, advances the marker past it instead.
PROVENANCE = re.compile(r"\A\s*\[OpenClaw conversation info: sender=[^\n]*\]\n")


@dataclass(slots=True)
class RolloutTurn:
    id: str | None
    messages: list[Message] = field(default_factory=list)
    started_s: int | None = None
    completed_s: int | None = None
    open: bool = True


class FormatDrift(Exception):
    """A rollout this reader does not know: the link is left to the gateway."""


@dataclass(slots=True)
class FileTurns:
    """A rollout's turns as read so far, and where the read stopped."""

    ino: int
    size: int
    offset: int  # after the last complete line read
    turns: list[RolloutTurn]  # from the records the listing shows (see ``upto``)
    paginated: bool
    base_paths: tuple[str, ...] = ()  # the files it points back to (watched with it)
    pending: list[dict[str, Any]] = field(default_factory=list)  # read, not yet listed
    drift: Drift = field(default_factory=Drift)  # record types never declared, so far

    def upto(self, cutoff: int | None) -> list[RolloutTurn]:
        """The turns as the app-server lists them when its projection has taken the
        records before ordinal ``cutoff`` (None: every record read)."""
        builder = TurnBuilder(self.turns, self.paginated)
        taken = 0
        for record in self.pending:
            ordinal = record.get("ordinal")
            if cutoff is not None and (not isinstance(ordinal, int) or ordinal >= cutoff):
                break
            builder.add(record)
            taken += 1
        del self.pending[:taken]
        return self.turns


def _seconds(record: dict[str, Any]) -> int | None:
    at = record.get("timestamp")
    if not isinstance(at, str):
        return None
    try:
        return int(datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return None


def _message(content: Any, text: Any = None) -> Message:
    """The gateway's reading of a user message: its text blocks, trimmed and collapsed, the
    empty ones dropped; with none, the message's ``text`` (or nothing)."""
    raw: list[str] = []
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "text":
                value = block.get("text")
                if isinstance(value, str) and normalize_text(value):
                    raw.append(value)
    if not raw:
        raw = [text if isinstance(text, str) else ""]
    blocks = [normalize_text(b) for b in raw]
    sent = PROVENANCE.match(raw[0]) is not None
    return Message(text_hash(" ".join(blocks)), tuple(text_hash(b) for b in blocks), sent)


class TurnBuilder:
    """Turns from rollout records, in file order, as the app-server builds its turn list."""

    def __init__(self, turns: list[RolloutTurn], paginated: bool) -> None:
        self.turns = turns
        self.paginated = paginated

    def _find(self, turn_id: Any) -> RolloutTurn | None:
        if not isinstance(turn_id, str):
            return None
        for turn in reversed(self.turns):
            if turn.id == turn_id:
                return turn
        return None

    def _open_turn(self, at: int | None) -> RolloutTurn:
        if self.turns and self.turns[-1].open:
            return self.turns[-1]
        implicit = RolloutTurn(id=None, started_s=at)  # a message outside any turn
        self.turns.append(implicit)
        return implicit

    def add(self, record: dict[str, Any]) -> None:
        payload = record.get("payload")
        if record.get("type") != "event_msg" or not isinstance(payload, dict):
            return
        event, at = payload.get("type"), _seconds(record)
        if event == "task_started":
            known = self._find(payload.get("turn_id"))
            if known is None:
                self.turns.append(RolloutTurn(id=_turn_id(payload), started_s=at))
            else:
                known.open = True
        elif event in ("task_complete", "turn_aborted"):
            done = self._find(payload.get("turn_id")) or (self.turns[-1] if self.turns else None)
            if done is not None:
                done.open = False
                done.completed_s = at
        elif event == "item_completed" and self.paginated:
            item = payload.get("item")
            if isinstance(item, dict) and item.get("type") == "UserMessage":
                turn = self._find(payload.get("turn_id"))
                if turn is None:
                    turn = RolloutTurn(id=_turn_id(payload), started_s=at)
                    self.turns.append(turn)
                turn.messages.append(_message(item.get("content"), item.get("text")))
        elif event == "user_message" and not self.paginated:
            self._open_turn(at).messages.append(_message(None, payload.get("message")))
        elif event == "thread_rolled_back":
            n = payload.get("num_turns")
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                del self.turns[-n:]


def _turn_id(payload: dict[str, Any]) -> str | None:
    turn_id = payload.get("turn_id")
    return turn_id if isinstance(turn_id, str) and turn_id else None


def _lines(data: bytes) -> list[bytes]:
    """The complete lines of ``data`` (a torn last line waits for its end)."""
    return data[: data.rfind(b"\n") + 1].split(b"\n")[:-1]


def _matters(line: bytes) -> bool:
    return any(needle in line for needle in _NEEDLES)


def _records(data: bytes, drift: Drift | None = None) -> list[dict[str, Any]]:
    """The turn records among ``data``'s complete lines. A line of a record type or subtype
    Codex never declared (the classifier's test: :func:`adapters.codex.may_be_turn`, then
    the declared lists) is counted in ``drift``: a new form of a prompt would be one."""
    found = []
    for line in _lines(data):
        if _matters(line):
            record = _parse(line)
            if record is not None and record.get("type") != "session_meta":
                found.append(record)
        elif drift is not None and may_be_turn(line):
            _count_unknown(line, drift)
    return found


def _count_unknown(line: bytes, drift: Drift) -> None:
    record = _parse(line)
    if record is None:
        return  # a torn or foreign line: the app-server skips it too
    kind = record.get("type")
    if kind not in KNOWN_TYPES:
        drift.count_type(str(kind))
        return
    unknown = unknown_subtype(str(kind), record.get("payload"))
    if unknown is not None:
        drift.count_type(unknown)


def _meta(line: bytes) -> dict[str, Any]:
    """A rollout's ``session_meta`` payload from its first line; :class:`FormatDrift` when
    it has none or names a history mode this reader does not know."""
    record = _parse(line)
    payload = record.get("payload") if record and record.get("type") == "session_meta" else None
    if not isinstance(payload, dict):
        raise FormatDrift("a rollout without a session_meta first line (no turn ids)")
    if payload.get("history_mode") not in HISTORY_MODES:
        raise FormatDrift(f"a rollout with history_mode {payload.get('history_mode')!r}")
    return payload


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None  # a torn or foreign line: the app-server skips it too
    return record if isinstance(record, dict) else None


class RolloutReader:
    """Finds a thread's rollout under a Codex home and reads its turns, incrementally."""

    def __init__(self, codex_home: str) -> None:
        self.home = codex_home
        self._files: dict[str, FileTurns] = {}
        self._bases: dict[tuple[str, int], list[RolloutTurn]] = {}
        # thread id -> the rollout last found for it, and the state database's stamp then
        self._paths: dict[str, tuple[str, tuple[int, ...] | None]] = {}
        self._projected: dict[str, tuple[tuple[int, ...], int]] = {}  # thread -> stamp, cutoff

    # -- finding ------------------------------------------------------------------------

    def find(self, thread_id: str, hint: str | None = None) -> str | None:
        """The live rollout of ``thread_id``: the one Codex's state database names, else the
        newest file named for it, in ``sessions/`` or ``archived_sessions/``; under this
        reader's Codex home, else under the home of ``hint`` (the rollout the gateway's
        binding names, when the gateway's Codex home is another).

        What was found is kept while the state database it came from is unchanged: a
        revert, an archive or a compression writes it (and without one, the names are
        looked at again)."""
        homes = [self.home] if self.home else []
        other = _home_of(hint) if hint else None
        if other and other not in homes:
            homes.append(other)
        known = self._paths.get(thread_id)
        for home in homes:
            stamp = _stamp(os.path.join(home, STATE_DB))
            if known and stamp and known[1] == stamp and os.path.isfile(known[0]):
                return known[0]
            found = self._from_state_db(home, thread_id) or self._by_name(thread_id, home)
            if found:
                self._paths[thread_id] = (found, stamp)
                return found
        return None

    def _from_state_db(self, home: str, thread_id: str) -> str | None:
        row = _one_row(
            os.path.join(home, STATE_DB), "SELECT rollout_path FROM threads WHERE id = ?", thread_id
        )
        if not row or not isinstance(row[0], str):
            return None
        for candidate in (row[0], row[0] + SUFFIX):
            if os.path.isfile(candidate):
                return candidate
        return None

    def _by_name(self, file_id: str, home: str | None = None) -> str | None:
        """The newest rollout whose name ends in ``file_id`` (a thread id, or the generation
        id a revert adds after ``_``), plain or compressed, live or archived."""
        if not file_id or any(c in file_id for c in "*?[]/\\"):
            return None
        found: list[str] = []
        root = glob.escape(home or self.home)
        for folder in (os.path.join(root, "sessions", "*", "*", "*"),
                       os.path.join(root, ARCHIVE_DIR)):  # fmt: skip
            for stem in (f"rollout-*-{file_id}", f"rollout-*-{file_id}_*", f"rollout-*_{file_id}"):
                for suffix in (".jsonl", ".jsonl" + SUFFIX):
                    found += glob.glob(os.path.join(folder, stem + suffix))
        # the newest generation: a name starts with its creation time (``rollout-<time>-``)
        return max(found, key=lambda p: os.path.basename(p)[: len("rollout-") + 19], default=None)

    def projected(self, path: str, thread_id: str) -> int | None:
        """How far the app-server's listing of a paginated thread has read its rollout: the
        ordinal its projection (``thread_history_1.sqlite``) takes next. The listing trails
        the rollout by a moment, and a marker is only ever moved to a turn the listing
        shows, so that the gateway's own check always finds it. None where Codex keeps no
        projection (the listing then reads the rollout); 0 for a thread it has not taken."""
        home = _home_of(path)
        db = os.path.join(home, PROJECTION_DB) if home else ""
        stamp = _stamp(db) if db else None
        if stamp is None:
            return None
        known = self._projected.get(thread_id)
        if known is not None and known[0] == stamp:
            return known[1]
        try:
            row = _one_row(
                db,
                "SELECT next_rollout_ordinal FROM thread_history_projection_state"
                " WHERE thread_id = ?",
                thread_id,
                quiet=False,
            )
        except sqlite3.Error:
            return None  # another schema: the rollout as read
        cutoff = int(row[0]) if row and isinstance(row[0], int) else 0
        self._projected[thread_id] = (stamp, cutoff)
        return cutoff

    def projection_files(self, path: str) -> list[str]:
        home = _home_of(path)
        db = os.path.join(home, PROJECTION_DB) if home else ""
        return [db, db + "-wal"] if db and os.path.isfile(db) else []

    def bases_of(self, path: str) -> tuple[str, ...]:
        """The files ``path`` points back to, as last read."""
        cached = self._files.get(path)
        return cached.base_paths if cached else ()

    # -- reading ------------------------------------------------------------------------

    def turns(self, path: str) -> FileTurns:
        """The rollout's turns, its bases' first. Raises OSError (unreadable) or
        :class:`FormatDrift`."""
        if path.endswith(SUFFIX):
            return self._compressed(path)
        fd, st = open_regular(path)
        with os.fdopen(fd, "rb") as f:
            cached = self._files.get(path)
            if cached is None or cached.ino != st.st_ino or st.st_size < cached.offset:
                cached = self._start(path, f, st)
            if st.st_size > cached.offset:
                f.seek(cached.offset)
                data = f.read(st.st_size - cached.offset)
                cached.pending += _records(data, cached.drift)
                cached.offset += data.rfind(b"\n") + 1
            cached.size = st.st_size
        return cached

    def _start(self, path: str, f: Any, st: os.stat_result) -> FileTurns:
        """A file read from its first line: its ``session_meta`` says its mode and base."""
        head = f.readline(1 << 20)
        if not head.endswith(b"\n"):
            return FileTurns(st.st_ino, st.st_size, 0, [], paginated=False)  # not yet written
        payload = _meta(head.rstrip(b"\n"))
        turns, bases = self._base(path, payload.get("history_base"), 0)
        paginated = payload.get("history_mode") == "paginated"
        files = FileTurns(st.st_ino, st.st_size, len(head), turns, paginated, bases)
        self._files[path] = files
        return files

    def _base(self, path: str, base: Any, depth: int) -> tuple[list[RolloutTurn], tuple[str, ...]]:
        """The turns of the history a file points back to: its base's lines before
        ``end_byte_offset`` (read through the base's own base)."""
        if base is None:
            return [], ()
        if not isinstance(base, dict) or depth >= BASE_DEPTH:
            raise FormatDrift("a history_base this reader does not know")
        ident, end = base.get("thread_id"), base.get("end_byte_offset")
        if not isinstance(ident, str) or not isinstance(end, int) or end < 0:
            raise FormatDrift("a history_base this reader does not know")
        found = self._base_file(path, ident)
        if found is None:
            raise FormatDrift(f"the history base {ident} of {os.path.basename(path)} is not found")
        cached = self._bases.get((found, end))
        if cached is None:
            data = b"".join(_plain_chunks(found))[:end]
            head_end = data.find(b"\n") + 1
            payload = _meta(data[: head_end - 1])
            turns, _ = self._base(found, payload.get("history_base"), depth + 1)
            builder = TurnBuilder(turns, payload.get("history_mode") == "paginated")
            for record in _records(data[head_end:]):
                builder.add(record)
            self._bases[(found, end)] = cached = turns
        return _copy(cached), (found,)

    def _base_file(self, path: str, ident: str) -> str | None:
        """A base named by id: a file beside ``path`` first (a revert or a fork of the same
        day), else anywhere under the home."""
        folder = os.path.dirname(path)
        for stem in (f"rollout-*-{ident}", f"rollout-*_{ident}"):
            for suffix in (".jsonl", ".jsonl" + SUFFIX):
                hits = glob.glob(os.path.join(glob.escape(folder), stem + suffix))
                if hits:
                    return hits[0]
        return self._by_name(ident, _home_of(path))

    def _compressed(self, path: str) -> FileTurns:
        st = os.stat(path)
        cached = self._files.get(path)
        if cached is not None and cached.ino == st.st_ino and cached.size == st.st_size:
            return cached
        data = b"".join(chunks(path))
        head_end = data.find(b"\n") + 1
        payload = _meta(data[: head_end - 1])
        turns, bases = self._base(path, payload.get("history_base"), 0)
        paginated = payload.get("history_mode") == "paginated"
        end = head_end + data[head_end:].rfind(b"\n") + 1
        files = FileTurns(st.st_ino, st.st_size, end, turns, paginated, bases)
        files.pending = _records(data[head_end:], files.drift)
        self._files[path] = files
        return files


def _stamp(db: str) -> tuple[int, ...] | None:
    """What changes when a SQLite file (or its write-ahead log) is written."""
    try:
        st = os.stat(db)
    except OSError:
        return None
    try:
        wal = os.stat(db + "-wal")
        return (st.st_mtime_ns, st.st_size, wal.st_mtime_ns, wal.st_size)
    except OSError:
        return (st.st_mtime_ns, st.st_size)


def _home_of(rollout: str) -> str | None:
    """The Codex home a rollout lies in (the folder holding its ``sessions/`` or
    ``archived_sessions/``)."""
    parts = os.path.abspath(rollout).split(os.sep)
    for i in range(len(parts) - 1, 0, -1):
        if parts[i] in ("sessions", ARCHIVE_DIR):
            return os.sep.join(parts[:i]) or os.sep
    return None


def _plain_chunks(path: str) -> Iterator[bytes]:
    if path.endswith(SUFFIX):
        yield from chunks(path)
        return
    fd, _ = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(1 << 20):
            yield chunk


def _copy(turns: list[RolloutTurn]) -> list[RolloutTurn]:
    return [RolloutTurn(t.id, list(t.messages), t.started_s, t.completed_s, t.open) for t in turns]


def _one_row(db: str, sql: str, arg: str, *, quiet: bool = True) -> tuple[Any, ...] | None:
    """One row of a read-only query on one of Codex's SQLite files (None when the file is
    not there; when it cannot be read, None too, or the error when not ``quiet``)."""
    from urllib.parse import quote

    if not os.path.isfile(db):
        return None
    try:
        conn = sqlite3.connect(f"file:{quote(db)}?mode=ro", uri=True, timeout=1.0)
        try:
            row: tuple[Any, ...] | None = conn.execute(sql, (arg,)).fetchone()
            return row
        finally:
            conn.close()
    except sqlite3.Error:
        if quiet:
            return None  # another schema or a locked file: the file names find it
        raise


# -- the gateway monitor's check ---------------------------------------------------------


class GatewayMarker(NamedTuple):
    turn_id: str | None
    messages: int | None  # None: the marker names no count


def read_marker(marker: Marker) -> GatewayMarker | None:
    """The gateway's marker, or None when it is not one the gateway would read."""
    turn_id = marker.get("turnId")
    if turn_id is not None and not isinstance(turn_id, str):
        return None
    count = marker.get("userMessageCount", None)
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        return None
    if "turnId" not in marker:
        return None
    return GatewayMarker(turn_id, count)


def own_echo(message: Message, own: frozenset[str]) -> bool:
    """The gateway's self-echo: the message's text is one of its own recent texts, or it has
    several blocks and each is; and a prompt its Codex plugin sent, by its provenance
    line."""
    if message.sent or message.joined in own:
        return True
    return len(message.blocks) > 1 and all(b in own for b in message.blocks)


def gateway_check(
    turns: list[RolloutTurn], marker: Marker, own: frozenset[str], now_ms: int
) -> Outcome:
    """What the gateway's monitor records for ``turns`` (oldest first) from ``marker``."""
    window = turns[-TURN_LIMIT:][::-1]  # newest first, as the app-server pages them
    read = read_marker(marker)
    if read is None or not window or window[0].id is None:
        return Outcome(status="quiet", marker=marker)
    newest = window[0]
    newest_count = len(newest.messages)
    if read.turn_id == newest.id and read.messages is not None and newest_count <= read.messages:
        return Outcome(status="quiet", marker=marker)
    at = next((i for i, t in enumerate(window) if t.id == read.turn_id), -1)
    candidates = window if read.turn_id is None or at < 0 else window[: at + 1]
    found: list[Turn] = []
    occurred: int | None = None
    for turn in candidates:
        seen = 0
        if turn.id == read.turn_id:
            seen = read.messages if read.messages is not None else len(turn.messages)
        for message in turn.messages[seen:]:
            if own_echo(message, own):
                continue
            found.append(Turn(offset=None, native_id=turn.id, text_hash=message.joined))
            if occurred is None:
                seconds = turn.completed_s if turn.completed_s is not None else turn.started_s
                occurred = seconds * 1000 if seconds is not None else now_ms
    nxt = {"turnId": newest.id, "userMessageCount": newest_count}
    if not found:
        return Outcome(status="quiet", marker=nxt)
    return Outcome(
        status="activity",
        marker=nxt,
        turns=found,
        dedupe_id=f"{newest.id}:{newest_count}",
        latest_at=occurred,
    )


# -- the adapter ---------------------------------------------------------------------------


PROBE_KEY = "probeThreadId"  # what the tick adds to a ref: the thread the gateway probes
HINT_KEY = "rolloutPath"  # and the rollout the gateway's binding names for it, if any
# where the gateway's Codex plugin keeps a session's binding: its plugin state
PLUGIN_ID = "codex"
BINDINGS = "app-server-thread-bindings"


def binding_entry(agent_id: str, session_key: str) -> tuple[str, str, str]:
    """The plugin state entry of a session's binding: plugin, namespace and the plugin's
    key (``bindingStoreKey``: the agent and the session key's SHA-256, base64url)."""
    digest = hashlib.sha256(session_key.strip().encode()).digest()
    hashed = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    return PLUGIN_ID, BINDINGS, f"session-key:{agent_id.strip()}:{hashed}"


def probed_ref(ref: Ref, thread_id: str, stored: Any, session_id: str | None) -> Ref:
    """The ref to read for a link on ``thread_id``, given its session's stored binding
    (parsed) and the session's current id: with :data:`PROBE_KEY` naming the gateway's
    branch when the gateway probes the branch, else the link's own ref.

    The gateway adopts a thread "as a branch": while the branch is pending the binding names
    the source; once its first run made the branch (``thread/start`` with ``threadSource
    "openclaw"``, the history injected), the binding names the branch, and its monitor
    probes it: ``connectionScope == "supervision"`` and ``supervisionSourceThreadId`` equal
    to the link's thread give the binding's ``threadId``. A binding of another generation of
    the session (its ``sessionId`` is not the current one) is not the session's, and
    without a current session id the gateway probes the source too."""
    if not session_id or not isinstance(stored, dict) or stored.get("state") != "active":
        return ref
    owner = stored.get("sessionId")
    if isinstance(owner, str) and owner.strip() and owner.strip() != session_id:
        return ref
    binding = stored.get("binding")
    if not isinstance(binding, dict):
        return ref
    bound = binding.get("threadId")
    bound = bound.strip() if isinstance(bound, str) else ""
    probed = thread_id
    if (
        binding.get("connectionScope") == "supervision"
        and binding.get("supervisionSourceThreadId") == thread_id
        and bound
    ):
        probed = bound
    out = dict(ref)
    if probed != thread_id:
        out[PROBE_KEY] = probed
    hint = binding.get("rolloutPath")
    if bound == probed and isinstance(hint, str) and probed in os.path.basename(hint):
        out[HINT_KEY] = hint  # where the gateway last saw the thread's rollout
    return out


def followed(ref: Ref) -> tuple[str, str] | None:
    """The thread the sidecar follows beside the probed one: the link's source thread, once
    the gateway probes its branch instead (a person may go on typing in the source); and
    the branch."""
    source, probed = ref.get("threadId"), thread_of(ref)
    if isinstance(source, str) and source and probed != source:
        return source, probed
    return None


def branch_point(
    source: list[RolloutTurn], link_marker: Marker, branch: list[RolloutTurn]
) -> Marker:
    """Where following the source begins, the first time: the link's marker while it still
    names a source turn (the gateway's, or this sidecar's, last check of the source); else
    the newest source turn that began no later than the branch's first turn of its own (the
    gateway's first run there), or the source's newest turn while the branch has none."""
    ids = {t.id for t in source if t.id is not None}
    read = read_marker(link_marker)
    if read is not None and read.turn_id in ids:
        return link_marker
    starts = [t.started_s for t in branch if t.id not in ids and t.started_s is not None]
    began = min(starts) if starts else None
    before = [
        t
        for t in source
        if t.id is not None
        and (began is None or (t.started_s is not None and t.started_s <= began))
    ]
    if not before:
        return {"turnId": None, "userMessageCount": None}  # every source turn came after
    newest = before[-1]
    return {"turnId": newest.id, "userMessageCount": len(newest.messages)}


def thread_of(ref: Ref) -> str:
    """The thread the gateway probes: the tick's :data:`PROBE_KEY`, else the ref's own."""
    probe = ref.get(PROBE_KEY)
    if isinstance(probe, str) and probe:
        return probe
    thread = ref.get("threadId")
    return thread if isinstance(thread, str) else ""


def _hint(ref: Ref) -> str | None:
    hint = ref.get(HINT_KEY)
    return hint if isinstance(hint, str) and hint else None


def busy(stored: Any, now_ms: int) -> str | None:
    """The gateway holds the binding's lease while it changes the session's thread (it makes
    its branch, compacts, sets a goal), renewed while it lasts; its own monitor checks only
    idle sessions. So the link waits meanwhile, as for any run in progress. (The prompt of
    a run is written after the lease is released: its provenance line tells it.)"""
    lease = stored.get("lease") if isinstance(stored, dict) else None
    expires = lease.get("expiresAt") if isinstance(lease, dict) else None
    if isinstance(expires, (int, float)) and not isinstance(expires, bool) and expires > now_ms:
        return "run active: the gateway holds its Codex binding's lease"
    return None


class CodexAppServerAdapter:
    kind = KIND
    binding_entry = staticmethod(binding_entry)
    probed_ref = staticmethod(probed_ref)
    followed = staticmethod(followed)
    busy = staticmethod(busy)

    def __init__(self, settings: Settings) -> None:
        root = settings.root("codex")
        self.home = os.path.dirname(os.path.abspath(root)) if root else ""
        self.reader = RolloutReader(self.home)
        self._drift_said: dict[str, str] = {}
        self._drift_seen: dict[str, dict[str, int]] = {}  # per file, the types reported
        self._watched: set[str] = set()  # the files file watching was last given
        self._follow_said: dict[str, str] = {}  # per followed thread, why it is not read

    def resolve(self, path: str, thread: str | None) -> Source:
        raise BadInput(
            "codex-app-server links are written by the gateway when it adopts a Codex thread"
            " through its app-server; to adopt a rollout yourself, use --kind codex"
        )

    async def baseline(self, ref: Ref) -> Marker:
        raise BadInput("codex-app-server links are baselined by the gateway")

    async def check(self, probes: list[Probe]) -> list[Outcome]:
        import asyncio

        return await asyncio.to_thread(lambda: [self.check_one(p) for p in probes])

    def check_one(self, probe: Probe, now_ms: int | None = None) -> Outcome:
        import time

        thread = thread_of(probe.ref)
        path = self.reader.find(thread, _hint(probe.ref)) if thread else None
        if path is None:
            reason = f"the rollout of thread {thread or '?'} is not found under {self.home}"
            return Outcome(status="inconclusive", reason=f"{reason}; left to the gateway")
        try:
            files = self.reader.turns(path)
        except FormatDrift as exc:
            first = self._drift_said.get(path) != str(exc)  # counted once, as it is said
            self._drift_said[path] = str(exc)
            drift = Drift(unknown_types={f"rollout:{exc}": 1}) if first else None
            return Outcome(
                status="inconclusive", reason=f"drift: {exc}; left to the gateway", drift=drift
            )
        except OSError as exc:
            reason = f"cannot read {path}: {exc.strerror or exc}"
            return Outcome(status="inconclusive", reason=f"{reason}; left to the gateway")
        cutoff = self.reader.projected(path, thread) if files.paginated else None
        own = frozenset(h for _, h in probe.own)
        now = int(time.time() * 1000) if now_ms is None else now_ms
        turns = files.upto(cutoff)
        outcome = gateway_check(turns, probe.marker, own, now)
        if probe.follow is not None:
            followed = self._follow(probe.follow, probe.marker, turns, own, now)
            outcome = replace(outcome, followed=followed)
        new = self._new_drift(path, files.drift)
        if new is not None:
            kinds = ", ".join(f"{k} ({n})" for k, n in sorted(new.unknown_types.items()))
            reason = f"drift: record types Codex never declared: {kinds}"
            outcome = replace(outcome, drift=new, reason=reason)
        if path not in self._watched:
            outcome = replace(outcome, rewatch=True)  # a file to watch from now on
        return outcome

    def _follow(
        self,
        follow: Follow,
        link_marker: Marker,
        branch: list[RolloutTurn],
        own: frozenset[str],
        now: int,
    ) -> Followed | None:
        """What the person typed into the source thread the gateway no longer probes, read
        as the gateway's monitor would read it, from the sidecar's own marker there (none
        yet: from where the branch began, :func:`branch_point`). None when the source
        cannot be read now (said once; the next check reads it again)."""
        path = self.reader.find(follow.thread)
        try:
            if path is None:
                raise OSError(f"the rollout of thread {follow.thread} is not found")
            files = self.reader.turns(path)
        except (OSError, FormatDrift) as exc:
            said = f"the source thread {follow.thread} is not followed now: {exc}"
            if self._follow_said.get(follow.thread) != said:
                self._follow_said[follow.thread] = said
                log.warning("%s", said)
            return None
        self._follow_said.pop(follow.thread, None)
        cutoff = self.reader.projected(path, follow.thread) if files.paginated else None
        source = files.upto(cutoff)
        since = follow.marker
        start = since if since is not None else branch_point(source, link_marker, branch)
        found = gateway_check(source, start, own, now)
        return Followed(thread=follow.thread, since=since, outcome=found, beside=follow.beside)

    def _new_drift(self, path: str, drift: Drift) -> Drift | None:
        """What of a file's drift was not reported yet (reported once: to the metrics,
        and as the link's status)."""
        said = self._drift_seen.setdefault(path, {})
        fresh = {k: n - said.get(k, 0) for k, n in drift.unknown_types.items()}
        fresh = {k: n for k, n in fresh.items() if n > 0}
        if not fresh:
            return None
        said.update(drift.unknown_types)
        return Drift(unknown_types=fresh)

    async def catalog(self) -> CatalogListing:
        return CatalogListing()  # the gateway's own catalog lists what it adopts

    def catalog_key(self, ref: Ref) -> str:
        return f"codex-app-server:{ref.get('threadId', '')}"

    def watched_paths(self, ref: Ref) -> list[str]:
        """The probed thread's rollout (and the files it points back to), and the source
        thread's when the gateway probes its branch (the sidecar follows the source)."""
        probed, follow = thread_of(ref), followed(ref)
        reads = [(probed, _hint(ref))] if probed else []
        if follow is not None:
            reads.append((follow[0], None))
        paths: list[str] = []
        for thread, hint in reads:
            path = self.reader.find(thread, hint)
            if path is not None:
                paths += [path, *self.reader.bases_of(path), *self.reader.projection_files(path)]
        self._watched.update(paths)
        return list(dict.fromkeys(paths))

    def replay(
        self, path: str, thread: str | None, own_texts: list[str]
    ) -> Iterable[dict[str, Any]]:
        raise BadInput("replay reads a rollout with --kind codex")


def build(settings: Settings) -> CodexAppServerAdapter:
    return CodexAppServerAdapter(settings)
