"""What the sidecar finds in an OpenClaw install's own files, so that ``serve`` next to a
gateway needs no configuration: the state database, the hooks URL and the hook token.

The paths follow the gateway's own rules (its ``src/config/paths.ts`` and
``src/infra/home-dir.ts``, read in its npm package):

- the home is ``$OPENCLAW_HOME`` (``~`` expanded against ``$HOME``), else ``$HOME``;
- the state directory is ``$OPENCLAW_STATE_DIR``, else ``~/.openclaw-<profile>`` for a
  named ``$OPENCLAW_PROFILE``, else ``~/.openclaw``, else the legacy ``~/.clawdbot`` when
  only that exists;
- the configuration is ``$OPENCLAW_CONFIG_PATH``, else ``openclaw.json`` (or the legacy
  ``clawdbot.json``) in the state directory; the state database is
  ``<state dir>/state/openclaw.sqlite``;
- the gateway's port is the one its running gateway wrote into its own lock
  (``<state dir>/tmp/openclaw-<uid>/gateway.*.lock``, as OpenClaw's own ``doctor`` reads
  it), else as the gateway resolves it: ``$OPENCLAW_GATEWAY_PORT``, else ``gateway.port``,
  else 19001 for the ``dev`` profile (OpenClaw's ``--dev`` and ``--profile dev`` set that
  port), else one derived from another profile's name, else 18789; the hooks are at
  ``hooks.path`` (``/hooks``) and need ``hooks.enabled`` and ``hooks.token``.

The configuration is JSON5 (read with the ``json5`` package) and may refer to environment
variables as ``${VAR}`` (``$${VAR}`` is a literal), substituted as the gateway does. A value
that is a secret reference the sidecar cannot resolve is said in one line, naming the key
to set. The token is read again whenever the file changes, so a rotated token or a new port
applies at the next wake without a restart; it is never printed.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from monitor.errors import ConfigError
from monitor.openclaw.home import (
    agent_db,
    config_path,
    home_dir,
    profile_of,
    state_db,
    state_dir,
    state_dir_of,
)
from monitor.private import pid_alive

log = logging.getLogger(__name__)

DEFAULT_PORT = 18789
DEFAULT_HOOKS_PATH = "/hooks"
_ENV_TOKEN = re.compile(r"\$(\$?)\{([A-Z_][A-Z0-9_]*)\}")


class Install(NamedTuple):
    """Where an OpenClaw install keeps its files (they may not exist)."""

    state_dir: Path
    config_path: Path
    db: Path
    found_by: str  # what chose the state directory: $OPENCLAW_STATE_DIR, a profile, ...


def locate(env: os._Environ[str] | dict[str, str] | None = None) -> Install:
    """The install the gateway would use with this environment (see
    :mod:`monitor.openclaw.home`); the configuration is ``$OPENCLAW_CONFIG_PATH``, else
    ``openclaw.json`` (or the legacy ``clawdbot.json``) in the state directory."""
    env = os.environ if env is None else env
    home = home_dir(env)
    state, found_by = state_dir(env, home)
    config = Path(config_path(env, home, state))
    return Install(Path(state), config, Path(state_db(state)), found_by)


def awaited_state_db(db: Path) -> Install | None:
    """The install whose gateway has yet to make ``db``, its state database, at its first
    start: an OpenClaw configuration is there (the one this environment locates, or
    ``openclaw.json`` beside the database's place), and ``db`` holds no table yet. None when
    ``db`` is no such database, or is made. ``serve`` waits for it: a database the sidecar
    made in its place would not be the one the gateway reads."""
    install = locate()
    if os.path.abspath(db) != os.path.abspath(install.db):
        state = state_dir_of(os.path.abspath(db))
        if state is None:
            return None
        install = Install(Path(state), Path(state, "openclaw.json"), db, "the database's place")
    if not install.config_path.is_file() or _has_tables(db):
        return None
    return install


def _has_tables(db: Path) -> bool:
    """``db`` exists and holds a table (the gateway makes its schema in one transaction);
    a file SQLite cannot read counts as made (opening it says why)."""
    import sqlite3

    if not db.exists():
        return False
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1.0)
        try:
            return conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is not None
        finally:
            conn.close()
    except sqlite3.Error as exc:  # locked: the gateway commits its schema right now
        return "locked" not in str(exc)


def substitute(value: Any, env: os._Environ[str] | dict[str, str], where: str = "") -> Any:
    """``${VAR}`` in every string of ``value``, as the gateway substitutes them: a missing
    or empty variable is an error naming it and the key; ``$${VAR}`` stays literal."""
    if isinstance(value, str):

        def one(match: re.Match[str]) -> str:
            if match.group(1):
                return "${" + match.group(2) + "}"
            found = env.get(match.group(2), "")
            if not found:
                raise ConfigError(
                    f"OpenClaw's {where or 'configuration'} refers to ${{{match.group(2)}}},"
                    " which is not set in the sidecar's environment: set it there too"
                )
            return found

        return _ENV_TOKEN.sub(one, value)
    if isinstance(value, list):
        return [substitute(v, env, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: substitute(v, env, f"{where}.{k}" if where else k) for k, v in value.items()}
    return value


def read_config(path: Path) -> dict[str, Any]:
    """The configuration as written (JSON5), variables not yet substituted. Raises
    ConfigError naming the file."""
    import json5  # only next to an OpenClaw install

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read OpenClaw's configuration {path}: {exc.strerror}") from None
    try:
        parsed = json5.loads(text)
    except ValueError as exc:
        raise ConfigError(f"OpenClaw's configuration {path} is not JSON5: {exc}") from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"OpenClaw's configuration {path} is not an object")
    return parsed


def section(config: dict[str, Any], name: str) -> dict[str, Any]:
    found = config.get(name)
    return found if isinstance(found, dict) else {}


DEV_PORT = 19001  # what OpenClaw's CLI sets for --dev and --profile dev


def gateway_port(
    config: dict[str, Any], env: Mapping[str, str], running: int | None = None
) -> tuple[int, str]:
    """The gateway's port, and where it came from: the port its running gateway wrote into
    its own lock (``running``, see :func:`running_port`), else as the gateway resolves it:
    ``$OPENCLAW_GATEWAY_PORT``, ``gateway.port``, 19001 for the ``dev`` profile (OpenClaw's
    ``--dev`` and ``--profile dev`` set it), one derived from any other profile's name, or
    18789."""
    if running is not None:
        return running, "the running gateway's lock"
    raw = (env.get("OPENCLAW_GATEWAY_PORT") or "").strip()
    match = re.fullmatch(r"(?:\[[^\]]+\]:|[^:]+:)?(\d+)", raw) if raw else None
    if match and 0 < int(match.group(1)) < 65536:
        return int(match.group(1)), "$OPENCLAW_GATEWAY_PORT"
    port = section(config, "gateway").get("port")
    if isinstance(port, int) and not isinstance(port, bool) and port > 0:
        return port, "gateway.port"
    profile = profile_of(env)
    if not profile:
        return DEFAULT_PORT, "the default"
    if profile == "dev":
        return DEV_PORT, "the dev profile"
    digest = 2166136261  # the gateway's FNV-1a of the profile's name
    for byte in profile.encode():
        digest = ((digest ^ byte) * 16777619) & 0xFFFFFFFF
    return 20000 + digest % 40000, f"the {profile} profile"


def lock_files(install: Install) -> list[Path]:
    """Where a running gateway of ``install`` says its pid and port: its lock for this
    configuration (``gateway.<sha256 of the config path>.lock``), then its state lock, in
    ``<state dir>/tmp/openclaw-<uid>/`` (OpenClaw's ``gateway-lock.ts``)."""
    import hashlib

    folder = install.state_dir / "tmp" / f"openclaw-{os.getuid()}"
    digest = hashlib.sha256(str(install.config_path).encode()).hexdigest()[:8]
    return [folder / f"gateway.{digest}.lock", folder / "gateway.state.lock"]


def running_port(install: Install) -> int | None:
    """The port the install's running gateway listens on, from its own lock (JSON: ``pid``,
    ``port``, ``role``), while that pid lives; None when no gateway of it runs."""
    import json

    for path in lock_files(install):
        try:
            payload = json.loads(path.read_text(encoding="utf-8").strip())
            pid, port = payload["pid"], payload["port"]
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if payload.get("role", "gateway") != "gateway" or not isinstance(port, int):
            continue
        if isinstance(pid, int) and pid_alive(pid) and 0 < port < 65536:
            return port
    return None


def _host(config: dict[str, Any]) -> str:
    """Where the gateway listens, as a local client reaches it."""
    gateway = section(config, "gateway")
    bind = gateway.get("bind")
    custom = gateway.get("customBindHost")
    if bind == "custom" and isinstance(custom, str) and custom.strip() not in ("", "0.0.0.0"):
        host = custom.strip()
        return f"[{host}]" if ":" in host else host
    return "127.0.0.1"  # loopback, lan (all interfaces) and auto all answer on loopback


def hooks_path(config: dict[str, Any]) -> str:
    raw = section(config, "hooks").get("path")
    path = raw.strip() if isinstance(raw, str) and raw.strip() else DEFAULT_HOOKS_PATH
    path = path if path.startswith("/") else "/" + path
    return path.rstrip("/") or DEFAULT_HOOKS_PATH


def hooks_url(config: dict[str, Any], env: Mapping[str, str], running: int | None = None) -> str:
    return f"http://{_host(config)}:{gateway_port(config, env, running)[0]}{hooks_path(config)}"


def hooks_token(config: dict[str, Any], env: os._Environ[str] | dict[str, str], path: Path) -> str:
    """``hooks.token``, its variables substituted; a secret reference resolved when it is
    one the sidecar can resolve (an environment variable), else a ConfigError naming the
    key to set."""
    raw = section(config, "hooks").get("token")
    if isinstance(raw, dict):  # a secret reference: {"source": "env", "id": "VAR"}, ...
        source, ident = raw.get("source"), raw.get("id")
        if source == "env" and isinstance(ident, str) and env.get(ident):
            return env[ident].strip()
        raise ConfigError(
            f"hooks.token in {path} is a secret reference ({source or 'unknown source'}) the"
            " sidecar cannot resolve: set [gateway] hooks_token_file to a private file"
            " holding the token"
        )
    token = substitute(raw, env, "hooks.token") if isinstance(raw, str) else ""
    if not token.strip():
        raise ConfigError(f"hooks.token is not set in {path}: set it (hooks need a token)")
    return str(token).strip()


class Hooks:
    """The gateway's hooks as its configuration says now: the URL and the token, read
    again when the file changes (a rotated token, a new port apply at the next wake).

    A file that does not parse (a typo while it is edited) is what the running gateway
    does not apply either: it keeps its last good configuration, and so do the wakes, with
    the last good URL and token, said once until it parses again. ``seen`` names the
    version of the file last read, good or not (a refusal it may heal is checked again
    when it changes)."""

    def __init__(self, install: Install, env: os._Environ[str] | dict[str, str] | None = None):
        self.install = install
        self.env = os.environ if env is None else env
        self.seen: tuple[int, int, int, int | None] | None = None
        self._good: tuple[str, str] | None = None  # the last good (URL, token)
        self._broken = ""  # why the file last read does not parse, said once
        self.port_from = ""  # where the port of the URL came from (see gateway_port)

    def current(self) -> tuple[str, str]:
        """(hooks URL, token); raises ConfigError with the reason when they cannot be had."""
        path = self.install.config_path
        try:
            st = path.stat()
        except OSError as exc:
            raise ConfigError(
                f"cannot read OpenClaw's configuration {path}: {exc.strerror}"
            ) from None
        running = running_port(self.install)  # a gateway started on another port since
        seen = (st.st_ino, st.st_mtime_ns, st.st_size, running)
        if seen == self.seen and self._good is not None:
            return self._good
        self.seen = seen
        try:
            config = read_config(path)
        except ConfigError as exc:
            if self._good is None:
                raise
            if not self._broken:
                log.warning(
                    "%s; wakes keep its last good hooks URL and token, as the running gateway"
                    " keeps its last good configuration, until the file parses again",
                    exc,
                )
            self._broken = str(exc)
            return self._good
        if self._broken:
            log.info("OpenClaw's configuration %s parses again", path)
            self._broken = ""
        if section(config, "hooks").get("enabled") is not True:
            self._good = None
            raise ConfigError(f"OpenClaw's hooks are off in {path}: set hooks.enabled true")
        self._good = None  # until both are had
        port, self.port_from = gateway_port(config, self.env, running)
        url = f"http://{_host(config)}:{port}{hooks_path(config)}"
        self._good = (url, hooks_token(config, self.env, path))
        return self._good


def found_hooks(config: Any, db: Path | str) -> Hooks | None:
    """The gateway's hooks from its own configuration, when the sidecar's ``[gateway]``
    names none, an OpenClaw configuration is there to read, and the store is that install's
    own state database: notices of another database (a scratch one, say) are not the
    gateway's to be woken for. None otherwise."""
    if config.gateway.hooks_url or not isinstance(db, Path):
        return None
    install = locate()
    if not install.config_path.is_file() or not _same_file(db, install.db):
        return None
    return Hooks(install)


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


class GatewayTranscripts:
    """The gateway's own recent user texts of a session, read-only from its agent database
    (``<state>/agents/<agent>/agent/openclaw-agent.sqlite``), as the gateway decides
    self-echo itself (``readRecentUserAssistantTextForSession``): the session's current
    window, its visible messages newest first, a user message's ``upstreamUserText`` when
    it has one (none when it is a delivery mirror), else its first text. A prompt the
    gateway sent into a session it drives is then not a person typing there.

    Read only when the agent database changed since (one ``stat`` per agent and tick)."""

    LIMIT = 10
    SCAN = 250  # visible events read, newest first, to find the last ten user texts

    def __init__(self, install: Install) -> None:
        self.install = install
        self._cache: dict[tuple[str, str], tuple[tuple[int, int, int], GatewaySession]] = {}

    def recent(self, agent_id: str, session_key: str) -> list[str]:
        return self._session(agent_id, session_key).texts

    def session_id(self, agent_id: str, session_key: str) -> str | None:
        """The session's current id in the gateway's agent database (what its own lookups
        of a session entry answer), or None when it has none or cannot be read."""
        return self._session(agent_id, session_key).session_id

    def _session(self, agent_id: str, session_key: str) -> GatewaySession:
        path = Path(agent_db(str(self.install.state_dir), agent_id))
        try:
            wal = Path(f"{path}-wal")
            st, wst = path.stat(), (wal.stat() if wal.exists() else None)
        except OSError:
            return GatewaySession(None, [])
        seen = (st.st_mtime_ns, st.st_size, wst.st_mtime_ns + wst.st_size if wst else 0)
        cached = self._cache.get((agent_id, session_key))
        if cached is not None and cached[0] == seen:
            return cached[1]
        found = _read_session(path, session_key, self.LIMIT, self.SCAN)
        self._cache[(agent_id, session_key)] = (seen, found)
        return found


class GatewaySession(NamedTuple):
    """A session as the gateway's agent database has it: its current id, and its recent
    user texts, oldest first."""

    session_id: str | None
    texts: list[str]


def _read_session(path: Path, session_key: str, limit: int, scan: int) -> GatewaySession:
    import sqlite3

    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error:
        return GatewaySession(None, [])
    session_id: str | None = None
    try:
        row = conn.execute(
            "SELECT current_session_id FROM session_nodes WHERE session_key = ?", (session_key,)
        ).fetchone()
        if row is None or not row[0]:
            return GatewaySession(None, [])
        session_id = str(row[0]).strip() or None
        rows = (
            conn.execute(
                "SELECT e.event_json, e.event_zstd FROM session_transcript_active_events a"
                " JOIN transcript_events e ON e.session_id = a.session_id AND e.seq = a.event_seq"
                " WHERE a.session_id = ? AND a.message_position IS NOT NULL"
                " ORDER BY a.active_position DESC LIMIT ?",
                (row[0], scan),
            ).fetchall()
            or conn.execute(  # not projected yet: the window's events as written
                "SELECT event_json, event_zstd FROM transcript_events WHERE session_id = ?"
                " ORDER BY seq DESC LIMIT ?",
                (row[0], scan),
            ).fetchall()
        )
    except sqlite3.Error:  # another schema, a locked file: no texts, the API's own remain
        return GatewaySession(session_id, [])
    finally:
        conn.close()
    texts: list[str] = []
    for raw, packed in rows:
        text = _user_text(raw, packed)
        if text:
            texts.append(text)
            if len(texts) >= limit:
                break
    return GatewaySession(session_id, texts[::-1])


def _user_text(raw: str | None, packed: bytes | None) -> str | None:
    import orjson

    try:
        if raw is None and packed is not None:
            import zstandard

            raw = zstandard.ZstdDecompressor().decompress(packed).decode("utf-8")
        event = orjson.loads(raw or "null")
    except Exception:  # one unreadable event is not the others' loss
        return None
    message = event.get("message") if isinstance(event, dict) else None
    if not isinstance(message, dict) or message.get("role") != "user":
        return None
    meta = message.get("__openclaw")
    meta = meta if isinstance(meta, dict) else {}
    upstream = meta.get("upstreamUserText")
    if isinstance(upstream, str):
        return upstream.strip() or None
    if meta.get("mirrorOrigin"):
        return None
    content = message.get("content")
    if isinstance(content, str):
        return content.strip() or None
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "text":
                text = block.get("text")
                return text.strip() or None if isinstance(text, str) else None
    return None


def gateway_transcripts(db: str | os.PathLike[str] | None) -> GatewayTranscripts | None:
    """The gateway's transcripts when ``db`` (a SQLite file; None for PostgreSQL) is an
    OpenClaw install's own state database: the one this environment locates, or one named
    by its place (``<state dir>/state/openclaw.sqlite`` beside the state directory's
    ``agents/``), as a sidecar run by another user with ``--db`` names it."""
    if db is None:
        return None
    install = locate()
    if _same_file(db, install.db):
        return GatewayTranscripts(install)
    state = state_dir_of(os.path.abspath(db))
    if state is None or not os.path.isdir(os.path.join(state, "agents")):
        return None
    found = Install(Path(state), Path(state, "openclaw.json"), Path(db), "the database's place")
    return GatewayTranscripts(found)
