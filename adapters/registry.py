"""The explicit registry of upstream adapters: a new format is one module and one line.

It also holds the one map between our adapter names (``claude``, ``codex``, ``pi``,
``opencode``, ``claude-node``: what the CLI and the API take) and the values a link row
carries in OpenClaw's vocabulary (``upstream_kind``, ``catalog_id``, ``host_id``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapters.base import Adapter
from adapters.claude_node import ClaudeNodeAdapter, Node
from adapters.jsonl import FORMATS
from adapters.jsonl_check import DEFAULT_MAX_LINE, JsonlAdapter
from adapters.opencode import OpenCodeAdapter

LOCAL_HOST_ID = "gateway:local"  # OpenClaw's CLAUDE_LOCAL_SESSION_HOST_ID
NODE_HOST_PREFIX = "node:"


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkVocabulary:
    """How links of one adapter are written: OpenClaw's kind and catalog id for it."""

    upstream_kind: str
    catalog_id: str
    remote: bool = False  # the host is ``node:<nodeId>`` from the ref, not this machine


VOCABULARY = {
    "claude": LinkVocabulary(upstream_kind="claude-cli", catalog_id="claude"),
    "codex": LinkVocabulary(upstream_kind="codex-rollout", catalog_id="codex"),
    "pi": LinkVocabulary(upstream_kind="pi-cli", catalog_id="pi"),
    "opencode": LinkVocabulary(upstream_kind="opencode-cli", catalog_id="opencode"),
    "claude-node": LinkVocabulary(upstream_kind="claude-cli", catalog_id="claude", remote=True),
}
ADAPTER_NAMES = tuple(VOCABULARY)


def host_id_for(name: str, ref: dict[str, Any]) -> str:
    """OpenClaw's host id of a source: this machine, or the paired node it lives on."""
    if VOCABULARY[name].remote:
        return f"{NODE_HOST_PREFIX}{ref.get('nodeId', '')}"
    return LOCAL_HOST_ID


_BY_KIND: dict[str, dict[bool, str]] = {}
for _name, _vocab in VOCABULARY.items():
    _BY_KIND.setdefault(_vocab.upstream_kind, {})[_vocab.remote] = _name


def adapter_for_link(upstream_kind: str, host_id: str | None, ref: dict[str, Any]) -> str | None:
    """Which of our adapters reads a link row; None for a kind we do not read (foreign)."""
    names = _BY_KIND.get(upstream_kind)
    if names is None:
        return None
    on_node = (host_id or "").startswith(NODE_HOST_PREFIX) or (
        "nodeId" in ref and "filePath" not in ref
    )
    return names.get(on_node)


def build_adapters(
    *,
    scan_cap: int,
    export_concurrency: int = 4,
    replay_lookback: int = 50,
    nodes: dict[str, Node] | None = None,
    node_pages: int = 4,
    opencode_db: str = "",
    roots: dict[str, str] | None = None,
    max_line: int = DEFAULT_MAX_LINE,
) -> dict[str, Adapter]:
    """Every adapter; file adapters read only under their kind's root in ``roots``."""
    root = roots or {}

    def jsonl(kind: str) -> JsonlAdapter:
        fmt = FORMATS[kind]
        return JsonlAdapter(fmt, scan_cap=scan_cap, max_line=max_line, root=root.get(kind, ""))

    return {
        "claude": jsonl("claude"),
        "codex": jsonl("codex"),
        "pi": jsonl("pi"),
        "opencode": OpenCodeAdapter(
            concurrency=export_concurrency, lookback=replay_lookback, default_db=opencode_db
        ),
        "claude-node": ClaudeNodeAdapter(nodes or {}, pages=node_pages),
    }
