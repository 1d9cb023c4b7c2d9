"""Reading a Codex thread as its app-server lists it (``thread/turns/list``), from the
thread's rollout file: :class:`RolloutReader` finds the rollout (Codex's ``state_5.sqlite``,
its file name, plain or compressed, archived or not, and the bases a revert or a fork points
back to) and reads its turns incrementally, a file's turns kept with the offset they were
read to; :mod:`adapters.codex_app_server` is the adapter that checks them.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, NamedTuple, TypeGuard

import orjson

from adapters.base import (
    Drift,
    as_dict,
    as_list,
    as_text,
    member,
    normalize_text,
    text_hash,
)
from adapters.codex import unknown_subtype
from adapters.codex_lines import KNOWN_TYPES, may_be_turn
from adapters.tailer import open_regular
from adapters.zst import SUFFIX, chunks

log = logging.getLogger(__name__)


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


def _text_blocks(content: Any) -> list[str]:
    """A message's text blocks that say something (not blank once collapsed)."""
    blocks = as_list(content)
    texts = [b.get("text") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
    return [t for t in texts if isinstance(t, str) and normalize_text(t)]


def _message(content: Any, text: Any = None) -> Message:
    """The gateway's reading of a user message: its text blocks, trimmed and collapsed, the
    empty ones dropped; with none, the message's ``text`` (or nothing)."""
    raw = _text_blocks(content) or [text if isinstance(text, str) else ""]
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
        handler = self._HANDLERS.get(str(payload.get("type")))
        if handler is not None:
            handler(self, payload, _seconds(record))

    def _started(self, payload: dict[str, Any], at: int | None) -> None:
        known = self._find(payload.get("turn_id"))
        if known is None:
            self.turns.append(RolloutTurn(id=_turn_id(payload), started_s=at))
        else:
            known.open = True

    def _ended(self, payload: dict[str, Any], at: int | None) -> None:
        done = self._find(payload.get("turn_id")) or (self.turns[-1] if self.turns else None)
        if done is not None:
            done.open = False
            done.completed_s = at

    def _item(self, payload: dict[str, Any], at: int | None) -> None:
        """A paginated thread's user message: an item of its turn (made if unknown)."""
        item = payload.get("item")
        if not self.paginated or not isinstance(item, dict) or item.get("type") != "UserMessage":
            return
        turn = self._find(payload.get("turn_id"))
        if turn is None:
            turn = RolloutTurn(id=_turn_id(payload), started_s=at)
            self.turns.append(turn)
        turn.messages.append(_message(item.get("content"), item.get("text")))

    def _user_message(self, payload: dict[str, Any], at: int | None) -> None:
        """An unpaginated thread's user message: in the open turn (or one of its own)."""
        if not self.paginated:
            self._open_turn(at).messages.append(_message(None, payload.get("message")))

    def _rolled_back(self, payload: dict[str, Any], at: int | None) -> None:
        n = payload.get("num_turns")
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            del self.turns[-n:]

    # each event the app-server builds its turn list from, and how
    _HANDLERS: ClassVar[dict[str, Callable[[TurnBuilder, dict[str, Any], int | None], None]]] = {
        "task_started": _started,
        "task_complete": _ended,
        "turn_aborted": _ended,
        "item_completed": _item,
        "user_message": _user_message,
        "thread_rolled_back": _rolled_back,
    }


def _still(
    known: tuple[str, tuple[int, ...] | None] | None, stamp: tuple[int, ...] | None
) -> TypeGuard[tuple[str, tuple[int, ...] | None]]:
    """A rollout found before, under the same state database, is still there."""
    return bool(known and stamp and known[1] == stamp and os.path.isfile(known[0]))


def _turn_id(payload: dict[str, Any]) -> str | None:
    turn_id = payload.get("turn_id")
    return as_text(turn_id) or None


def _lines(data: bytes) -> list[bytes]:
    """The complete lines of ``data`` (a torn last line waits for its end)."""
    return data[: data.rfind(b"\n") + 1].split(b"\n")[:-1]


def _matters(line: bytes) -> bool:
    return any(needle in line for needle in _NEEDLES)


def _records(data: bytes, drift: Drift | None = None) -> list[dict[str, Any]]:
    """The turn records among ``data``'s complete lines. A line of a record type or subtype
    Codex never declared (the classifier's test: :func:`adapters.codex_lines.may_be_turn`, then
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
    return as_dict(record)


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
        known = self._paths.get(thread_id)
        for home in self._homes(hint):
            stamp = _stamp(os.path.join(home, STATE_DB))
            if _still(known, stamp):
                return known[0]
            found = self._from_state_db(home, thread_id) or self._by_name(thread_id, home)
            if found:
                self._paths[thread_id] = (found, stamp)
                return found
        return None

    def _homes(self, hint: str | None) -> list[str]:
        """This reader's Codex home, then the home of ``hint`` if it is another."""
        homes = [self.home] if self.home else []
        other = _home_of(hint) if hint else None
        return [*homes, other] if other and other not in homes else homes

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
        db = _projection_db(path)
        stamp = _stamp(db) if db else None
        if stamp is None:
            return None
        known = self._projected.get(thread_id)
        if known is not None and known[0] == stamp:
            return known[1]
        cutoff = _next_ordinal(db, thread_id)
        if cutoff is not None:
            self._projected[thread_id] = (stamp, cutoff)
        return cutoff

    def projection_files(self, path: str) -> list[str]:
        db = _projection_db(path)
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
        ident, end = _base_ref(base, depth)
        found = self._base_file(path, ident)
        if found is None:
            raise FormatDrift(f"the history base {ident} of {os.path.basename(path)} is not found")
        cached = self._bases.get((found, end))
        if cached is None:
            self._bases[(found, end)] = cached = self._base_turns(found, end, depth)
        return _copy(cached), (found,)

    def _base_turns(self, found: str, end: int, depth: int) -> list[RolloutTurn]:
        """The turns of the base file ``found`` up to ``end`` (its own base's first)."""
        data = b"".join(_plain_chunks(found))[:end]
        head_end = data.find(b"\n") + 1
        payload = _meta(data[: head_end - 1])
        turns, _ = self._base(found, payload.get("history_base"), depth + 1)
        builder = TurnBuilder(turns, payload.get("history_mode") == "paginated")
        for record in _records(data[head_end:]):
            builder.add(record)
        return turns

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


def _base_ref(base: Any, depth: int) -> tuple[str, int]:
    """The thread id and end offset a ``history_base`` names; FormatDrift for one this
    reader does not know (or one based too deep)."""
    ident, end = member(base, "thread_id"), member(base, "end_byte_offset")
    if depth < BASE_DEPTH and isinstance(ident, str) and isinstance(end, int) and end >= 0:
        return ident, end
    raise FormatDrift("a history_base this reader does not know")


def _projection_db(path: str) -> str:
    """The app-server's projection database of the Codex home of ``path`` ("": none)."""
    home = _home_of(path)
    return os.path.join(home, PROJECTION_DB) if home else ""


def _next_ordinal(db: str, thread_id: str) -> int | None:
    """The ordinal the projection takes next of a thread (0: it has not taken it); None
    for a projection of another schema (the rollout is then read as it is)."""
    try:
        row = _one_row(
            db,
            "SELECT next_rollout_ordinal FROM thread_history_projection_state WHERE thread_id = ?",
            thread_id,
            quiet=False,
        )
    except sqlite3.Error:
        return None
    return int(row[0]) if row and isinstance(row[0], int) else 0
