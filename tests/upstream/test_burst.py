"""A prompt typed behind a burst of output is recorded at once: a check that stops at the
scan cap with more written checks again at once, not a tick later, and a line longer than
``max_line_bytes`` still blocks."""

from __future__ import annotations

from pathlib import Path

import orjson

from monitor.serve.root import running
from monitor.web import wire
from tests.helpers import make_config, until, user_line

MAIN = "agent:main:main"
KEY = "agent:main:burst"


def output_line(n: int, size: int) -> bytes:
    """An assistant record carrying ``size`` bytes of tool output (no person's turn)."""
    record = {
        "type": "assistant",
        "uuid": f"a{n}",
        "message": {"role": "assistant", "content": [{"type": "text", "text": "x" * size}]},
    }
    return orjson.dumps(record) + b"\n"


async def test_a_prompt_behind_eight_mib_of_output_is_recorded_before_any_tick(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path)  # ticks an hour apart: only early checks run here
    async with running(config, tmp_path / "state.db") as sidecar:
        assert sidecar is not None
        path = Path(config.roots.claude) / "burst.jsonl"
        path.write_bytes(user_line("first", "u0"))
        await sidecar.monitor.adoption.adopt(
            kind="claude", path=str(path), session_key=KEY, session_id="b"
        )
        await sidecar.kernel.watch(watcher=MAIN, target=KEY)
        with path.open("ab") as f:  # 8 MiB of output, then the prompt, in one write
            f.write(b"".join(output_line(n, 64 * 1024) for n in range(128)))
            f.write(user_line("typed behind the burst", "u1"))

        async def recorded() -> bool:
            return bool(await sidecar.kernel.notices(watcher=MAIN))

        await until("the prompt behind the burst", recorded, timeout=60)
        status = wire.status(await sidecar.kernel.status(KEY, changes_since=0))
        kinds = [e["kind"] for e in status["stateChanges"]["events"]]
        assert 1 == kinds.count("human_direct_message"), kinds
