"""The JSONL tailer: appends split anywhere give the same turns at the same offsets."""

from __future__ import annotations

from pathlib import Path

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.claude import ClaudeState
from adapters.jsonl import FORMATS, scan
from adapters.tailer import read_tail

FMT = FORMATS["claude"]
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
    path: Path, offset: int, cap: int, state: ClaudeState
) -> tuple[list[int], int, int | None]:
    """Tick until nothing more is readable: (turn offsets, final offset, blocked offset)."""
    found: list[int] = []
    while True:
        read = read_tail(str(path), offset, cap, None)
        if read.status == "blocked":
            return found, offset, offset
        if read.status != "lines":
            return found, offset, None
        found += [t.offset or 0 for t in scan(FMT, read.lines, state, frozenset()).turns]
        offset = read.end


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lines=LINES,
    cuts=st.lists(st.integers(0, 20_000), max_size=8),
    extra=st.integers(0, 50),
    data=st.data(),
)
def test_any_split_of_appends_equals_one_pass(
    tmp_path: Path, lines: list[bytes], cuts: list[int], extra: int, data: st.DataObject
) -> None:
    blob = b"".join(line + b"\n" for line in lines)
    longest = max((len(line) for line in lines), default=1)
    path = tmp_path / "t.jsonl"
    path.write_bytes(blob)
    whole, end, blocked = tail_all(path, 0, 10**9, ClaudeState())
    assert (len(blob), None) == (end, blocked)

    cap = data.draw(st.integers(1, longest + extra))
    points = sorted({min(c, len(blob)) for c in cuts} | {len(blob)})
    path.write_bytes(b"")
    offset, state, found, block = 0, ClaudeState(), [], None
    prev = 0
    for point in points:
        with path.open("ab") as f:
            f.write(blob[prev:point])
        prev = point
        got, offset, block = tail_all(path, offset, cap, state)
        found += got
        if block is not None:
            break
    if cap >= longest:
        assert whole == found
        assert len(blob) == offset
    else:
        first_long = next(
            o for o, line in _offsets(lines) if len(line.lstrip(b"\x00")) > cap or len(line) > cap
        )
        assert first_long == block
        assert [o for o in whole if o < first_long] == found


def _offsets(lines: list[bytes]) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    for line in lines:
        out.append((pos, line))
        pos += len(line) + 1
    return out


def test_a_partial_last_line_waits(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"type":"user"')
    assert read_tail(str(path), 0, 1024, None).status == "waiting"


def test_a_shrunk_or_replaced_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":2}\n')
    assert read_tail(str(path), 100, 1024, None).status == "replaced"
