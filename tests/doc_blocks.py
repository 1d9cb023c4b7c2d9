"""The docs' shell blocks, each named for the test that runs it.

Every fenced ``sh`` block of README.md and docs/*.md is meant to be run as written (a block
with placeholders is fenced ``text``). A test takes its block by name from here
(:func:`doc_block`, :func:`doc_blocks`), and tests/test_docs.py holds every block to
being named exactly once, and every name to being taken by a test.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from tests.helpers import REPO

SH = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)


class Block(NamedTuple):
    doc: str  # relative to the repository
    line: int  # where its text starts
    text: str


def sh_blocks() -> list[Block]:
    """Every ``sh`` block of the README and the docs, in order."""
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text()
        for match in SH.finditer(text):
            line = text.count("\n", 0, match.start(1)) + 1
            found.append(Block(str(path.relative_to(REPO)), line, match.group(1)))
    return found


def _has(text: str) -> Callable[[str], bool]:
    return lambda block: text in block


def _curl(block: str) -> bool:
    return block.startswith("curl") and "/notices/stream" not in block


# name: (the doc, which of its blocks); run by the test that calls doc_block(s) with it
NAMED: dict[str, tuple[str, Callable[[str], bool]]] = {
    # the README's two commands for a fresh machine: the first run by
    # tests/test_fresh_machine.py, the second by .ci/run itself (held to it in test_docs)
    "fresh-machine": ("README.md", _has(".venv/bin/sessionwatch serve\n")),
    "install-and-serve": ("docs/operator-guide.md", _has(".venv/bin/sessionwatch serve\n")),
    "walkthrough": ("README.md", _has("D=$(mktemp -d)")),
    "commands": ("README.md", _has("sessionwatch spawn --parent")),
    "open": ("docs/operator-guide.md", _has("sessionwatch open")),
    "node": ("docs/operator-guide.md", _has('sessionwatch --config "$NODE_CONFIG" node')),
    "setup-differs": ("docs/gateway-integration.md", _has("SESSIONWATCH_CONFIG")),
    "address-and-token": ("docs/gateway-integration.md", _has("export TOKEN=")),
    "curl": ("docs/gateway-integration.md", _curl),
    "stream": ("docs/gateway-integration.md", _has("/notices/stream")),
}


def doc_blocks(name: str) -> list[str]:
    """The blocks ``name`` takes, in order (at least one)."""
    doc, takes = NAMED[name]
    found = [b.text for b in sh_blocks() if b.doc == doc and takes(b.text)]
    assert found, f"no sh block of {doc} for {name!r}"
    return found


def doc_block(name: str) -> str:
    """The one block ``name`` takes."""
    [found] = doc_blocks(name)
    return found
