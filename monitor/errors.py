"""The exceptions sessionwatch raises.

::

    SessionwatchError
    ├── BadInput                 a request, CLI argument or value from outside is wrong (400)
    │   ├── NotFound (LookupError)   a named session, link or catalog entry does not exist (404)
    │   │   └── ItemGone         a node's thread no longer holds the item paged from
    │   └── OutsideRoots         a path outside the configured roots: never read (403)
    ├── Declined                 a source cannot be linked (its baseline cannot be trusted)
    ├── StoreError               the state database failed or cannot be used (503)
    │   ├── StoreUnavailable     it refuses every write for now (unreachable, full, read-only)
    │   ├── StoreLocked          another process held the write lock past the wait bound
    │   ├── SchemaTooNew         the database was written by a newer sessionwatch
    │   ├── NotPrivate           a database or token file others can read
    │   └── AlreadyRunning       another ``serve`` holds the database's instance lock
    ├── Unreachable              an upstream source did not answer (503)
    │   └── NodeError            a paired node (adapters/node_client.py)
    └── ConfigError              the configuration file is invalid

Inside the adapters, ``NodeError``, ``SourceBusy`` (a read of the same source is still
running) and ``NotRegularFile`` (an ``OSError``) never leave the tick: each becomes an
outcome with its reason (or, for a baseline, a ``Declined``). Inside delivery, the hooks
transport's ``CallFailed`` never leaves the hooks client: it is a failed wake, with its reason.

Third-party exceptions are translated at the boundary (``raise ... from exc``); the CLI and
the HTTP API turn ``BadInput`` into exit code 2 / a 4xx answer and never show a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


class SessionwatchError(Exception):
    """Root of every error sessionwatch raises on purpose."""


class BadInput(SessionwatchError):
    """Input from outside is invalid; nothing was changed."""


class NotFound(BadInput, LookupError):
    """A named thing does not exist."""


class OutsideRoots(BadInput):
    """A path names a file outside the configured roots: never read (403 in the API)."""


class ItemGone(NotFound):
    """The ``after`` item is no longer in the thread."""


class Declined(SessionwatchError):
    """The source cannot be linked (its baseline cannot be trusted); says why."""


class StoreError(SessionwatchError):
    """The state database failed or cannot be used."""


class StoreLocked(StoreError):
    """Another process held the database's write lock for longer than a write may wait."""


class StoreUnavailable(StoreError):
    """The store refuses every write for now: unreachable, full, read-only, failing I/O."""


class NotPrivate(StoreError):
    """A state file (database, token) is readable by group or others."""


class SchemaTooNew(StoreError):
    """The database carries a schema version newer than this sessionwatch understands."""


class Unreachable(SessionwatchError):
    """An upstream source (a paired node) did not answer."""


class ConfigError(SessionwatchError):
    """The configuration file is invalid."""


class AlreadyRunning(StoreError):
    """Another ``serve`` holds the database's instance lock."""


def did_you_mean(given: str, known: Iterable[str]) -> str:
    """``; did you mean X?`` naming the known word nearest ``given``, or nothing: the tail of
    a message that refuses an unknown key, section or kind."""
    import difflib  # only to explain a mistake

    found = difflib.get_close_matches(given, list(known), n=1)
    return f"; did you mean {found[0]}?" if found else ""


_CONTROL = r"[\x00-\x1f\x7f-\x9f]"  # compiled at first use (re caches it), not at start-up
_BREAKS = r"\s*[\r\n]+\s*"


def escaped(text: str) -> str:
    """``text`` safe to print to a terminal: control characters as ``\\xNN``."""
    if text.isascii() and text.isprintable():
        return text  # most text: no control character to look for
    return re.sub(_CONTROL, lambda m: f"\\x{ord(m.group()):02x}", text)


def one_line(text: str, limit: int = 300) -> str:
    """``text`` as one printable line of at most ``limit`` characters: line breaks become
    spaces, other control characters ``\\xNN``, and what is over the limit an ellipsis."""
    flat = escaped(re.sub(_BREAKS, " ", text.strip()))
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def connection_reason(exc: BaseException) -> str:
    """A failed outbound call in plain words: ``cannot connect to 127.0.0.1:9 (Connection
    refused)`` rather than aiohttp's ``Cannot connect to host 127.0.0.1:9 ssl:default
    [...]``. For the wake calls, doctor and the paired nodes alike."""
    import os

    import aiohttp  # only once a call has failed: the errors sit under one-shot commands

    if isinstance(exc, aiohttp.ClientConnectorError):
        err = exc.os_error  # its strerror is asyncio's "Connect call failed (...)"
        cause = os.strerror(err.errno) if err.errno else str(err)
        return f"cannot connect to {exc.host}:{exc.port} ({cause})"
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return str(exc) or type(exc).__name__
