"""Codex threads the gateway adopted through Codex's app-server (``codex-app-server`` links).

The gateway writes these links itself, on its own marker ``{turnId, userMessageCount}``, and
its monitor checks them every minute by asking the app-server for the probed thread's newest
100 turns. This adapter computes the same record from the thread's rollout file, within a
second of the append, so that whichever of the two sees a prompt first records it, once:

- the thread read is the one the gateway probes: the tick passes it in the ref as
  ``probeThreadId`` (the supervision branch once the gateway made it, else the source);
- its rollout is found through Codex's own ``state_5.sqlite`` (``threads.rollout_path``, the
  live generation) or its file name, in ``sessions/``, ``archived_sessions/``, plain or
  compressed; a file that points back through ``session_meta.history_base`` (a revert, a
  fork) is read after the part of its base it names;
- turns are what the app-server lists: one per ``task_started`` turn id; a user message is a
  ``UserMessage`` item (paginated rollouts, by its ``turn_id``) or a ``user_message`` event
  (legacy rollouts, in the open turn); a steer adds a second one to a turn, a compaction is
  a turn with none, a legacy rollback drops turns;
- the window, the counts after the marker, the self-echo against the gateway's own texts
  and the dedupe id ``<newest turn id>:<its user-message count>`` are the gateway monitor's,
  and the marker advances even when no prompt was a person's;
- once the gateway probes its branch, the source is read too (:func:`followed`), on the
  sidecar's own marker, which the tick keeps beside the link (a person may go on typing
  there, and the gateway no longer reads it).

A thread the gateway started (``thread_source: "openclaw"``) is read like any other: on a
gateway's link, self-echo decides. A rollout this reader does not know (another
``history_mode``, no turn ids) is drift, said once, and the link is left to the gateway
meanwhile; a rollout that cannot be found is never "missing" here, as it is never missing
for the gateway's own check (an archived or compressed thread stays readable).

Reads are incremental: a file's turns are kept with the offset they were read to, so a
check reads only the bytes appended since; lines are parsed only when their bytes name a
turn's start or end, a user message or a rollback.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from adapters.base import (
    Drift,
    Marker,
    Outcome,
    Probe,
    Ref,
    Settings,
    Source,
)
from adapters.catalog import CatalogListing
from adapters.codex_follow import SourceFollower, followed
from adapters.codex_gateway import binding_entry, busy, gateway_check, hint, probed_ref, thread_of
from adapters.codex_rollout import FormatDrift, RolloutReader
from monitor.errors import BadInput

log = logging.getLogger(__name__)


KIND = "codex-app-server"


class CodexAppServerAdapter:
    kind = KIND
    binding_entry = staticmethod(binding_entry)
    probed_ref = staticmethod(probed_ref)
    followed = staticmethod(followed)
    busy = staticmethod(busy)

    def __init__(self, settings: Settings) -> None:
        root = settings.root("codex")
        self.home = os.path.dirname(os.path.abspath(root)) if root else ""
        self.reader = RolloutReader(self.home)
        self._drift_said: dict[str, str] = {}
        self._drift_seen: dict[str, dict[str, int]] = {}  # per file, the types reported
        self._watched: set[str] = set()  # the files file watching was last given
        self.follower = SourceFollower(self.reader)

    def resolve(self, path: str, thread: str | None) -> Source:
        raise BadInput(
            "codex-app-server links are written by the gateway when it adopts a Codex thread"
            " through its app-server; to adopt a rollout yourself, use --kind codex"
        )

    async def baseline(self, ref: Ref) -> Marker:
        raise BadInput("codex-app-server links are baselined by the gateway")

    async def check(self, probes: list[Probe]) -> list[Outcome]:
        import asyncio

        return await asyncio.to_thread(lambda: [self.check_one(p) for p in probes])

    def check_one(self, probe: Probe, now_ms: int | None = None) -> Outcome:
        import time

        thread = thread_of(probe.ref)
        path = self.reader.find(thread, hint(probe.ref)) if thread else None
        if path is None:
            reason = f"the rollout of thread {thread or '?'} is not found under {self.home}"
            return Outcome(status="inconclusive", reason=f"{reason}; left to the gateway")
        try:
            files = self.reader.turns(path)
        except FormatDrift as exc:
            return self._drifted(path, exc)
        except OSError as exc:
            reason = f"cannot read {path}: {exc.strerror or exc}"
            return Outcome(status="inconclusive", reason=f"{reason}; left to the gateway")
        cutoff = self.reader.projected(path, thread) if files.paginated else None
        own = frozenset(h for _, h in probe.own)
        now = int(time.time() * 1000) if now_ms is None else now_ms
        turns = files.upto(cutoff)
        outcome = gateway_check(turns, probe.marker, own, now)
        if probe.follow is not None:
            followed = self.follower.read(probe.follow, probe.marker, turns, own, now)
            outcome = replace(outcome, followed=followed)
        outcome = self._with_drift(outcome, path, files.drift)
        return outcome if path in self._watched else replace(outcome, rewatch=True)

    def _with_drift(self, outcome: Outcome, path: str, drift: Drift) -> Outcome:
        """``outcome``, with what of the file's drift was not reported yet, said."""
        new = self._new_drift(path, drift)
        if new is None:
            return outcome
        kinds = ", ".join(f"{k} ({n})" for k, n in sorted(new.unknown_types.items()))
        reason = f"drift: record types Codex never declared: {kinds}"
        return replace(outcome, drift=new, reason=reason)

    def _drifted(self, path: str, exc: FormatDrift) -> Outcome:
        """A rollout this reader cannot read as the gateway does: left to the gateway, its
        drift counted once, as it is said."""
        first = self._drift_said.get(path) != str(exc)
        self._drift_said[path] = str(exc)
        drift = Drift(unknown_types={f"rollout:{exc}": 1}) if first else None
        return Outcome(
            status="inconclusive", reason=f"drift: {exc}; left to the gateway", drift=drift
        )

    def _new_drift(self, path: str, drift: Drift) -> Drift | None:
        """What of a file's drift was not reported yet (reported once: to the metrics,
        and as the link's status)."""
        said = self._drift_seen.setdefault(path, {})
        fresh = {k: n - said.get(k, 0) for k, n in drift.unknown_types.items()}
        fresh = {k: n for k, n in fresh.items() if n > 0}
        if not fresh:
            return None
        said.update(drift.unknown_types)
        return Drift(unknown_types=fresh)

    async def catalog(self) -> CatalogListing:
        return CatalogListing()  # the gateway's own catalog lists what it adopts

    def catalog_key(self, ref: Ref) -> str:
        return f"codex-app-server:{ref.get('threadId', '')}"

    def watched_paths(self, ref: Ref) -> list[str]:
        """The probed thread's rollout (and the files it points back to), and the source
        thread's when the gateway probes its branch (the sidecar follows the source)."""
        probed, follow = thread_of(ref), followed(ref)
        reads = [(probed, hint(ref))] if probed else []  # each thread, where to look first
        if follow is not None:
            reads.append((follow[0], None))
        paths: list[str] = []
        for thread, where in reads:
            path = self.reader.find(thread, where)
            if path is not None:
                paths += [path, *self.reader.bases_of(path), *self.reader.projection_files(path)]
        self._watched.update(paths)
        return list(dict.fromkeys(paths))

    def replay(
        self, path: str, thread: str | None, own_texts: list[str]
    ) -> Iterable[dict[str, Any]]:
        raise BadInput("replay reads a rollout with --kind codex")


def build(settings: Settings) -> CodexAppServerAdapter:
    return CodexAppServerAdapter(settings)
