"""The JSONL tailer: appends split anywhere give the same turns at the same offsets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.base import Probe
from adapters.jsonl_check import TailSettings, check_file
from adapters.jsonl_format import format_of
from adapters.tailer import read_tail

FMT = format_of("claude")
LINES = st.lists(
    st.one_of(
        st.builds(
            lambda t, u: orjson.dumps(
                {"type": "user", "uuid": u, "message": {"role": "user", "content": t}}
            ),
            st.text(min_size=1, max_size=40),
            st.uuids().map(str),
        ),
        st.builds(
            lambda n: orjson.dumps({"type": "assistant", "pad": "x" * n}), st.integers(0, 300)
        ),
        st.just(
            b"\x00\x00"
            + orjson.dumps(
                {"type": "user", "uuid": "nul", "message": {"role": "user", "content": "hi"}}
            )
        ),
        st.just(b"not json"),
    ),
    max_size=25,
)


def tail_all(
    path: Path, marker: dict[str, Any], cap: int, held: dict[Any, bytearray]
) -> tuple[list[int], dict[str, Any], int | None]:
    """Tick until nothing more is readable: (turn offsets, final marker, blocked offset)."""
    found: list[int] = []
    settings = TailSettings(cap=cap, max_line=10**9)
    while True:
        probe = Probe(session_key="k", ref={"filePath": str(path)}, marker=marker)
        out = check_file(FMT, probe, settings, held)
        if out.status == "blocked":
            return found, marker, out.blocked_offset
        assert out.marker is not None, out.reason
        found += [t.offset or 0 for t in out.turns]
        if out.marker == marker:
            return found, marker, None
        marker = out.marker


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lines=LINES,
    cuts=st.lists(st.integers(0, 20_000), max_size=8),
    extra=st.integers(0, 50),
    data=st.data(),
)
def test_any_split_of_appends_and_any_cap_equal_one_pass(
    tmp_path: Path, lines: list[bytes], cuts: list[int], extra: int, data: st.DataObject
) -> None:
    """Lines longer than the cap are read across ticks: no cap loses or repeats a turn."""
    blob = b"".join(line + b"\n" for line in lines)
    longest = max((len(line) for line in lines), default=1)
    path = tmp_path / "t.jsonl"
    path.write_bytes(blob)
    whole, marker, blocked = tail_all(path, {"offset": 0}, 10**9, {})
    assert (len(blob), None) == (marker["offset"], blocked)

    cap = data.draw(st.integers(1, longest + extra))
    restart = data.draw(st.booleans())  # the held part of a long line is lost with a restart
    points = sorted({min(c, len(blob)) for c in cuts} | {len(blob)})
    path.write_bytes(b"")
    marker, found, prev = {"offset": 0}, [], 0
    held: dict[Any, bytearray] = {}
    for point in points:
        with path.open("ab") as f:
            f.write(blob[prev:point])
        prev = point
        got, marker, block = tail_all(path, marker, cap, {} if restart else held)
        assert block is None
        found += got
    assert whole == found
    assert len(blob) == marker["offset"]


def test_a_line_longer_than_max_line_blocks(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"type":"user","pad":"' + b"x" * 300 + b'"}\n')
    settings = TailSettings(cap=64, max_line=200)
    marker: dict[str, Any] = {"offset": 0}
    for _ in range(5):
        probe = Probe(session_key="k", ref={"filePath": str(path)}, marker=marker)
        out = check_file(FMT, probe, settings, {})
        if out.status == "blocked":
            break
        assert out.marker is not None
        marker = out.marker
    assert ("blocked", 0) == (out.status, out.blocked_offset)


def test_a_read_of_only_blank_lines_moves_on(tmp_path: Path) -> None:
    """Blank lines and NUL padding carry nothing: a read of only them is not a line too
    long (it read as one, and blocked the link, before 2026-12-02)."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"type":"summary"}\n')
    marker: dict[str, Any] = {"offset": path.stat().st_size}
    with path.open("ab") as f:
        f.write(b"\n \n\x00\x00\n")
    found, marker, blocked = tail_all(path, marker, 1024, {})
    assert (found, blocked, marker["offset"]) == ([], None, path.stat().st_size)
    with path.open("ab") as f:
        f.write(orjson.dumps({"type": "user", "message": {"role": "user", "content": "hi"}}))
        f.write(b"\n")
    assert tail_all(path, marker, 1024, {})[0] == [marker["offset"]]


def test_a_partial_last_line_waits(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"type":"user"')
    assert read_tail(str(path), 0, 1024, None).status == "waiting"


def test_a_shrunk_or_replaced_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":2}\n')
    assert read_tail(str(path), 100, 1024, None).status == "truncated"
    assert read_tail(str(path), 3, 1024, None).status == "truncated"  # not at a line end
    ino = path.stat().st_ino
    other = tmp_path / "u.jsonl"
    other.write_bytes(b'{"a":1}\n{"b":2}\n')
    other.replace(path)
    assert read_tail(str(path), 8, 1024, None, ino).status == "rotated"


def test_a_new_inode_with_the_same_bytes_continues_and_another_first_line_is_rotated(
    tmp_path: Path,
) -> None:
    """A file written back whole (Codex resuming a compressed rollout, a save by rename)
    continues from the offset; a new file with another first line was rotated."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":2}\n')
    first = read_tail(str(path), 0, 1024, None)
    again = tmp_path / "u.jsonl"
    again.write_bytes(b'{"a":1}\n{"b":2}\n{"c":3}\n')
    again.replace(path)
    read = read_tail(str(path), first.end, 1024, first.head, first.ino, 0, first.tail)
    assert (read.status, [line for _, line in read.lines()]) == ("lines", [b'{"c":3}'])
    assert read.ino != first.ino
    other = tmp_path / "v.jsonl"
    other.write_bytes(b'{"z":0}\n{"b":2}\n{"c":3}\n')
    other.replace(path)
    assert read_tail(str(path), first.end, 1024, first.head, first.ino, 0, first.tail).status == (
        "rotated"
    )
