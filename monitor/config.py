"""The TOML configuration: every value has a default, so no file is needed to start.

Each section is a typed model (a NamedTuple); a field's type, with its :class:`Rule` when
it has one (``Annotated[float, positive(DAY_S)]``), says what it accepts, and one decoder reads
every section through them. An unknown key (with the nearest known one) or a value the model refuses
stops start-up with a message naming the key.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType

from monitor.errors import ConfigError, did_you_mean
from monitor.paths import expand_user
from monitor.records import NamedTuple, hints

TYPE_CHECKING = False

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Annotated, Any, TypeGuard

PG_SCHEMES = ("postgresql://", "postgres://")


def is_pg_url(target: object) -> TypeGuard[str]:
    """Whether a ``--db``, ``$SESSIONWATCH_DB`` or ``[store] url`` names a PostgreSQL
    database (else it is a SQLite file)."""
    return isinstance(target, str) and (target.startswith(PG_SCHEMES) or is_libpq_dsn(target))


def listen_is_valid(listen: str) -> bool:
    """``HOST:PORT`` (port 0-65535, ``[ADDR]`` for IPv6) or ``unix:PATH``."""
    if listen.startswith("unix:"):
        return bool(listen.removeprefix("unix:").strip())
    _, colon, port = listen.rpartition(":")
    return bool(colon) and port.isdigit() and 0 <= int(port) <= 65535


LISTEN_SHAPE = "must be HOST:PORT (port 0-65535, [ADDR] for IPv6) or unix:PATH"


# Patterns, not compiled objects: ``re`` compiles each at its first use and caches it, so a
# one-shot command that never needs one does not pay for it at start-up.
_USERINFO = r"://([^:/@?#]*):[^@/?#]*@"
_QUERY_SECRET = r"(?i)([?&](?:ssl)?password=)[^&#]*"
_DSN_SECRET = r"(?i)\b((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)"
_DSN = r"(?i)^\s*(?:[a-z_]+\s*=\s*(?:'(?:[^'\\]|\\.)*'|\S+)\s*)+$"
_DSN_KEYS = r"(?:^|\s)(?:host|hostaddr|port|dbname|user|password|service)\s*="


def without_password(target: str) -> str:
    """A store target with every password the driver would accept masked: the one before
    the ``@`` of a URL, ``password=`` and ``sslpassword=`` in its query, and the same keys
    of a libpq ``key=value`` string (quoted values included)."""
    if "://" in target:
        return re.sub(_QUERY_SECRET, r"\1***", re.sub(_USERINFO, r"://\1:***@", target))
    return re.sub(_DSN_SECRET, r"\1***", target)


def is_libpq_dsn(target: str) -> bool:
    """``host=... dbname=...``: libpq's ``key=value`` form, which names a PostgreSQL
    database, never a SQLite file. A path with no ``=`` is not one (and costs no regex)."""
    if "=" not in target:
        return False
    return bool(re.match(_DSN, target)) and bool(re.search(_DSN_KEYS, " " + target))


_HOST_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_HTTP_URL = r"^https?://[^/\s]+(/\S*)?$"


class Rule(NamedTuple):
    """What a setting accepts beyond its type: positive, one of ``choices``, or passing
    ``check`` (else ``says``, which follows ``[section] name``; ``{value}`` is the value).
    A field declares it in its type: ``Annotated[float, positive(DAY_S)]``."""

    positive: bool = False
    choices: tuple[str, ...] = ()
    check: Callable[[Any], bool] | None = None
    says: str = ""
    most: float = float(2**63 - 1)  # a number's largest value (every number is finite)
    least: float = 0.0  # a duration's smallest value, where zero would spin
    file: bool = False  # a path: a relative one is read against the configuration's directory


FILE = Rule(file=True)


DAY_S = 86_400.0


def positive(most: float) -> Rule:
    """A positive number no larger than ``most``."""
    return Rule(positive=True, most=most)


def at_most(most: float) -> Rule:
    return Rule(most=most)


MIN_DURATION_S = 0.1  # a period shorter than this would spin: a tick, a budget, a retry


def duration(most: float = DAY_S) -> Rule:
    """A period: at least :data:`MIN_DURATION_S`, at most ``most``."""
    return Rule(positive=True, most=most, least=MIN_DURATION_S)


def _given(check: Callable[[str], bool]) -> Callable[[str], bool]:
    """An empty string means "not set"; anything else must pass ``check``."""
    return lambda value: not value or check(value)


# The models are NamedTuples, not dataclasses: every one-shot command reads them, and a
# dataclass costs the start-up about 0.9 ms to make (against 0.2) plus dataclasses' import.


class StoreConfig(NamedTuple):
    path: Annotated[str, FILE] = "~/.local/state/sessionwatch/state.db"
    # postgresql://...: the state in PostgreSQL instead (several sidecars)
    url: Annotated[str, Rule(check=_given(is_pg_url), says="must be a postgresql:// URL")] = ""


class MonitorConfig(NamedTuple):
    interval_s: Annotated[float, duration()] = 60.0
    initial_delay_s: Annotated[float, at_most(DAY_S)] = 15.0
    adapter_budget_s: Annotated[float, duration()] = 45.0
    scan_cap_bytes: Annotated[int, positive(2**30)] = 1_048_576
    max_line_bytes: Annotated[int, positive(2**32)] = 64 * 1_048_576
    missing_threshold: Annotated[int, positive(1000)] = 3
    # a turn in progress with no record read for this long reads as quiet (adapters/states)
    quiet_after_s: Annotated[float, duration()] = 600.0
    own_text_limit: Annotated[int, at_most(1000)] = 10
    replay_lookback: Annotated[int, at_most(10_000)] = 50
    node_pages: Annotated[int, at_most(1000)] = 4
    export_concurrency: Annotated[int, at_most(64)] = 4
    watch_files: bool = True


class RootsConfig:
    """``[roots]``: where each format's sessions are, under the key its format registers
    (``root_key`` in adapters/registry.py, which also holds the defaults). Which keys exist
    is the registry's to say: :func:`adapters.registry.roots_of` checks them."""

    __slots__ = ("given",)

    def __init__(self, **given: str) -> None:
        self.given: dict[str, str] = dict(given)

    def __getattr__(self, key: str) -> str:
        if key == "given" or key.startswith("__"):  # a copy before its __init__, say
            raise AttributeError(key)
        try:
            return self.given[key]
        except KeyError:
            raise AttributeError(f"[roots] gives no {key}") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RootsConfig) and other.given == self.given

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.given.items())))

    def __repr__(self) -> str:
        return f"RootsConfig({self.given!r})"


_LISTEN = Rule(check=listen_is_valid, says=LISTEN_SHAPE + ", got {value!r}")
_HOOKS_URL = Rule(
    check=_given(lambda url: bool(re.match(_HTTP_URL, url))),
    says="must be an http:// or https:// URL, the gateway's hooks base"
    " (for example http://127.0.0.1:18789/hooks)",
)
_HOST = Rule(
    check=_given(lambda value: bool(re.match(_HOST_ID, value))),
    says="must be letters, digits, '.', '_' or '-' (at most 64)",
)


class ApiConfig(NamedTuple):
    listen: Annotated[str, _LISTEN] = "127.0.0.1:8765"
    token_file: Annotated[str, FILE] = "~/.local/state/sessionwatch/token"
    # Host names answered besides those the listen address implies (the API and the node)
    allowed_hosts: tuple[str, ...] = ()


class GatewayConfig(NamedTuple):
    """The gateway's hooks API, where wakes go (``{hooks_url}/wake``); both or neither."""

    # the hooks base, for example http://127.0.0.1:18789/hooks
    hooks_url: Annotated[str, _HOOKS_URL] = ""
    hooks_token_file: Annotated[str, FILE] = ""  # a private file holding the gateway's hooks.token
    # how often an undelivered notice is sent again
    retry_interval_s: Annotated[float, duration()] = 30.0
    # plain http:// to a host that is not this machine: the token would cross the network
    # in clear; refused unless this says it is meant (a private link, say)
    allow_plain_http: bool = False

    @property
    def wakes(self) -> bool:
        return bool(self.hooks_url)


def clear_text_host(url: str) -> str | None:
    """The host of a plain ``http://`` URL that is not this machine's loopback: where a
    bearer token would cross a network in clear. None for https:// and loopback."""
    if not url.startswith("http://"):
        return None
    from urllib.parse import urlsplit  # only where a URL is checked

    host = urlsplit(url).hostname or ""
    return None if is_loopback(host) else host


class SessionConfig(NamedTuple):
    main_key: str = "main"
    scope: Annotated[str, Rule(choices=("global", "per-sender"))] = "per-sender"
    group_scope: Annotated[str, Rule(choices=("per-group", "shared"))] = "per-group"
    notify_on_create: bool = True
    # template with {agentId}; see monitor.kernel.watcher_stores
    store_path: Annotated[str, FILE] = ""


class LogConfig(NamedTuple):
    # a reload (SIGHUP) applies it
    level: Annotated[str, Rule(choices=("debug", "error", "info", "warning"))] = "info"


class HostConfig(NamedTuple):
    """This sidecar's host: its file links are written ``gateway:<id>`` and only it ticks
    them. A store several sidecars share needs an explicit, unique id."""

    id: Annotated[str, _HOST] = ""

    @property
    def effective(self) -> str:
        return self.id or "local"


class NodeConfig(NamedTuple):
    url: str
    token_file: Annotated[str, FILE]
    # the SHA-256 of the node's certificate (an https url needs one): pinned, no CA asked
    fingerprint: str = ""


PIN_PREFIX = "sha256:"


def parse_pin(raw: str, where: str) -> str:
    """A certificate pin: ``sha256:`` and 64 hex digits (colons between pairs allowed), as
    lowercase hex."""
    text = raw.strip().lower().removeprefix(PIN_PREFIX).replace(":", "")
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise ConfigError(
            f"{where} must be the node's certificate fingerprint, sha256: and 64 hex digits"
            " (the node logs it at start)"
        )
    return text


def is_loopback(host: str) -> bool:
    """``localhost``, or an address of this machine's loopback (``127.0.0.0/8``, ``::1``)."""
    import ipaddress  # only where a node or a listener is checked

    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _node(name: str, raw: Any, base: str | None) -> NodeConfig:
    """A ``[nodes.NAME]`` section: plain http only to loopback (an SSH forward), https only
    with the node's certificate pinned."""
    from urllib.parse import urlsplit

    node: NodeConfig = _section(NodeConfig, f"nodes.{name}", raw, base)
    where = f"[nodes.{name}]"
    parts = urlsplit(node.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where} url must be http://HOST:PORT or https://HOST:PORT")
    if clear_text_host(node.url) is not None:
        raise ConfigError(
            f"{where} url {node.url} is plain http to another machine: the token and the"
            " sessions' metadata would cross the network in clear. Start the node with --tls"
            " and use https:// with its fingerprint, or forward its port over SSH and use"
            " http://127.0.0.1:PORT"
        )
    if parts.scheme == "https" and not node.fingerprint:
        raise ConfigError(
            f"{where} url is https but no fingerprint is pinned: set {where} fingerprint to"
            " the sha256: the node logs at start"
        )
    if node.fingerprint:
        pin = parse_pin(node.fingerprint, f"{where} fingerprint")
        node = node._replace(fingerprint=PIN_PREFIX + pin)
    return node


_REPLACED = {
    ("gateway", "wake_url"): (
        "[gateway] wake_url is gone: wakes now go through the gateway's hooks API. Set"
        " [gateway] hooks_url to its hooks base (for example http://127.0.0.1:18789/hooks)"
        " and [gateway] hooks_token_file to a private file holding its hooks.token"
    ),
}


class Config(NamedTuple):
    store: StoreConfig = StoreConfig()
    monitor: MonitorConfig = MonitorConfig()
    roots: RootsConfig = RootsConfig()
    api: ApiConfig = ApiConfig()
    gateway: GatewayConfig = GatewayConfig()
    session: SessionConfig = SessionConfig()
    host: HostConfig = HostConfig()
    log: LogConfig = LogConfig()
    nodes: Mapping[str, NodeConfig] = MappingProxyType({})

    def as_json(self) -> dict[str, Any]:
        """The effective configuration; token files are named, never read, and a store
        URL's password is never shown."""
        out: dict[str, Any] = {
            name: dict(section._asdict())
            for name, section in self._asdict().items()
            if name not in ("roots", "nodes")
        }
        out["nodes"] = {name: dict(node._asdict()) for name, node in self.nodes.items()}
        out["store"]["url"] = without_password(self.store.url)
        out["roots"] = dict(self.roots.given)  # the CLI adds the defaults (the registry's)
        return out


def _check_value(where: str, expected: Any, rule: Rule | None, value: Any) -> Any:
    """``value`` as the field's type, if it is one, and if its :class:`Rule` takes it."""
    value = _of_type(where, expected, value)
    if isinstance(value, int | float):
        _in_bounds(where, value, rule or Rule())
    return value if rule is None else _by_rule(where, rule, value)


# what each plain type takes, and what a value of another type is told
_TYPES: dict[Any, tuple[Callable[[Any], bool], str]] = {
    bool: (lambda v: isinstance(v, bool), "must be true or false"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "must be an integer"),
    float: (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "must be a number"),
    str: (lambda v: isinstance(v, str), "must be a string"),
}


def _of_type(where: str, expected: Any, value: Any) -> Any:
    """``value`` as ``expected`` (an int taken as a float, a list as a tuple of strings),
    or a ConfigError naming the type."""
    if getattr(expected, "__origin__", None) is tuple:  # tuple[str, ...]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f'{where} must be a list of strings, for example ["sidecar.lan"]')
        return tuple(value)
    takes = _TYPES.get(expected)
    if takes is not None and not takes[0](value):
        raise ConfigError(f"{where} {takes[1]}")
    return float(value) if expected is float else value


def _in_bounds(where: str, value: float, rule: Rule) -> None:
    """A number every field takes: finite, not negative, at most the rule's most."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number")
    if value < 0:
        raise ConfigError(f"{where} must not be negative")
    if value > rule.most:
        raise ConfigError(f"{where} must be at most {rule.most:,.0f}")


def _by_rule(where: str, rule: Rule, value: Any) -> Any:
    """``value``, if the field's own rule takes it."""
    if rule.positive and value <= 0:
        raise ConfigError(f"{where} must be positive")
    if isinstance(value, int | float) and value < rule.least:
        raise ConfigError(f"{where} must be at least {rule.least:g} s")
    if rule.choices and value not in rule.choices:
        raise ConfigError(f"{where} must be one of {', '.join(rule.choices)}")
    if rule.check is not None and not rule.check(value):
        raise ConfigError(f"{where} {rule.says.format(value=value)}")
    return value


def _fields_of(cls: type[Any]) -> dict[str, tuple[Any, Rule | None]]:
    """A section's fields: each one's type, and its :class:`Rule` if it declares one."""
    import typing  # only when a file is read

    out: dict[str, tuple[Any, Rule | None]] = {}
    for name, hint in hints(cls).items():
        if typing.get_origin(hint) is typing.Annotated:
            base, *extras = typing.get_args(hint)
            out[name] = (base, next((e for e in extras if isinstance(e, Rule)), None))
        else:
            out[name] = (hint, None)
    return out


def _section(cls: type[Any], section: str, raw: Any, base: str | None) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"[{section}] must be a table")
    declared = _fields_of(cls)
    for name in raw:
        if (section, name) in _REPLACED:
            raise ConfigError(_REPLACED[(section, name)])
    unknown = sorted(set(raw) - set(declared))
    if unknown:
        known = did_you_mean(unknown[0], declared)
        raise ConfigError(f"unknown key [{section}] {unknown[0]}{known}")
    values = {k: _check_value(f"[{section}] {k}", *declared[k], v) for k, v in raw.items()}
    for k, (_, rule) in declared.items():
        if rule is not None and rule.file and values.get(k):
            values[k] = _file_path(f"[{section}] {k}", values[k], base)
    defaults = getattr(cls, "_field_defaults", {})
    missing = [name for name in declared if name not in values and name not in defaults]
    if missing:
        keys = " and ".join(f"{name} = ..." for name in missing)
        raise ConfigError(f"[{section}] needs {keys}")
    return cls(**values)


_SECTIONS: dict[str, type[Any]] = {
    "store": StoreConfig,
    "monitor": MonitorConfig,
    "api": ApiConfig,
    "gateway": GatewayConfig,
    "session": SessionConfig,
    "host": HostConfig,
    "log": LogConfig,
}


def _file_path(where: str, value: str, base: str | None) -> str:
    """A path the file gives: absolute and ``~/...`` as written, a relative one read against
    ``base``, the configuration file's directory (whatever directory a command runs in), and
    refused where there is no file to be relative to."""
    if value.startswith("~") or os.path.isabs(value):
        return value
    if base is None:
        raise ConfigError(f"{where} = {value!r} is relative: give an absolute path")
    return os.path.normpath(os.path.join(base, value))


def _roots(raw: Any, base: str | None) -> RootsConfig:
    """The ``[roots]`` table: strings only here; its keys are the registry's to check. An
    empty root is refused (it would be the directory the command runs in); a relative one
    is read as every path of the file is (:func:`_file_path`)."""
    if not isinstance(raw, dict):
        raise ConfigError("[roots] must be a table")
    roots: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(value, str):
            raise ConfigError(f"[roots] {key} must be a string")
        if not value.strip():
            raise ConfigError(
                f"[roots] {key} is empty: name a directory (absolute, ~/..., or relative to"
                " the configuration file), or leave the key out for the default"
            )
        roots[key] = _file_path(f"[roots] {key}", value, base)
    return RootsConfig(**roots)


def parse_config(raw: dict[str, Any], base: str | None = None) -> Config:
    """The configuration of ``raw`` (a parsed TOML document); ``base``: the directory of the
    file it came from, that relative roots are read against."""
    unknown = sorted(set(raw) - set(_SECTIONS) - {"nodes", "roots"})
    if unknown:
        known = [*_SECTIONS, "nodes", "roots"]
        raise ConfigError(f"unknown section [{unknown[0]}]{did_you_mean(unknown[0], known)}")
    values: dict[str, Any] = {
        name: _section(cls, name, raw[name], base) for name, cls in _SECTIONS.items() if name in raw
    }
    if "roots" in raw:
        values["roots"] = _roots(raw["roots"], base)
    gateway = values.get("gateway")
    if gateway is not None and bool(gateway.hooks_url) != bool(gateway.hooks_token_file):
        raise ConfigError(
            "[gateway] hooks_url and hooks_token_file go together: the gateway's hooks API"
            " refuses a wake without its token"
        )
    clear = None if gateway is None else clear_text_host(gateway.hooks_url)
    if clear is not None and gateway is not None and not gateway.allow_plain_http:
        raise ConfigError(
            f"[gateway] hooks_url: plain http:// to {clear} would send the hooks token across"
            " the network in clear. Use https://, or a loopback address (an SSH forward of the"
            " gateway's port), or set [gateway] allow_plain_http = true on a link you trust"
        )
    nodes = raw.get("nodes", {})
    if not isinstance(nodes, dict):
        raise ConfigError("[nodes] must be a table of tables")
    values["nodes"] = {n: _node(n, t, base) for n, t in nodes.items()}
    return Config(**values)


def load_config(path: Path | str | None) -> Config:
    """Read ``path``, else ``$SESSIONWATCH_CONFIG``, else defaults."""
    chosen = path or os.environ.get("SESSIONWATCH_CONFIG")
    if not chosen:
        return Config()
    p = expand_user(chosen)
    import stat
    import tomllib  # only when there is a file to read

    try:
        if not stat.S_ISREG(os.stat(p).st_mode):  # a FIFO would block the read for good
            raise ConfigError(f"cannot read configuration {p}: not a regular file")
        with open(p, encoding="utf-8-sig") as f:  # a leading BOM is no statement
            raw = tomllib.loads(f.read())
    except OSError as exc:
        raise ConfigError(f"cannot read configuration {p}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"configuration {p} is not valid TOML: {exc}") from None
    return parse_config(raw, os.path.dirname(os.path.abspath(p)))
