"""A drift report per harness: drive each installed harness through a short session against
the mock model, replay what it wrote, and print its version, the prompts typed against the
turns counted, the record types nobody knows and the records no rule classifies.

Usage: SESSIONWATCH_INTEROP_DIR=DIR python -m tests.harnesses.drift_report
(after ``HARNESS_VERSIONS=latest tests/interop/install.sh DIR`` to check the newest).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from adapters.base import Settings
from adapters.catalog import CatalogListing
from monitor.upstream.replay import replay
from tests.harnesses.harnesses import KINDS, Harness, why_not_runnable
from tests.interop.gateway_rig import MockModelProcess

PROMPTS = ("fix the failing billing tests", "and run them again")


def session_of(harness: Harness) -> tuple[str, str | None]:
    """The file (or database) the harness wrote, and the thread id OpenCode needs."""
    import asyncio

    from adapters.registry import entry

    _, root = harness.root()
    kind = harness.kind
    settings = Settings(roots={kind: str(root)})
    found: CatalogListing = asyncio.run(entry(kind).build(settings).catalog())
    (session,) = found.entries
    return session.path, session.native_id if kind == "opencode" else None


def report(kind: str, model: MockModelProcess, work: Path) -> dict[str, Any]:
    why = why_not_runnable(kind)
    if why:
        return {"harness": kind, "skipped": why}
    harness = Harness(kind, work / kind, model)
    for text in PROMPTS:
        harness.prompt(text)
    path, thread = session_of(harness)
    lines = list(replay(kind, path, thread=thread, own_texts=[], settings=Settings()))
    summary = lines[-1]
    return {
        "harness": kind,
        "version": harness.version,
        "declared": summary["drift"]["version"],
        "prompts": len(PROMPTS),
        "counted": summary["humanTurns"],
        "unknownTypes": summary["drift"]["unknownTypes"],
        "unclassified": summary["drift"]["unclassifiedUserRecords"],
        "seconds": [round(s, 2) for s in harness.runs],
    }


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        model = MockModelProcess(work)
        try:
            rows = [report(kind, model, work) for kind in KINDS]
        finally:
            model.stop()
    clean = True
    for row in rows:
        if "skipped" in row:
            print(f"{row['harness']:<9} skipped: {row['skipped']}")
            continue
        ok = (
            row["counted"] == row["prompts"] and not row["unknownTypes"] and not row["unclassified"]
        )
        clean = clean and ok
        print(
            f"{row['harness']:<9} {row['version']:<10} declares {row['declared']!s:<10}"
            f" turns {row['counted']}/{row['prompts']}  unknown types {row['unknownTypes'] or '-'}"
            f"  unclassified {row['unclassified']}  runs {row['seconds']} s"
            + ("" if ok else "  DRIFT")
        )
    checked = sum("skipped" not in row for row in rows)
    if checked == 0:  # a report that checked nothing must not pass
        print("nothing was checked: every harness was skipped", file=sys.stderr)
        return 2
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
