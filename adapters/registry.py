"""The explicit registry of upstream adapters: a new format is one module and one line."""

from __future__ import annotations

from adapters.base import Adapter
from adapters.jsonl import FORMATS, JsonlAdapter


def build_adapters(*, scan_cap: int) -> dict[str, Adapter]:
    return {
        "claude": JsonlAdapter(FORMATS["claude"], scan_cap=scan_cap),
        "codex": JsonlAdapter(FORMATS["codex"], scan_cap=scan_cap),
        "pi": JsonlAdapter(FORMATS["pi"], scan_cap=scan_cap),
    }
