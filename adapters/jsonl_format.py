"""What a JSONL format declares: :class:`JsonlFormat`. Each format's module (``claude``,
``codex``, ``pi``) declares its own ``FORMAT``; the plumbing (:mod:`adapters.jsonl_scan`, the
tailer) imports none of them, and finds one by its registered name (:func:`format_of`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar

from adapters.base import Marker, Verdict
from adapters.registry import entry

Described = tuple[str | None, str | None]  # a file's native id and working directory


if TYPE_CHECKING:  # for the type checker only: a Protocol costs start-up time to create

    class FormatState(Protocol):
        """What a format's classifier carries from record to record, kept in the marker."""

        def to_marker(self) -> dict[str, Any]: ...


S = TypeVar("S", bound="FormatState")


class JsonlFormat(NamedTuple, Generic[S]):
    """One JSONL format; ``S`` is its classifier's state, which every hook agrees on.

    A named tuple, not a frozen dataclass, as the seam's values are (``adapters.base``):
    ``replay`` loads it, and a frozen dataclass of this many fields costs 1.5 ms to make.
    Generic, so ``typing``'s own (``monitor.records`` takes no second base). Declared with
    keywords (tuple order is not part of it)."""

    kind: str
    classify: Callable[[dict[str, Any], S], Verdict | None]
    native_id: Callable[[dict[str, Any]], str | None]
    state_from_marker: Callable[[Marker], S]
    state_from_first: Callable[[Any], S]  # the first record (None for an empty file)
    # whether the line ``buffer[start:stop]`` could matter (False: it cannot, and is never
    # parsed); None: parse every line
    prefilter: Callable[[bytes, int, int], bool] | None
    strict: bool  # stop at the first invalid row instead of counting it
    tested_version: str  # the newest format version the classifier was checked against
    prompt_text: Callable[[dict[str, Any]], str]  # the text of a record counted as a turn
    thread_id: Callable[[str], str]  # the native thread id, from the file name's stem
    # the catalog: a file under the root is a candidate (True), skipped as not adoptable and
    # counted (False), or not the format's (None); and the native id and working directory
    # its first records declare (None: not adoptable; ValueError: malformed)
    describe: Callable[[dict[str, Any], list[dict[str, Any]]], Described | None]
    # given the classifier's state, whether a line the pre-filter let through cannot
    # matter now (True: it is not parsed); None: every such line is parsed
    idle: Callable[[S, bytes], bool] | None = None
    candidate: Callable[[str, str], bool | None] = lambda folder, name: True
    declines: Callable[[S], str | None] = lambda state: None  # why a source is not adoptable
    ref_thread: bool = False  # the link's ref names the thread id beside the file
    # the harness may compress an idle file with zstandard (``….jsonl.zst``, see adapters.zst)
    compressed: bool = False
    # where the harness put a file gone from its path (an archive): the reason to show, or
    # None when it is really gone; given the file's real path and the configured root
    moved: Callable[[str, str], str | None] = lambda path, root: None
    # what a paired node sends of a record the pre-filter let through (the rest never
    # crosses the wire); None: the line as it is
    wire: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # the bytes of the lines a catalog entry reads besides the first and the prompts: those
    # that may name a working directory or a title (the others are never parsed)
    catalog_lines: tuple[bytes, ...] = (
        *(b'"cwd"', b"custom-title", b"ai-title", b"session_info", b"away_summary"),
    )
    # the same, of a field every record may repeat: only the head's first line whose record
    # has a string at the key is read (the bytes, the key)
    catalog_first: tuple[tuple[bytes, str], ...] = ()
    # what a session is doing (adapters.states): the state a record leaves when it marks a
    # turn's boundary, else None; and, for each state, words one of which the line of every
    # record that leaves it holds
    state_of: Callable[[dict[str, Any]], str | None] | None = None
    boundaries: tuple[tuple[str, tuple[bytes, ...]], ...] = ()
    # what a paired node sends of a record that marks a boundary: what ``state_of`` reads
    # (None: the line as it is)
    state_wire: Callable[[dict[str, Any]], dict[str, Any]] | None = None


def format_of(kind: str) -> JsonlFormat[Any]:
    """The JSONL format registered as ``kind`` (its module's ``FORMAT``)."""
    found = getattr(importlib.import_module(entry(kind).module), "FORMAT", None)
    if not isinstance(found, JsonlFormat):
        raise TypeError(f"the {kind} format's module declares no JSONL FORMAT")
    return found
