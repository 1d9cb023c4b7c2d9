"""A JSONL format no harness writes, declared the way every JSONL format is: one module
with its ``FORMAT`` and ``build``. ``test_new_format.py`` adds it with one registry line and
one ``[roots]`` entry, touching no other file.

One record per line: ``{"role": "person" | "model", "id": ..., "text": ...}``; a person's
record is a direct human turn, a record of another role is drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapters.base import Adapter, Settings, Verdict, text_hash
from adapters.jsonl_format import JsonlFormat
from adapters.registry import Entry

ENTRY = Entry(
    name="lines",
    module="tests.upstream.lines_format",
    upstream_kind="lines-cli",
    catalog_id="lines",
    root_key="lines",
    root_default="~/.lines",
)


@dataclass
class LinesState:
    def to_marker(self) -> dict[str, Any]:
        return {}


def classify(record: dict[str, Any], state: LinesState) -> Verdict | None:
    role = record.get("role")
    if role == "person" and isinstance(record.get("text"), str):
        return Verdict(turn=text_hash(record["text"]))
    return None if role == "model" else Verdict(unknown_type=str(role))


def _text(record: dict[str, Any]) -> str:
    return str(record.get("text") or "")


FORMAT = JsonlFormat[LinesState](
    kind="lines",
    classify=classify,
    native_id=lambda record: record.get("id") if isinstance(record.get("id"), str) else None,
    state_from_marker=lambda marker: LinesState(),
    state_from_first=lambda record: LinesState(),
    prefilter=None,
    strict=False,
    tested_version="1",
    prompt_text=_text,
    thread_id=lambda stem: stem,
    describe=lambda first, head: (None, None),
)


def build(settings: Settings) -> Adapter:
    from adapters.jsonl_adapter import JsonlAdapter

    return JsonlAdapter(FORMAT, settings)
