"""The explicit registry of upstream adapters: a new format is one module and one line."""

from __future__ import annotations

from adapters.base import Adapter
from adapters.claude_node import ClaudeNodeAdapter, Node
from adapters.jsonl import FORMATS, JsonlAdapter
from adapters.opencode import OpenCodeAdapter


def build_adapters(
    *,
    scan_cap: int,
    export_concurrency: int = 4,
    replay_lookback: int = 50,
    nodes: dict[str, Node] | None = None,
    node_pages: int = 4,
) -> dict[str, Adapter]:
    return {
        "claude": JsonlAdapter(FORMATS["claude"], scan_cap=scan_cap),
        "codex": JsonlAdapter(FORMATS["codex"], scan_cap=scan_cap),
        "pi": JsonlAdapter(FORMATS["pi"], scan_cap=scan_cap),
        "opencode": OpenCodeAdapter(concurrency=export_concurrency, lookback=replay_lookback),
        "claude-node": ClaudeNodeAdapter(nodes or {}, pages=node_pages),
    }
