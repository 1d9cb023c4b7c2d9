"""``sessionwatch serve`` as a process: file watching wakes an early tick; SIGTERM stops it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

KEY = "agent:main:adopted:x"


def cli(db: Path, config: Path, *args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "monitor", "--db", str(db), "--config", str(config), *args],
        capture_output=True,
        check=True,
    )
    result: dict[str, object] = orjson.loads(out.stdout)
    return result


def test_serve_detects_an_appended_prompt_long_before_the_interval(tmp_path: Path) -> None:
    root = tmp_path / "claude"
    root.mkdir()
    config = tmp_path / "sessionwatch.toml"
    config.write_text(
        f'[roots]\nclaude = "{root}"\n[monitor]\ninterval_s = 3600\ninitial_delay_s = 3600\n'
        f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{tmp_path / "token"}"\n'
    )
    db = tmp_path / "state.db"
    transcript = root / "s.jsonl"
    transcript.write_bytes(b"")
    cli(
        db,
        config,
        "adopt",
        "--kind",
        "claude",
        "--path",
        str(transcript),
        "--session-key",
        KEY,
        "--session-id",
        "s1",
    )
    cli(db, config, "watch", "--watcher", "agent:main:main", "--target", KEY)
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "--db", str(db), "--config", str(config), "serve"],
        stderr=subprocess.PIPE,
    )
    try:
        # No wait for serve to start: an append before its watch is armed is caught by the
        # check it runs once armed; one after, by the watch (the tick is an hour away).
        with transcript.open("ab") as f:
            f.write(
                orjson.dumps(
                    {"type": "user", "uuid": "u1", "message": {"role": "user", "content": "hi"}}
                )
                + b"\n"
            )
        notices: list[object] = []
        for _ in range(100):  # polls for the effect; no timing is asserted
            notices = cli(db, config, "notices", "--watcher", "agent:main:main")["notices"]  # type: ignore[assignment]
            if notices:
                break
            time.sleep(0.1)
        assert 1 == len(notices)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert 0 == proc.returncode, err.decode()
    assert b"Traceback" not in err
