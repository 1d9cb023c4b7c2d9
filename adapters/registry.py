"""The registry of upstream formats: the only list of kinds. A new format is one module (with
a ``build(settings)`` that returns its :class:`~adapters.base.Adapter`) and one line here.
A format a paired node serves names its node protocol's module (``node``): the same entry
then also gives the node form of its links (``<name>-node``), derived, never a second line.

Each entry also says how links of the kind are written in OpenClaw's vocabulary
(``upstream_kind``, ``catalog_id``, ``host_id``) and what an adoption names (``form``). A
module is imported only when its adapter is built, so naming a kind costs nothing.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any, Literal

from adapters.base import Adapter, NodeProtocol, Settings
from monitor.errors import BadInput, did_you_mean
from monitor.records import NamedTuple

LOCAL_HOST = "local"  # the host id of a single sidecar: OpenClaw's ``gateway:local``
GATEWAY_HOST_PREFIX = "gateway:"
NODE_HOST_PREFIX = "node:"
# The format a node also serves at the paths of OpenClaw's item protocol (``/v1/threads``)
ITEMS_SERVES = "claude"
NODE_SUFFIX = "-node"  # a node form's name: its local format's, and this

Form = Literal["file", "database", "node"]


class Entry(NamedTuple):
    """One format: our name for it (what the CLI and the API take), its module, and how its
    links are written.

    ``form``: what an adoption names: a ``file`` path, a ``database`` path and a session id
    (``thread``), or a paired ``node`` and a thread. A ``node`` source's host is
    ``node:<nodeId>`` from its ref, any other's is this machine; ``serves`` names the local
    format whose sources the node reads for it (from that format's root on the node's
    machine) and whose classifier the sidecar runs on what the node sends."""

    name: str
    module: str
    upstream_kind: str
    catalog_id: str
    form: Form = "file"
    root_key: str | None = None  # its ``[roots]`` key (None: it has no root, a node's)
    root_default: str = ""  # where its sessions are when ``[roots]`` does not say
    # the harness's own variables that move its sessions, first that is set wins: each
    # (variable, the root below its value), before ``root_default``
    root_env: tuple[tuple[str, str], ...] = ()
    serves: str | None = None  # a node form: the local format it reads on the node
    # a local format: the module of its node protocol (:class:`~adapters.base.NodeProtocol`),
    # what a node serves its sources with and what reads them from a sidecar; None: no
    # node serves it
    node: str | None = None
    # False for a kind whose links only the gateway writes (it is read, never adopted here)
    adoptable: bool = True

    @property
    def remote(self) -> bool:
        return self.form == "node"

    @property
    def needs_thread(self) -> bool:
        return self.form != "file"

    def node_protocol(self) -> NodeProtocol:
        """This format's node protocol (see ``node``)."""
        if self.node is None:
            raise BadInput(f"no node serves {self.name} sessions")
        protocol: NodeProtocol = importlib.import_module(self.node)
        return protocol

    def on_node(self) -> Entry:
        """The node form of this format's links: adopted by a node and a thread, read by its
        node protocol's sidecar half."""
        return Entry(
            name=f"{self.name}{NODE_SUFFIX}",
            module=str(self.node),
            upstream_kind=self.upstream_kind,
            catalog_id=self.catalog_id,
            form="node",
            serves=self.name,
        )

    def build(self, settings: Settings) -> Adapter:
        module = importlib.import_module(self.module)
        if self.serves is not None:  # a node protocol's sidecar half, for any format
            node_built: Adapter = module.remote(settings, self.name, self.serves)
            return node_built
        built: Adapter = module.build(settings)
        return built


_LOCAL: dict[str, Entry] = {}  # as registered
_ENTRIES: dict[str, Entry] = {}  # and each one's node form, after every local one
_READERS: dict[tuple[str, bool], str] = {}  # (upstream kind, remote) -> the adapter reading it


def register(entry: Entry) -> None:
    """Add a format, and its node form when it names a node protocol (the tests register
    :mod:`adapters.fake` like this)."""
    _LOCAL[entry.name] = entry
    _derive()


def unregister(name: str) -> None:
    _LOCAL.pop(name, None)
    _derive()


def _derive() -> None:
    _ENTRIES.clear()
    _ENTRIES.update(_LOCAL)
    _ENTRIES.update({e.on_node().name: e.on_node() for e in _LOCAL.values() if e.node})
    _READERS.clear()


register(
    Entry(
        name="claude",
        module="adapters.claude",
        node="adapters.claude_node",
        upstream_kind="claude-cli",
        catalog_id="claude",
        root_key="claude",
        root_default="~/.claude/projects",
        root_env=(("CLAUDE_CONFIG_DIR", "projects"),),
    )
)
register(
    Entry(
        name="codex",
        module="adapters.codex",
        node="adapters.jsonl_node",
        upstream_kind="codex-rollout",
        catalog_id="codex",
        root_key="codex",
        root_default="~/.codex/sessions",
        root_env=(("CODEX_HOME", "sessions"),),
    )
)
register(
    Entry(  # written by the gateway only; read from the ``codex`` root's rollouts
        name="codex-app-server",
        module="adapters.codex_app_server",
        upstream_kind="codex-app-server",
        catalog_id="codex",
        adoptable=False,
    )
)
register(
    Entry(
        name="pi",
        module="adapters.pi",
        node="adapters.jsonl_node",
        upstream_kind="pi-cli",
        catalog_id="pi",
        root_key="pi",
        root_default="~/.pi/agent/sessions",
        root_env=(("PI_CODING_AGENT_SESSION_DIR", ""), ("PI_CODING_AGENT_DIR", "sessions")),
    )
)
register(
    Entry(
        name="opencode",
        module="adapters.opencode",
        node="adapters.opencode_node",
        upstream_kind="opencode-cli",
        catalog_id="opencode",
        form="database",
        root_key="opencode_db",  # its root is its database file
        root_default="~/.local/share/opencode/opencode.db",
        root_env=(("XDG_DATA_HOME", "opencode/opencode.db"),),
    )
)


def adoptable_names() -> tuple[str, ...]:
    """The kinds a person (or the gateway through the API) adopts a source of here."""
    return tuple(name for name, e in _ENTRIES.items() if e.adoptable)


def node_served() -> tuple[str, ...]:
    """The local formats a node serves: those whose entry names a node protocol."""
    return tuple(e.name for e in _LOCAL.values() if e.node)


def root_keys() -> dict[str, Entry]:
    """The ``[roots]`` keys, and the format each names."""
    return {e.root_key: e for e in _ENTRIES.values() if e.root_key}


def roots_of(given: Mapping[str, str]) -> dict[str, str]:
    """Each format's root, by format name (unexpanded): see :func:`roots_with_origin`."""
    return {name: path for name, (path, _) in roots_with_origin(given).items()}


def roots_with_origin(
    given: Mapping[str, str], env: Mapping[str, str] | None = None
) -> dict[str, tuple[str, str]]:
    """Each format's root, by format name (unexpanded), and where it came from: what
    ``[roots]`` gives under the format's key (``[roots] KEY``), else where the harness's
    own variable puts it (``$VAR``, as the harness itself reads it), else its default
    (``default``). A key no format registers is a :class:`BadInput` naming the known keys
    and the nearest one."""
    keys = root_keys()
    for key in given:
        if key not in keys:
            known = ", ".join(sorted(keys))
            raise BadInput(f"unknown key [roots] {key} (known: {known}){did_you_mean(key, keys)}")
    environ = os.environ if env is None else env
    found: dict[str, tuple[str, str]] = {}
    for key, e in keys.items():
        if key in given:
            found[e.name] = (given[key], f"[roots] {key}")
            continue
        found[e.name] = (e.root_default, "default")
        for var, below in e.root_env:
            value = environ.get(var, "")
            if value:  # as the harnesses read them: set and not empty
                found[e.name] = (os.path.join(value, below) if below else value, f"${var}")
                break
    return found


def names() -> tuple[str, ...]:
    return tuple(_ENTRIES)


def entry(name: str) -> Entry:
    """The format named ``name``; an unknown one is a :class:`BadInput` naming the known."""
    found = _ENTRIES.get(name)
    if found is None:
        known = ", ".join(_ENTRIES)
        raise BadInput(
            f'unknown upstream kind "{name}" (known: {known}){did_you_mean(name, _ENTRIES)}'
        )
    return found


def build_adapters(settings: Settings) -> dict[str, Adapter]:
    """Every registered format's adapter."""
    return {name: e.build(settings) for name, e in _ENTRIES.items()}


def host_id_for(name: str, ref: dict[str, Any], host: str = LOCAL_HOST) -> str:
    """OpenClaw's host id of a source: the sidecar's host (``gateway:<host>``, so
    ``gateway:local`` for a single one), or the paired node it lives on."""
    if entry(name).remote:
        return f"{NODE_HOST_PREFIX}{ref.get('nodeId', '')}"
    return f"{GATEWAY_HOST_PREFIX}{host}"


def adapter_for_link(upstream_kind: str, host_id: str | None, ref: dict[str, Any]) -> str | None:
    """Which of our adapters reads a link row; None for a kind we do not read (foreign)."""
    on_node = (host_id or "").startswith(NODE_HOST_PREFIX) or (
        "nodeId" in ref and "filePath" not in ref
    )
    if not _READERS:  # built on first use, and again after a registration
        _READERS.update({(e.upstream_kind, e.remote): e.name for e in reversed(_ENTRIES.values())})
    return _READERS.get((upstream_kind, on_node))
