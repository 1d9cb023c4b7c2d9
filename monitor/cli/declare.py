"""How a command is declared.

A command is one declaration at its handler (:func:`command`): its help, its arguments as
argparse's ``add_argument`` takes them, what its handler needs. ``main`` runs each the
same way (:mod:`monitor.cli`); :mod:`monitor.cli.argv` and :mod:`monitor.cli.parser` read a
command line from the declarations.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import SimpleNamespace

import orjson

from monitor.config import Config, is_pg_url
from monitor.errors import BadInput
from monitor.kernel.events import MAX_INT64
from monitor.paths import expand_user
from monitor.records import NamedTuple

# The parsed command line: what argparse makes, or monitor.cli.argv when every word is plain.
Args = SimpleNamespace

TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path
    from typing import Any, NoReturn, TypeVar

    from monitor.kernel import Kernel

    KernelHandler = Callable[[Kernel, Args], Awaitable[dict[str, Any]]]
    ConfigHandler = Callable[[Args], int]  # prints itself; the exit code
    Done = Callable[[dict[str, Any], Args], int]  # prints the answer; the exit code
    H = TypeVar("H", KernelHandler, ConfigHandler)
    Argument = tuple[tuple[str, ...], dict[str, Any]]


def db_target(args: Args, config: Config) -> str:
    """``--db``, else ``$SESSIONWATCH_DB``, else ``[store] url``, else ``[store] path``,
    else OpenClaw's own state database when an install is found next to this user, else the
    default path: a SQLite file's path (``~`` expanded), or a ``postgresql://`` URL (kept as
    it is)."""
    if args.db is not None and not args.db.strip():  # an empty variable: not the default
        raise BadInput("--db is empty: name a SQLite file or a postgresql:// URL")
    chosen = args.db or os.environ.get("SESSIONWATCH_DB") or config.store.url
    if not chosen and config.store.path == Config().store.path:
        from monitor.openclaw.home import found_state_db  # next to OpenClaw: its database

        found = found_state_db()
        if found is not None:
            return found[0]
    chosen = str(chosen or config.store.path)
    return chosen if is_pg_url(chosen) else expand_user(chosen)


def db_path(args: Args, config: Config) -> Path | str:
    """:func:`db_target`, a SQLite file as a ``Path`` (what the service's start-up checks
    take): the kernel's commands open the text itself."""
    target = db_target(args, config)
    if is_pg_url(target):
        return target
    from pathlib import Path

    return Path(target)


def epoch_ms(raw: str) -> int:
    """A time in ms since the epoch, up to the last millisecond of the year 9999 (what the
    API takes)."""
    from monitor.kernel.drafts import LAST_MS

    value = non_negative(raw)
    if value > LAST_MS:
        _refuse(f"must be at most {LAST_MS} (the year 9999): {raw}")
    return value


def non_negative(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        _refuse(f"not an integer: {raw!r}")
    if value < 0:
        _refuse(f"must not be negative: {raw}")
    if value > MAX_INT64:
        _refuse(f"must be at most {MAX_INT64}: {raw}")
    return value


def positive(raw: str) -> int:
    value = non_negative(raw)
    if value == 0:
        _refuse("must be positive: 0")
    return value


def path_arg(raw: str) -> Path:
    """A path option (``node --token-file``): pathlib loads only for the command given one."""
    from pathlib import Path

    return Path(raw)


def _refuse(message: str) -> NoReturn:
    """An argument's type refuses it: argparse says so, in the command's usage line."""
    import argparse

    raise argparse.ArgumentTypeError(message)


class Kinds:
    """The registered upstream kinds a source is adopted, listed or replayed by, as argparse
    ``choices``: the registry is imported only when a command checks or lists them."""

    @staticmethod
    def _names() -> tuple[str, ...]:
        from adapters.registry import adoptable_names

        return adoptable_names()

    def __contains__(self, value: object) -> bool:
        return value in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())


DESCRIPTION = "The sessionwatch command line."


def arg(*flags: str, **options: Any) -> Argument:
    """One argument of a command, as ``argparse``'s ``add_argument`` takes it."""
    return flags, options


class Command(NamedTuple):  # a NamedTuple: a dataclass costs every command's start-up
    """A command, declared once: its help and arguments; its handler and what the handler
    needs (``kernel``: it is handed the kernel and answers the JSON object printed; ``config``:
    it is handed the parsed arguments, with the configuration, and prints itself); how its
    answer ends the run (``done``: printing it and choosing the exit code); whether it needs
    an event loop; whether it reads ``[roots]``; whether it only reads the database; and
    whether a ``config`` handler runs to its end on the calling thread (``alone``: the run
    then ends without the interpreter's teardown, as a kernel command's on SQLite does)."""

    help: str
    arguments: tuple[Argument, ...]
    handler: KernelHandler | ConfigHandler
    needs: str = "kernel"  # or "config"
    done: Done | None = None  # default: print the answer as one JSON line, exit 0
    loop: bool = False  # the monitor reads files in threads, asks nodes over HTTP
    roots: bool = False  # its [roots] keys are checked against the registry first
    # it only reads the database (given its arguments): a SQLite file that does not exist
    # is refused, never created; "scratch": it runs on an empty one it removes afterwards
    reads: bool | str | Callable[[Args], bool] = False
    alone: bool = False
    about: str = ""  # what --help says beyond the one line: where it reads and writes


COMMANDS: dict[str, Command] = {}


def command(
    name: str,
    help: str,
    *arguments: Argument,
    needs: str = "kernel",
    done: Done | None = None,
    loop: bool = False,
    roots: bool = False,
    reads: bool | str | Callable[[Args], bool] = False,
    alone: bool = False,
    about: str = "",
) -> Callable[[H], H]:
    """Declare the command its handler is: ``needs`` says what the handler is handed."""

    def register(fn: H) -> H:
        COMMANDS[name] = Command(help, arguments, fn, needs, done, loop, roots, reads, alone, about)
        return fn

    return register


def db_origin(args: Args, config: Config) -> str:
    """What chose the database: the flag, the variable, the configuration or the default."""
    if args.db:
        return "--db"
    if os.environ.get("SESSIONWATCH_DB"):
        return "$SESSIONWATCH_DB"
    if config.store.url:
        return "[store] url"
    if config.store.path != Config().store.path:
        return "[store] path"
    from monitor.openclaw.home import found_state_db

    found = found_state_db()
    return "the default [store] path" if found is None else found[1]


def parse_json_arg(name: str, raw: str | None) -> Any:
    if raw is None:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"{name} is not valid JSON: {exc}") from None


# The options before the command, as every command takes them.
GLOBALS: tuple[Argument, ...] = (
    arg("--db", help="state database: a SQLite file or a postgresql:// URL"),
    arg("--config", help="TOML configuration ($SESSIONWATCH_CONFIG)"),
    arg(
        "--log-format",
        choices=("plain", "json"),
        default="plain",
        help="serve and node: the log as text lines or one JSON object a line",
    ),
)
