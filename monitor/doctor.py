"""``sessionwatch doctor``: check a setup without changing it or waking anyone.

Each check is one line: ``ok``, ``note`` (worth knowing, not wrong) or ``PROBLEM`` with its
fix. The gateway's hooks are checked with an empty JSON body: a gateway that answers
``400 text required`` has accepted the token (and woke no one); ``401`` refuses it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from monitor.config import Config, NodeConfig, is_pg_url, without_password
from monitor.errors import NotPrivate, SessionwatchError, connection_reason, one_line
from monitor.paths import expand_user
from monitor.private import (
    SHORT_TOKEN,
    check_private_state,
    loose_state_files,
    read_secret,
    refuse_if_shared,
)

TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Finding:
    level: str  # ok | note | PROBLEM
    what: str
    fix: str = ""

    def line(self) -> str:
        """One line: what, where, and the fix; whatever a server or a path said in it is
        flattened and escaped (a web server's whole HTML page was ten lines)."""
        fix = f"; fix: {one_line(self.fix, 200)}" if self.fix else ""
        return f"{self.level:<8} {one_line(self.what)}{fix}"


def ok(what: str) -> Finding:
    return Finding("ok", what)


def note(what: str, fix: str = "") -> Finding:
    return Finding("note", what, fix)


def problem(what: str, fix: str) -> Finding:
    return Finding("PROBLEM", what, fix)


async def run(config: Config, db: Path | str) -> list[Finding]:
    """Every check, in the order a reader would fix them."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as http:
        found = [await _database(config, db), *_serve_elsewhere(config, db)]
        found += [_api_token(config), *await _roots(config), *await _links(config, db)]
        found += await _hooks(config, http, db)
        found += await asyncio.gather(*(_node(name, n, http) for name, n in config.nodes.items()))
    return found


async def _database(config: Config, db: Path | str) -> Finding:
    from monitor.kernel import Kernel, KernelSettings
    from monitor.kernel.store.sqlite_conn import made_by_sessionwatch

    shown = without_password(db) if is_pg_url(db) else str(db)
    loose = isinstance(db, Path) and bool(loose_state_files(db)) and made_by_sessionwatch(db)
    try:
        if isinstance(db, Path):
            awaited = _awaited(db)
            if awaited is not None:
                return awaited
            if not db.exists():
                return _not_yet(
                    db, "the state database", "point [store] path or --db at a writable directory"
                )
            why = cannot_create(db.with_name(db.name + ".lock"))
            if why:
                return problem(
                    f"serve cannot take its lock beside {db}: {why}",
                    "make that directory writable, or move the database",
                )
            if not loose:
                check_private_state(db)
        kernel = await Kernel.open(db, KernelSettings.of(config), direct=True)
        await kernel.close()
    except NotPrivate as exc:  # its own "run: chmod ..." is the fix, said once
        return problem(str(exc).split("; run: ")[0], f"chmod 600 {db}*")
    except SessionwatchError as exc:  # said once: the message names the database already
        said = str(exc) if shown in str(exc) else f"the state database {shown}: {exc}"
        if "unable to open database file" in str(exc):
            where = os.path.dirname(os.path.abspath(str(db)))
            return problem(said, f"check that {where} exists and this user may write in it")
        return problem(said, "see the message for the cause; serve would fail the same way")
    if loose:
        return note(
            f"the state database {shown} opens; an earlier sessionwatch made it readable by others",
            "serve sets it to mode 0600 at start",
        )
    return ok(f"the state database {shown} opens")


def _awaited(db: Path) -> Finding | None:
    """OpenClaw's state database, which its gateway has yet to make: nothing is watched or
    woken until it does (serve waits for it)."""
    from monitor.openclaw.files import awaited_state_db

    install = awaited_state_db(db)
    if install is None:
        return None
    return problem(
        f"OpenClaw at {install.state_dir} has not made its state database {db} yet: serve"
        " waits for it, and nothing is watched or woken until then",
        f"start the gateway once ({start_command(os.environ)}, or its service)",
    )


def _serve_elsewhere(config: Config, db: Path | str) -> list[Finding]:
    """A ``serve`` still running on sessionwatch's own default database while the store is
    OpenClaw's (one started before an earlier release followed the gateway's): its notices
    never reach the gateway."""
    from monitor.openclaw.home import state_dir_of
    from monitor.private import serving_addresses

    if not isinstance(db, Path) or state_dir_of(os.path.abspath(db)) is None:
        return []
    own = Path(expand_user(Config().store.path))
    if os.path.abspath(own) == os.path.abspath(db) or not serving_addresses(own):
        return []
    return [
        problem(
            f"a serve runs on {own}, not on OpenClaw's state database {db}, which the gateway"
            " reads: what it watches and wakes is not the gateway's",
            "restart that serve: with no --db and no [store] path it serves OpenClaw's",
        )
    ]


def _not_yet(path: Path, what: str, fix: str) -> Finding:
    """A file ``serve`` makes at its start that is not there yet: a note, or the problem
    that keeps ``serve`` from making it, with ``fix``."""
    why = cannot_create(path)
    if why:
        return problem(f"{what} {path} cannot be created: {why}", fix)
    return note(f"{what} {path} does not exist yet", "serve creates it")


def cannot_create(path: Path) -> str | None:
    """Why ``serve`` could not create ``path`` (and its missing directories), or None: the
    nearest directory that exists must be writable, on a file system mounted read-write."""
    import os

    existing = path.parent
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        return f"{existing} is on a read-only file system"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable by this user"
    return None


def _api_token(config: Config) -> Finding:
    path = Path(expand_user(config.api.token_file))
    try:
        refuse_if_shared(path, "the API token file")
    except SessionwatchError as exc:
        return problem(str(exc), f"chmod 600 {path}")
    if not path.exists():
        return _not_yet(
            path,
            "the API token file",
            "set [api] token_file to a writable place, or create the file (mode 600)",
        )
    try:
        length = len(path.read_text(encoding="utf-8").strip())
    except OSError as exc:
        return problem(
            f"cannot read the API token file {path}: {exc.strerror}", f"chmod 600 {path}"
        )
    if length < SHORT_TOKEN:
        return problem(
            f"the API token in {path} is {length} long, easy to guess",
            f"remove {path}: serve makes a new one of 43 characters",
        )
    return ok(f"the API token file {path} is private")


async def _roots(config: Config) -> list[Finding]:
    """Each format's root: where it came from, whether it exists, and what in it cannot be
    read (a folder of mode 000, a symlink loop, a FIFO named as a session), as the catalog
    lists them: said once a root, with the first of them."""
    from adapters.registry import build_adapters, roots_with_origin
    from monitor.upstream.configured import adapter_settings

    adapters = build_adapters(adapter_settings(config))
    found = []
    for kind, (given, origin) in roots_with_origin(config.roots.given).items():
        path = Path(expand_user(given))
        missing = _missing(path)
        if missing:
            found.append(
                note(f"the {kind} root {path} ({origin}) {missing}: no {kind} sessions are listed")
            )
            continue
        errors = (await adapters[kind].catalog()).errors
        if not errors:
            found.append(ok(f"the {kind} root {path} ({origin}) exists"))
            continue
        first, n = errors[0], len(errors)
        more = f" and {n - 1} more" if n > 1 else ""
        found.append(
            problem(
                f"the {kind} root {path} ({origin}): {n} source{'s' * (n != 1)} cannot be read,"
                f" so {'they are' if n != 1 else 'it is'} not listed:"
                f" {first['path']} ({first['reason']}){more}",
                f"sessionwatch catalog --kind {kind} lists each with its reason",
            )
        )
    return found


async def _links(config: Config, db: Path | str) -> list[Finding]:
    """The watched links whose last check could not read them (permission denied, a FIFO,
    a node that does not answer) or that are blocked: a person typing there goes unseen.
    Said once, with the first and how many; nothing when the database cannot be opened (its
    own check says why)."""
    from monitor.kernel import Kernel, KernelSettings
    from monitor.upstream import UpstreamMonitor

    if isinstance(db, Path) and not db.exists():
        return []
    try:
        kernel = await Kernel.open(db, KernelSettings.of(config), direct=True)
    except SessionwatchError:
        return []
    try:
        views = await UpstreamMonitor.from_config(kernel, config).links()
    finally:
        await kernel.close()
    blind = [
        (v.link.session_key, v.status.reason or v.status.outcome)
        for v in views
        if v.watched and v.status is not None and v.status.outcome in ("inconclusive", "blocked")
    ]
    if not blind:
        return []
    (key, why), n = blind[0], len(blind)
    more = f" and {n - 1} more" if n > 1 else ""
    return [
        problem(
            f"{n} watched link{'s' * (n != 1)} could not be read at the last check: {key}"
            f" ({why}){more}; a person typing there goes unseen",
            "sessionwatch links names each with its reason",
        )
    ]


def _missing(path: Path) -> str | None:
    """Why a root holds nothing to list, when nothing is there: it does not exist, or it is
    a link that leads nowhere (a link in a loop is there, and cannot be read: the catalog
    says so)."""
    if not os.path.lexists(path):
        return "does not exist"
    try:
        os.stat(path)
    except FileNotFoundError:
        return "is a symbolic link that leads nowhere"
    except OSError:
        pass
    return None


async def _hooks(config: Config, http: aiohttp.ClientSession, db: Path | str) -> list[Finding]:
    from monitor.openclaw.files import found_hooks

    gateway = config.gateway
    settings: list[Finding] = []
    if gateway.wakes:
        token_file: Path | str = Path(expand_user(gateway.hooks_token_file))
        try:
            token = read_secret(Path(token_file), "the hooks token file")
        except SessionwatchError as exc:
            return [problem(str(exc), "put the gateway's hooks.token in it, mode 600")]
        base = gateway.hooks_url
        where = Where(
            "start the gateway, or correct [gateway] hooks_url",
            "set hooks.enabled true in the gateway, and hooks_url to its hooks.path",
            "set [gateway] hooks_url to the gateway's own address and hooks.path",
        )
    else:
        hooks = found_hooks(config, db)
        if hooks is None:
            return [
                note(
                    "no [gateway] hooks_url, and the store is not an OpenClaw install's own"
                    " state database: notices are not pushed to a gateway",
                    "run next to OpenClaw on its database, or set [gateway] hooks_url and"
                    " hooks_token_file",
                )
            ]
        path = hooks.install.config_path
        settings = _openclaw_settings(hooks, watcher_agents(db))
        if any(f.level == "PROBLEM" and "hooks.allow" not in f.what for f in settings):
            return settings  # off, or unreadable: said once, with its fix
        try:
            base, token = hooks.current()
        except SessionwatchError as exc:
            return [*settings, problem(str(exc), f"edit {path}, then restart the gateway")]
        token_file = f"OpenClaw's hooks.token ({path})"
        settings.insert(0, _following(hooks))
        where = Where(
            f"start the gateway ({start_command(hooks.env)}), or {_port_fix(hooks, path)}",
            f"set hooks.enabled true in {path}, and hooks.path to where the hooks are",
            f"{_port_fix(hooks, path)}: another server answers on it",
        )
    found = await _probe_hooks(base, token, token_file, http, where)
    return [*settings, *found]


def _following(hooks: Any) -> Finding:
    """Which OpenClaw install the wakes follow, what chose it (a profile, a variable, the
    default), and where the port came from."""
    install = hooks.install
    return ok(
        f"following OpenClaw's install at {install.state_dir} ({install.found_by}); the"
        f" gateway's port from {hooks.port_from}; its configuration {install.config_path}"
    )


def start_command(env: Mapping[str, str]) -> str:
    """How the gateway of the install followed is started, as its CLI takes a profile."""
    from monitor.openclaw.home import profile_of

    profile = profile_of(env)
    if profile == "dev":
        return "openclaw --dev gateway run"
    return f"openclaw --profile {profile} gateway run" if profile else "openclaw gateway run"


def _port_fix(hooks: Any, path: Path) -> str:
    """Where to look when the port is wrong, by where it came from."""
    origin = hooks.port_from
    if origin == "$OPENCLAW_GATEWAY_PORT":
        return "check $OPENCLAW_GATEWAY_PORT in the sidecar's environment"
    if origin == "gateway.port":
        return f"check gateway.port in {path} (and $OPENCLAW_GATEWAY_PORT in the gateway's unit)"
    if origin == "the running gateway's lock":
        return "check that the gateway running is this install's (its lock names its port)"
    return (
        f"the port is {origin}'s; set gateway.port in {path}, or $OPENCLAW_GATEWAY_PORT for"
        " both, where the gateway listens elsewhere"
    )


@dataclass(frozen=True, slots=True)
class Where:
    """The fixes of the hooks' probe, by where their address came from: the sidecar's
    ``[gateway]`` or OpenClaw's own configuration."""

    down: str  # nothing answers
    missing: str  # 404
    other: str  # something that is not OpenClaw's hooks answers


def _openclaw_settings(hooks: Any, watchers: set[str]) -> list[Finding]:
    """OpenClaw's own hooks settings that would refuse the sidecar's wakes, by their names,
    each with the snippet that fixes it."""
    from monitor.openclaw.files import read_config, section

    path = hooks.install.config_path
    try:
        h = section(read_config(path), "hooks")
    except SessionwatchError as exc:
        return [
            problem(
                str(exc),
                "correct it where the message says; meanwhile the running gateway keeps its"
                " last good configuration, and serve's wakes its last good URL and token",
            )
        ]
    found = []
    if h.get("enabled") is not True:
        found.append(problem(
            f"OpenClaw's hooks are off (hooks.enabled in {path})",
            '"hooks": {"enabled": true, "token": "<a long random string>"}, then restart the'
            " gateway",
        ))  # fmt: skip
        return found
    if h.get("allowRequestSessionKey") is not True:
        found.append(problem(
            f"OpenClaw's hooks.allowRequestSessionKey is off in {path}: only main sessions"
            " can be woken, through their agent",
            '"hooks": {"allowRequestSessionKey": true, "allowedSessionKeyPrefixes":'
            ' ["agent:", "hook:"]}',
        ))  # fmt: skip
    prefixes = h.get("allowedSessionKeyPrefixes")
    if isinstance(prefixes, list) and not any(
        isinstance(p, str) and "agent:main:main".startswith(p) for p in prefixes
    ):
        found.append(problem(
            f"OpenClaw's hooks.allowedSessionKeyPrefixes in {path} leaves out the watchers'"
            f" keys (agent:...): {prefixes}",
            '"allowedSessionKeyPrefixes": [' + ", ".join(
                f'"{p}"' for p in [*prefixes, "agent:"] if isinstance(p, str)
            ) + "]",
        ))  # fmt: skip
    allowed = h.get("allowedAgentIds")
    left_out = sorted(watchers - set(allowed)) if isinstance(allowed, list) else []
    if isinstance(allowed, list) and "*" not in allowed and left_out:
        found.append(problem(
            f"OpenClaw's hooks.allowedAgentIds in {path} leaves out the watchers' agent"
            f" {', '.join(left_out)}: {allowed}",
            '"allowedAgentIds": [' + ", ".join(f'"{a}"' for a in [*allowed, *left_out]) + "]",
        ))  # fmt: skip
    return found


def watcher_agents(db: Path | str) -> set[str]:
    """The agents of the sessions that watch others in ``db`` (read-only), and main."""
    import sqlite3

    from monitor.kernel.cursors import watcher_keys
    from monitor.kernel.keys import parse_agent_key

    agents = {"main"}
    if not isinstance(db, Path) or not db.is_file():
        return agents
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            for key in watcher_keys(conn):
                parsed = parse_agent_key(str(key))
                if parsed is not None:
                    agents.add(parsed.agent_id)
        finally:
            conn.close()
    except sqlite3.Error:
        pass  # the database check says why
    return agents


async def _probe_hooks(
    base: str, token: str, token_file: Path | str, http: aiohttp.ClientSession, where: Where
) -> list[Finding]:
    url = base.rstrip("/") + "/wake"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    try:
        async with http.post(url, data=b"{}", headers=headers) as resp:
            status, raw = resp.status, await resp.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return [
            problem(
                f"the gateway's hooks at {url} do not answer ({connection_reason(exc)})",
                where.down,
            )
        ]
    error = _error_of(raw)
    if status == 400 and error == "text required":
        return [ok(f"the gateway's hooks at {url} accept the token in {token_file}")]
    if status == 401:
        return [
            problem(
                f"the gateway refused the token in {token_file} (401)",
                "put the gateway's hooks.token in that file",
            )
        ]
    if status == 404:
        return [
            problem(
                f"no hooks at {url} (404)",
                where.missing,
            )
        ]
    if status == 429:
        return [problem(f"the gateway throttles {url} (429)", "wait a minute; check the token")]
    answered = " ".join(part for part in (str(status), error) if part)
    if 200 <= status < 300:  # OpenClaw refuses a wake without text: this is something else
        return [
            problem(
                f"{url} took a wake with no text ({answered}); OpenClaw's hooks refuse one"
                " (400 text required), so this is not them",
                where.other,
            )
        ]
    return [problem(f"the gateway answered {answered} at {url}", "see the gateway's log")]


def _error_of(raw: bytes) -> str:
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:  # not the gateway's JSON: a line of it says enough
        return one_line(raw.decode("utf-8", "replace"), 80)
    return str(parsed.get("error", "")) if isinstance(parsed, dict) else ""


async def _node(name: str, node: NodeConfig, http: aiohttp.ClientSession) -> Finding:
    """The node answers, with the token we hold, through the pinned certificate; and what
    it serves."""
    from adapters import node_client
    from adapters.registry import ITEMS_SERVES
    from monitor.upstream.configured import node_address

    url = node.url
    path = Path(expand_user(node.token_file))
    try:
        read_secret(path, f"the token file of node {name}")
    except SessionwatchError as exc:
        return problem(str(exc), "copy the node's token there, mode 600")
    nodes = {name: node_address(node)}
    older = ""
    try:  # the cheap call: the change feed's cursor, at once (a catalog scans every root)
        try:
            answer = await node_client.call(http, nodes, name, "/v1/changes", params={"wait": "0"})
        except node_client.Answered as exc:
            if node_client.OLDER_NODE not in str(exc):
                raise
            answer = await node_client.call(http, nodes, name, "/v1/threads")
            answer["kinds"] = [ITEMS_SERVES]  # all an older node serves
            older = " (an older sessionwatch node: upgrade it to serve every kind)"
    except node_client.Answered as exc:
        if exc.status == 401:
            return problem(
                f"node {name} refused the token in {path} (401)", "copy the node's token"
            )
        return problem(f"node {name} at {url}: {exc}", "check its url; upgrade an older node")
    except node_client.NodeError as exc:
        if "pin mismatch" in str(exc):
            fix = "if the node made a new certificate, pin the one it logs at start"
            return problem(str(exc), fix)
        return problem(
            f"node {name} at {url} does not answer ({exc})",
            "start `sessionwatch node` there, or correct its url",
        )
    kinds = answer.get("kinds")
    served = ", ".join(str(k) for k in kinds) if isinstance(kinds, list) and kinds else None
    served = served or "nothing yet (none of its roots exists)"
    pinned = " (certificate pin holds)" if node.fingerprint else ""
    return ok(f"node {name} at {url} answers{pinned}; it serves {served}{older}")


def print_findings(found: list[Finding]) -> int:
    """Print one line each; the exit code: 1 when any is a problem."""
    for f in found:
        print(f.line())
    return 1 if any(f.level == "PROBLEM" for f in found) else 0


async def node_reachable(name: str, node: NodeConfig) -> str | None:
    """Why node ``name`` cannot be read from here, or None when it answers (the status
    page's check, the same as the doctor's)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as http:
        found = await _node(name, node, http)
    return None if found.level == "ok" else found.what
