"""Where a watcher's session store is, resolved as OpenClaw resolves it.

A watch cursor records the watcher's physical session store (``watcher_store_path``), and
OpenClaw skips a cursor whose store path is not the one it resolves for that watcher. So the
sidecar never makes one up. In order:

1. the store path the gateway gives explicitly;
2. when the state database sits where OpenClaw keeps it, ``<stateDir>/state/openclaw.sqlite``:
   OpenClaw's own per-agent path, ``<stateDir>/agents/<agentId>/agent/openclaw-agent.sqlite``;
3. elsewhere, the ``[session] store_path`` template, with ``{agentId}`` replaced;
4. else the state directory the gateway would use in this environment
   (:func:`monitor.openclaw.home.gateway_state_dir`: ``$OPENCLAW_STATE_DIR``, a named
   ``$OPENCLAW_PROFILE``, ``~/.openclaw``...) with the same per-agent layout: what a gateway
   with a default configuration resolves.

Paths are resolved through their longest existing ancestor (symlinks followed), as OpenClaw
does, so both sides write the same string.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from monitor.openclaw.home import agent_db, gateway_state_dir, state_dir_of
from monitor.paths import expand_user
from monitor.records import NamedTuple

AGENT_PLACEHOLDER = "{agentId}"
LEGACY_DEFAULT = "default"  # what sessionwatch schema 1 wrote; migrated on open


def _identity_path(path: str) -> str:
    return os.path.realpath(expand_user(path))


def agent_store_path(state_dir: str, agent_id: str) -> str:
    """OpenClaw's per-agent session store under a state directory."""
    return _identity_path(agent_db(state_dir, agent_id))


class StorePathRule(NamedTuple):
    """The default store path of a watcher, per agent (see the module docstring)."""

    state_dir: str | None = None
    template: str = ""

    @classmethod
    def for_database(
        cls,
        db_path: str | os.PathLike[str] | None,
        template: str = "",
        env: Mapping[str, str] | None = None,
    ) -> StorePathRule:
        """``db_path``: the SQLite file (None for a PostgreSQL store, never OpenClaw's own
        file)."""
        found = None if db_path is None else state_dir_of(os.fspath(db_path))
        if found is not None:
            return cls(state_dir=found)
        if template.strip():
            return cls(template=template.strip())
        return cls(state_dir=gateway_state_dir(env))

    def resolve(self, agent_id: str) -> str:
        if self.state_dir is not None:
            return agent_store_path(self.state_dir, agent_id)
        return _identity_path(self.template.replace(AGENT_PLACEHOLDER, agent_id))
