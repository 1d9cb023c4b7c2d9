"""What a session is doing now, read from its own records: the last record that marks a
turn's boundary decides.

- ``working``: a turn is in progress (a prompt came in, a tool was called, its result came
  back), since the record that began it;
- ``waiting``: the agent ended its turn, or the turn was interrupted: the next move is a
  person's;
- ``asking``: blocked on a person's answer, where a format records the question (Claude
  Code's TUI, its AskUserQuestion tool);
- ``quiet``: working with no record read for a while, derived when read (never kept);
- ``unknown``: no record read so far marks a boundary.

Each format says which of its records mark one (``JsonlFormat.state_of``), and only those
records that its real CLI was seen to write (``tests/fixtures/states``, docs/formats.md):
a value never seen is no boundary, not a guess. The state is a function of the records
read so far alone, and of the last boundaries among them, so it is found by looking back
from the end of what was read (:func:`last_boundary`): a record is parsed only if its bytes
hold one of the words the format gives for a state (``JsonlFormat.boundaries``: every
record that can leave that state holds one), searched in the raw bytes a window at a time,
only as far back as the answer needs. Read in one check or in many, the lines give one
answer (:meth:`Doing.after` of each check's). A paired node sends the few lines the answer
is found in (:func:`boundary_lines`); records already parsed give theirs by
:func:`boundary_of`.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from adapters.base import Boundary
from adapters.jsonl_scan import parse_line, time_ms

if TYPE_CHECKING:
    from adapters.jsonl_format import JsonlFormat

WORKING = "working"
WAITING = "waiting"
ASKING = "asking"  # where a format records the question (docs/formats.md)
QUIET = "quiet"  # working, with no record read for a while: derived when read, never kept
UNKNOWN = "unknown"
STATES = (WORKING, WAITING, ASKING, QUIET, UNKNOWN)


def last_boundary(fmt: JsonlFormat[Any], chunk: Chunk, start: int, stop: int) -> Boundary | None:
    """The state the complete lines of ``chunk[start:stop]`` (``stop`` at a line's end)
    leave, and since when: the time of the first of the boundaries that leave it after the
    last one that did not (so that one read of many lines, or many reads of a few, give one
    answer). None: no line marks a boundary."""
    found = _found(fmt, chunk, start, stop)
    if found is None:
        return None
    last, before, first, opening = found
    return Boundary(last[0].state, first[0].at, before is not None, *opening[0][:2])


def boundary_lines(fmt: JsonlFormat[Any], chunk: Chunk, start: int, stop: int) -> list[bytes]:
    """The lines of ``chunk[start:stop]`` that :func:`last_boundary` answers from, in order
    (at most four): :func:`last_boundary` of them alone is that of all the lines, which is
    what a paired node sends of a read for the sidecar to derive the state from."""
    found = _found(fmt, chunk, start, stop)
    spans = sorted({f[1] for f in found if f is not None}) if found is not None else []
    return [chunk[a:b].lstrip(b"\x00").strip() for a, b in spans]


def _found(
    fmt: JsonlFormat[Any], chunk: Chunk, start: int, stop: int
) -> tuple[Found, Found | None, Found, Found] | None:
    """The boundaries :func:`last_boundary` is made of: the last; the last of another
    state before it (None: none); the first of the last one's run; the first of all.

    Four searches, each parsing only the lines its words find: back to the last boundary
    (its state); back from there to the last boundary of another state; forward from there
    to the first boundary of this state; and, when another state came before, forward from
    the start to the first boundary of all."""
    if fmt.state_of is None or not fmt.boundaries:
        return None
    every = tuple(w for _, words in fmt.boundaries for w in words)
    last = _seek(fmt, chunk, (start, stop), every, _any)
    if last is None:
        return None
    state, (line_start, line_end) = last[0].state, last[1]
    others = tuple(w for s, words in fmt.boundaries if s != state for w in words)
    before = _seek(fmt, chunk, (start, line_start), others, lambda s: s != state)
    since = before[1][1] if before is not None else start
    mine = next(words for s, words in fmt.boundaries if s == state)
    first = _seek(fmt, chunk, (since, line_end), mine, lambda s: s == state, forward=True)
    first = first or last  # the last at the latest: it is one of them
    if before is None:
        return last, None, first, first
    opening = _seek(fmt, chunk, (start, before[1][1]), every, _any, forward=True)
    return last, before, first, opening or before  # ``before`` at the latest


def boundary_of(states: Iterable[tuple[str, int | None]]) -> Boundary | None:
    """:func:`last_boundary` of records already read, as each record's state and time
    (those that mark a boundary), in order."""
    runs: list[tuple[str, int | None]] = []
    for state, at in states:
        if not runs or runs[-1][0] != state:
            runs.append((state, at))
    if not runs:
        return None
    return Boundary(*runs[-1], len(runs) > 1, *runs[0])


def _any(state: str) -> bool:
    return True


Found = tuple[Boundary, tuple[int, int]]  # a boundary and its line's start and end
Chunk = bytes | mmap.mmap  # what is searched: a read, or a whole file mapped (a replay)

# How far each step of a search reaches (doubling): a boundary near the end is found having
# read only the window it is in, and a word a format rarely writes costs no more than the
# windows read before a boundary of another word ends the search.
WINDOW = 1 << 14


def _seek(
    fmt: JsonlFormat[Any],
    chunk: Chunk,
    span: tuple[int, int],
    words: tuple[bytes, ...],
    wanted: Callable[[str], bool],
    *,
    forward: bool = False,
) -> Found | None:
    """The last (``forward``: the first) line within ``span`` that one of ``words`` finds
    and whose record is a boundary of a ``wanted`` state, searched a window at a time from
    the span's end (``forward``: its start)."""
    start, stop = span
    lo = hi = start if forward else stop
    size = WINDOW
    while (hi < stop) if forward else (lo > start):
        if forward:
            lo, hi = hi, min(stop, hi + size)
        else:
            lo, hi = max(start, lo - size), lo
        found = _seek_in(fmt, chunk, span, (lo, hi), words, wanted, forward)
        if found is not None:
            return found
        size *= 2
    return None


def _seek_in(
    fmt: JsonlFormat[Any],
    chunk: Chunk,
    span: tuple[int, int],
    window: tuple[int, int],
    words: tuple[bytes, ...],
    wanted: Callable[[str], bool],
    forward: bool,
) -> Found | None:
    """:func:`_seek` within one window: the words that start in it (they may end past
    it), each found once; a line found that is no wanted boundary moves that word's search
    past it."""
    start, stop = span
    lo, hi = window
    state_of = fmt.state_of or _none
    find = chunk.find if forward else chunk.rfind

    def search(word: bytes, a: int, b: int) -> int:
        return find(word, a, min(stop, b + len(word) - 1)) if a < b else -1

    found = {word: search(word, lo, hi) for word in words}
    while True:
        hits = [pos for pos in found.values() if pos >= 0]
        if not hits:
            return None
        at = min(hits) if forward else max(hits)
        line_start = max(start, chunk.rfind(b"\n", start, at) + 1)
        line_end = chunk.find(b"\n", at, stop)
        line_end = stop if line_end < 0 else line_end + 1
        line = chunk[line_start:line_end].lstrip(b"\x00").strip()  # as the scan reads it
        record = parse_line(line, recover=not fmt.strict)
        state = state_of(record) if isinstance(record, dict) else None
        if state is not None and wanted(state):
            return Boundary(state, time_ms(record)), (line_start, line_end)
        for word, pos in found.items():
            if pos >= 0 and line_start <= pos < line_end:
                past = (line_end, hi) if forward else (lo, line_start)
                found[word] = search(word, *past)


def _none(record: dict[str, Any]) -> None:
    return None


class Doing(NamedTuple):
    """A session's state and since when (ms; None: not known)."""

    state: str = UNKNOWN
    since: int | None = None

    def after(self, boundary: Boundary | None) -> Doing:
        """The state once ``boundary`` was read: the same, since the same time, when the
        lines read leave the state as it was and never left it (a tool called mid-turn:
        still working since the prompt)."""
        if boundary is None or (boundary.state == self.state and not boundary.changed):
            return self
        return Doing(boundary.state, boundary.at)

    def waited(self, boundary: Boundary | None) -> int | None:
        """How long (ms) a person was waited for, when ``boundary`` ends this state's wait
        (a person's move came: the first of its records that is no longer waiting, else
        the time the state it leaves began); None: it does not, or its times are not
        known."""
        if self.state not in FOR_A_PERSON or boundary is None or self.since is None:
            return None
        after = self.after(boundary)
        if after.state in FOR_A_PERSON and after.since == self.since:
            return None  # still waiting
        woke = boundary.first_at if boundary.first not in FOR_A_PERSON else None
        if woke is None and after.state not in FOR_A_PERSON:
            woke = after.since
        return woke - self.since if woke is not None and woke >= self.since else None

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "since": self.since}


FOR_A_PERSON = (WAITING, ASKING)  # the states whose next move is a person's
