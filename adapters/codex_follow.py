"""Following the source thread beside the branch the gateway probes: a person may go on
typing in the source once the gateway probes its branch, and the gateway no longer reads
it; the sidecar reads it on its own marker, which the tick keeps beside the link."""

from __future__ import annotations

import logging

from adapters.base import Follow, Followed, Marker, Ref
from adapters.codex_gateway import gateway_check, read_marker, thread_of
from adapters.codex_rollout import FormatDrift, RolloutReader, RolloutTurn

log = logging.getLogger(__name__)


def followed(ref: Ref) -> tuple[str, str] | None:
    """The thread the sidecar follows beside the probed one: the link's source thread, once
    the gateway probes its branch instead (a person may go on typing in the source); and
    the branch."""
    source, probed = ref.get("threadId"), thread_of(ref)
    if isinstance(source, str) and source and probed != source:
        return source, probed
    return None


def branch_point(
    source: list[RolloutTurn], link_marker: Marker, branch: list[RolloutTurn]
) -> Marker:
    """Where following the source begins, the first time: the link's marker while it still
    names a source turn (the gateway's, or this sidecar's, last check of the source); else
    the newest source turn that began no later than the branch's first turn of its own (the
    gateway's first run there), or the source's newest turn while the branch has none."""
    ids = {t.id for t in source if t.id is not None}
    read = read_marker(link_marker)
    if read is not None and read.turn_id in ids:
        return link_marker
    began = _first_run(branch, ids)
    before = [t for t in source if t.id is not None and _began_by(t, began)]
    if not before:
        return {"turnId": None, "userMessageCount": None}  # every source turn came after
    newest = before[-1]
    return {"turnId": newest.id, "userMessageCount": len(newest.messages)}


def _first_run(branch: list[RolloutTurn], source_ids: set[str]) -> int | None:
    """When the branch's first turn of its own began (None: it has none yet)."""
    starts = [t.started_s for t in branch if t.id not in source_ids and t.started_s is not None]
    return min(starts) if starts else None


def _began_by(turn: RolloutTurn, began: int | None) -> bool:
    """The turn began no later than ``began`` (any turn, when None)."""
    return began is None or (turn.started_s is not None and turn.started_s <= began)


class SourceFollower:
    """Reads the source threads the sidecar follows, saying once why one cannot be read."""

    def __init__(self, reader: RolloutReader) -> None:
        self.reader = reader
        self._said: dict[str, str] = {}  # per followed thread, why it is not read

    def read(
        self,
        follow: Follow,
        link_marker: Marker,
        branch: list[RolloutTurn],
        own: frozenset[str],
        now: int,
    ) -> Followed | None:
        """What the person typed into the source thread the gateway no longer probes, read
        as the gateway's monitor would read it, from the sidecar's own marker there (none
        yet: from where the branch began, :func:`branch_point`). None when the source
        cannot be read now (said once; the next check reads it again)."""
        path = self.reader.find(follow.thread)
        try:
            if path is None:
                raise OSError(f"the rollout of thread {follow.thread} is not found")
            files = self.reader.turns(path)
        except (OSError, FormatDrift) as exc:
            said = f"the source thread {follow.thread} is not followed now: {exc}"
            if self._said.get(follow.thread) != said:
                self._said[follow.thread] = said
                log.warning("%s", said)
            return None
        self._said.pop(follow.thread, None)
        cutoff = self.reader.projected(path, follow.thread) if files.paginated else None
        source = files.upto(cutoff)
        since = follow.marker
        start = since if since is not None else branch_point(source, link_marker, branch)
        found = gateway_check(source, start, own, now)
        return Followed(thread=follow.thread, since=since, outcome=found, beside=follow.beside)
