"""The whole chain with the real OpenClaw gateway, hop by hop: a prompt typed into a Claude
Code session the gateway adopted from its catalog, to the notice in the gateway model's next
request.

Everything is real but the model (tests/mock_model.py on loopback): ``openclaw gateway run``
as a throwaway user, the Claude Code CLI (``claude -p ... --resume``) as that user, and
``sessionwatch serve`` with no configuration beside it, started before the gateway's first
start (it waits for the gateway's database). Each sample times, from the start of the
``claude`` command, four moments watched from outside by polling (2 ms; the model's request
log 10 ms):

- written: the prompt is in the transcript (Claude Code's own floor);
- row: the ``human_direct_message`` row is in the gateway's state database;
- accepted: the wake that carried its notice is marked accepted in the outbox;
- model: the notice is in a request the gateway's model received.

and prints each hop's p50 and max: written → row, row → accepted, accepted → model, and
the whole. The samples are 21 s apart (one wake per watcher per 20 s window). Needs root and
``tests/interop/install.sh`` (``SESSIONWATCH_INTEROP_DIR``).

Usage: python bench/gateway_chain.py [--samples 5]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor.kernel.notices import notice_text
from tests.interop.gateway_rig import (
    ClaudeCode,
    Gateway,
    MockModelProcess,
    Sidecar,
    mentions,
    serve_before_first_start,
    throwaway_user,
    wait_for,
    why_not_runnable,
)

MAIN = "agent:main:main"
WINDOW_S = 21.0
HOPS = ("written → row", "row → accepted", "accepted → model", "prompt → model")


def read_only(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)


def head(db: Path, key: str) -> int:
    with read_only(db) as conn:
        row = conn.execute(
            "SELECT max(sequence) FROM session_state_events WHERE session_key = ?", (key,)
        ).fetchone()
    return int(row[0] or 0)


def sample(
    gateway: Gateway, model: MockModelProcess, claude: ClaudeCode, thread: str, key: str,
    transcript: Path, n: int,
) -> tuple[float, float, float, float]:  # fmt: skip
    seen = head(gateway.db, key)
    before = len(model.requests())
    text = f"and run the billing tests again, round {n}"
    done = threading.Event()

    def typed() -> None:
        try:
            claude.prompt(text, resume=thread)
        finally:
            done.set()

    start = time.perf_counter()
    threading.Thread(target=typed, daemon=True).start()
    written = row = accepted = seen_by_model = 0.0
    notice = ""
    conn = read_only(gateway.db)
    last_model_poll = 0.0
    try:
        while not seen_by_model and time.perf_counter() - start < 120:
            now = time.perf_counter()
            if not written and text.encode() in transcript.read_bytes():
                written = now
            if written and not row:
                got = conn.execute(
                    "SELECT sequence FROM session_state_events WHERE session_key = ?"
                    " AND sequence > ? AND kind = 'human_direct_message'",
                    (key, seen),
                ).fetchone()
                if got is not None:
                    row = now
                    notice = notice_text(key, seen)
            if row and not accepted:
                woken = conn.execute(
                    "SELECT 1 FROM sessionwatch_notice_outbox WHERE watcher_session_key = ?"
                    " AND target_session_key = ? AND last_seen_sequence = ? AND state = 'woken'",
                    (MAIN, key, seen),
                ).fetchone()
                if woken is not None:
                    accepted = now
            if accepted and now - last_model_poll >= 0.01:
                last_model_poll = now
                if mentions(model.requests()[before:], notice):
                    seen_by_model = time.perf_counter()
            time.sleep(0.002)
    finally:
        conn.close()
    assert seen_by_model, f"sample {n}: written {written}, row {row}, accepted {accepted}"
    done.wait(120)
    return (row - written, accepted - row, seen_by_model - accepted, seen_by_model - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    why = why_not_runnable()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="sw-chain-"))
    with throwaway_user("sw-bench-chain") as user:
        model = MockModelProcess(work)
        gateway = Gateway(work, model, user=user)
        sidecar: Sidecar | None = None
        try:
            sidecar = serve_before_first_start(work, gateway)
            project = gateway.home / "billing"
            subprocess.run(["runuser", "-u", user, "--", "mkdir", "-p", str(project)], check=True)
            claude = ClaudeCode(gateway, project)
            thread = claude.prompt("fix the failing billing tests")
            adopted = gateway.call(
                "sessions.catalog.continue",
                {"catalogId": "claude", "hostId": "gateway:local", "threadId": thread},
            )
            key = str(adopted["sessionKey"])
            sidecar.cli("watch", "--watcher", MAIN, "--target", key)
            (link,) = [x for x in sidecar.cli("links")["links"] if x["sessionKey"] == key]
            transcript = Path(link["ref"]["filePath"])
            wait_for("serve to watch the link", lambda: "now watching" in sidecar.log_text())
            rows = []
            for n in range(args.samples):
                began = time.monotonic()
                rows.append(sample(gateway, model, claude, thread, key, transcript, n))
                print(
                    f"sample {n}: " + ", ".join(
                        f"{hop} {ms * 1000:.0f} ms" for hop, ms in zip(HOPS, rows[-1], strict=True)
                    ),
                    flush=True,
                )  # fmt: skip
                time.sleep(max(0.0, WINDOW_S - (time.monotonic() - began)))
        finally:
            if sidecar is not None:
                sidecar.stop()
            gateway.stop()
            model.stop()
    print(f"\n{args.samples} prompts with OpenClaw's gateway and Claude Code, each hop:")
    for i, hop in enumerate(HOPS):
        values = [r[i] * 1000 for r in rows]
        print(f"  {hop:<18} p50 {statistics.median(values):6.0f} ms   max {max(values):6.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
