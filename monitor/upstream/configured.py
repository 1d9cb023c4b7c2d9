"""The configuration as the upstream parts take it, in one place: each format's root, the
paired nodes' addresses, the adapters' settings; and :class:`Adapters`, the one holder of
the adapters built from them, which a reload replaces whole.

The page, the reload, ``doctor`` and the node watch translate the configuration through
here, never by hand.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

from adapters.base import Adapter, NodeAddress, Settings
from adapters.registry import build_adapters, roots_of
from monitor.config import Config, NodeConfig, RootsConfig
from monitor.paths import expand_user


def root_paths(roots: RootsConfig) -> dict[str, Path]:
    """Each format's root, by format name, expanded (see :func:`registry.roots_of`)."""
    return {kind: Path(expand_user(path)) for kind, path in roots_of(roots.given).items()}


def node_address(node: NodeConfig) -> NodeAddress:
    """A ``[nodes.NAME]`` as the adapters take it (its pin as bare hex)."""
    pin = node.fingerprint.removeprefix("sha256:") or None
    return NodeAddress(url=node.url, token_file=node.token_file, fingerprint=pin)


def nodes_of(config: Config) -> dict[str, NodeAddress]:
    """The configuration's paired nodes, as the adapters take them."""
    return {name: node_address(node) for name, node in config.nodes.items()}


def adapter_settings(config: Config) -> Settings:
    """What the configuration tells the adapters."""
    m = config.monitor
    return Settings(
        roots={kind: str(path) for kind, path in root_paths(config.roots).items()},
        nodes=nodes_of(config),
        scan_cap=m.scan_cap_bytes,
        max_line=m.max_line_bytes,
        export_concurrency=m.export_concurrency,
        replay_lookback=m.replay_lookback,
        node_pages=m.node_pages,
    )


class Adapters(Mapping[str, Adapter]):
    """The adapters by format name, held by one part and read by the others at each use:
    :meth:`replace` puts a fresh set in whole (a tick in flight keeps the adapter it took)."""

    def __init__(self, adapters: Mapping[str, Adapter]) -> None:
        self._adapters = dict(adapters)

    @classmethod
    def of(cls, config: Config) -> Adapters:
        """Every registered format's adapter, as ``config`` sets them."""
        return cls(build_adapters(adapter_settings(config)))

    def replace(self, fresh: Mapping[str, Adapter]) -> None:
        self._adapters = dict(fresh)

    def __getitem__(self, name: str) -> Adapter:
        return self._adapters[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._adapters)

    def __len__(self) -> int:
        return len(self._adapters)
