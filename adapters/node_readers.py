"""The node readers the registry names (``Entry.node_reader``) are what they must be: the
type checker checks these assignments. Nothing imports this module, so the registry names
its readers by module path and imports none of them (no circle, even for the checker)."""

from __future__ import annotations

from adapters import jsonl_node, opencode_node
from adapters.base import DatabaseNodeReader, FileNodeReader

FILE_READER: FileNodeReader = jsonl_node
DATABASE_READER: DatabaseNodeReader = opencode_node
