"""Our reads of OpenCode's database never make the real ``opencode`` fail to start.

The last connection to a WAL database to close locks it exclusively for a moment (to
checkpoint its WAL away), and ``opencode`` sets its journal mode before its busy timeout: a
reader that opened and closed the database for each read made 3 of 15 ``opencode run``
fail with "database is locked" while it read in a loop. The reader keeps its connection.
"""

from __future__ import annotations

import threading
from pathlib import Path

from adapters import opencode
from tests.harnesses.harnesses import Harness, why_not_runnable
from tests.interop import skip_unless_runnable
from tests.interop.gateway_rig import MockModelProcess

RUNS = 12


def test_opencode_starts_while_the_sidecar_reads_its_database(
    model: MockModelProcess, tmp_path: Path
) -> None:
    skip_unless_runnable(why_not_runnable("opencode"))
    harness = Harness("opencode", tmp_path / "opencode", model)
    harness.prompt("the first prompt")
    db = str(harness.root()[1])
    done = threading.Event()
    reads: list[int] = []

    def read_on() -> None:  # as often as it can: far more often than any tick
        while not done.is_set():
            opencode.read_signals(db, ["a session"])
            reads.append(1)

    reader = threading.Thread(target=read_on, daemon=True)
    reader.start()
    try:
        for i in range(RUNS):
            harness.prompt(f"typed while the sidecar reads, {i}")  # fails on an exit code
    finally:
        done.set()
        reader.join(30)
    assert len(reads) > RUNS
