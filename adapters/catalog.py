"""The values of the catalog: what an adapter's ``catalog()`` answers (see adapters/base.py).

Apart from :mod:`adapters.base` so that a tick or a replay, which never lists sessions, does
not pay for them."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Literal


def id_digest(key: str) -> str:
    """The digest of a catalog id, of what names the source (see ``catalog_key``): what
    adoption by id matches a prefix of."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def shown_path(path: str) -> str:
    """A path as it can be shown and sent as JSON: bytes of a name that are not UTF-8
    (``surrogateescape``d on reading) as backslash escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def catalog_id(kind: str, key: str) -> str:
    """A catalog id: the kind and the digest of what names the source."""
    return f"{kind}:{id_digest(key)}"


@dataclass(frozen=True, kw_only=True, slots=True)
class CatalogEntry:
    """One adoptable native session. ``path`` and ``native_id`` are what ``resolve`` takes
    back (for a node, ``path`` is the node's name)."""

    catalog_id: str
    kind: str
    native_id: str
    path: str
    cwd: str | None
    title: str | None
    updated_at: int
    size: int
    size_unit: Literal["bytes", "messages"] = "bytes"
    prompt: str | None = None  # the first human prompt, for search; never in the answer
    session_key: str | None = None  # where the session is already adopted (the first key)
    also_keys: tuple[str, ...] = ()  # the other keys linked to it, when there are several
    node: str | None = None  # the paired node it lives on
    score: float | None = None  # the search's score, best first

    @property
    def short_id(self) -> str:
        """The first 8 hex digits of the id: what the table shows and ``adopt`` takes."""
        return self.digest[:8]

    @property
    def digest(self) -> str:
        """The id without its kind (:func:`id_digest`)."""
        return self.catalog_id.partition(":")[2]

    def as_json(self) -> dict[str, Any]:
        return {
            "catalogId": self.catalog_id,
            "kind": self.kind,
            "nativeId": self.native_id,
            "path": self.path,
            "cwd": self.cwd,
            "title": self.title,
            "updatedAt": self.updated_at,
            "size": self.size,
            "sessionKey": self.session_key,
            "sessionKeys": [self.session_key, *self.also_keys] if self.session_key else [],
            "node": self.node,
            "score": None if self.score is None else round(self.score, 1),
        }


@dataclass
class CatalogListing:
    entries: list[CatalogEntry] = field(default_factory=list)
    skipped: int = 0  # sessions that are not adoptable (sub-agent runs)
    errors: list[dict[str, str]] = field(default_factory=list)  # {path, reason}

    def extend(self, other: CatalogListing) -> None:
        """Add ``other``'s; an error already said (a node that refused every kind it
        serves) is said once."""
        self.entries += other.entries
        self.skipped += other.skipped
        self.errors += [e for e in other.errors if e not in self.errors]

    def as_json(self) -> dict[str, Any]:
        return {
            "sessions": [e.as_json() for e in self.entries],
            "skipped": self.skipped,
            "errors": self.errors,
        }
