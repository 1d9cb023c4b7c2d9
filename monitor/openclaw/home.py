"""Where an OpenClaw install keeps its state, by the gateway's own rules (its
``src/config/paths.ts`` and ``src/infra/home-dir.ts``): the home is ``$OPENCLAW_HOME`` (``~``
expanded against ``$HOME``), else ``$HOME``; the state directory is ``$OPENCLAW_STATE_DIR``,
else ``~/.openclaw-<profile>`` for a named ``$OPENCLAW_PROFILE``, else ``~/.openclaw``, else
the legacy ``~/.clawdbot`` when only that exists; the state database is
``<state dir>/state/openclaw.sqlite``, and an agent's own database (its session store)
``<state dir>/agents/<agentId>/agent/openclaw-agent.sqlite``.

The one module that knows it: the CLI's store next to OpenClaw, the service's hooks and
transcripts (:mod:`monitor.openclaw.files`) and a watch's default store path
(:mod:`monitor.kernel.watcher_stores`) all ask here.

Plain ``os.path``: a one-shot command next to OpenClaw finds its store here without loading
``pathlib`` (:mod:`monitor.openclaw.files` reads the install's files).
"""

from __future__ import annotations

import os
import re

TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Mapping

_PROFILE = r"(?i)^[a-z0-9][a-z0-9_-]{0,63}$"  # compiled at first use (re caches it)
STATE_DB_NAME = "openclaw.sqlite"


def home_dir(env: Mapping[str, str]) -> str:
    explicit = (env.get("OPENCLAW_HOME") or "").strip()
    os_home = (env.get("HOME") or "").strip() or os.path.expanduser("~")
    if explicit:
        if explicit == "~" or explicit.startswith("~/"):
            return os.path.realpath(os_home + explicit[1:])
        return os.path.realpath(explicit)
    return os.path.realpath(os_home)


def user_path(raw: str, home: str) -> str:
    """``raw`` with a leading ``~`` meaning ``home``, resolved."""
    raw = raw.strip()
    if raw == "~" or raw.startswith("~/"):
        return os.path.realpath(home + raw[1:])
    return os.path.realpath(raw)


def profile_of(env: Mapping[str, str]) -> str | None:
    """A named profile (``$OPENCLAW_PROFILE``), if the gateway takes it as one."""
    name = (env.get("OPENCLAW_PROFILE") or "").strip()
    if not name or name.lower() == "default" or not re.match(_PROFILE, name):
        return None
    return name


def state_dir(env: Mapping[str, str], home: str) -> tuple[str, str]:
    """The state directory the gateway would use, and what chose it."""
    override = (env.get("OPENCLAW_STATE_DIR") or "").strip()
    profile = profile_of(env)
    if override:
        return user_path(override, home), "$OPENCLAW_STATE_DIR"
    if profile:
        return os.path.join(home, f".openclaw-{profile}"), f"$OPENCLAW_PROFILE ({profile})"
    state = os.path.join(home, ".openclaw")
    legacy = os.path.join(home, ".clawdbot")
    if not os.path.exists(state) and os.path.exists(legacy):
        return legacy, "the default"
    return state, "the default"


def state_db(state: str) -> str:
    """The state database of a state directory."""
    return os.path.join(state, "state", STATE_DB_NAME)


def state_dir_of(db_path: str) -> str | None:
    """The state directory whose state database ``db_path`` is, else None."""
    state = os.path.dirname(db_path)
    if os.path.basename(db_path) == STATE_DB_NAME and os.path.basename(state) == "state":
        return os.path.dirname(state) or "."
    return None


def agent_db(state: str, agent_id: str) -> str:
    """An agent's own database (its session store) under a state directory."""
    return os.path.join(state, "agents", agent_id, "agent", "openclaw-agent.sqlite")


def gateway_state_dir(env: Mapping[str, str] | None = None) -> str:
    """The state directory the gateway would use with this environment."""
    env = os.environ if env is None else env
    return state_dir(env, home_dir(env))[0]


def config_path(env: Mapping[str, str], home: str, state: str) -> str:
    """The gateway's configuration: ``$OPENCLAW_CONFIG_PATH``, else ``openclaw.json`` (or
    the legacy ``clawdbot.json``) in the state directory (it may not exist)."""
    override = (env.get("OPENCLAW_CONFIG_PATH") or "").strip()
    if override:
        return user_path(override, home)
    config = os.path.join(state, "openclaw.json")
    legacy = os.path.join(state, "clawdbot.json")
    return legacy if not os.path.exists(config) and os.path.exists(legacy) else config


def found_state_db(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The gateway's state database next to this user, with what chose its directory (a
    one-shot command's store next to OpenClaw), when it exists, or when the install's
    configuration does and its gateway has yet to make it at its first start (``serve``
    then waits for it: :func:`monitor.openclaw.files.awaited_state_db`); else None."""
    env = os.environ if env is None else env
    home = home_dir(env)
    state, found_by = state_dir(env, home)
    db = state_db(state)
    if os.path.isfile(db):
        return db, f"OpenClaw's state directory {state} ({found_by})"
    if os.path.isfile(config_path(env, home, state)):
        return db, (
            f"OpenClaw's state directory {state} ({found_by}), whose gateway has not made"
            " its state database yet"
        )
    return None
