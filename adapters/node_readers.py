"""The node protocols the registry names (``Entry.node``) are what they must be: the type
checker checks these assignments. Nothing imports this module, so the registry names its
protocols by module path and imports none of them (no circle, even for the checker)."""

from __future__ import annotations

from adapters import claude_node, fake, jsonl_node, opencode_node
from adapters.base import NodeProtocol

CLAUDE: NodeProtocol = claude_node
FAKE: NodeProtocol = fake  # the scripted format the tests register with its node
JSONL: NodeProtocol = jsonl_node
OPENCODE: NodeProtocol = opencode_node
