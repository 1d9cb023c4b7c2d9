"""How a command is declared, and the parser built from the declarations.

A command is one declaration at its handler (:func:`command`); ``main`` runs each the same
way (:mod:`monitor.cli`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, TypeVar

import orjson

from monitor.config import Config, is_pg_url
from monitor.errors import BadInput
from monitor.kernel.events import MAX_INT64
from monitor.paths import expand_user

if TYPE_CHECKING:
    from monitor.kernel import Kernel


KernelHandler = Callable[["Kernel", argparse.Namespace], Awaitable[dict[str, Any]]]
ConfigHandler = Callable[[argparse.Namespace], int]  # prints itself; the exit code
Done = Callable[[dict[str, Any], argparse.Namespace], int]  # prints the answer; the exit code
H = TypeVar("H", KernelHandler, ConfigHandler)


def db_path(args: argparse.Namespace, config: Config) -> Path | str:
    """``--db``, else ``$SESSIONWATCH_DB``, else ``[store] url``, else ``[store] path``,
    else OpenClaw's own state database when an install is found next to this user, else the
    default path: a SQLite file, or a ``postgresql://`` URL (kept as it is)."""
    chosen = args.db or os.environ.get("SESSIONWATCH_DB") or config.store.url
    if not chosen and config.store.path == Config().store.path:
        from monitor.openclaw import locate  # next to OpenClaw, its database is the store

        install = locate()
        if install.db.is_file():
            return install.db
    chosen = str(chosen or config.store.path)
    if is_pg_url(chosen):
        return chosen
    return Path(expand_user(chosen))


class Formatter(argparse.HelpFormatter):
    """argparse's formatter with a fixed width: asking the terminal imports ``shutil``,
    which costs a one-shot command a tenth of its start-up."""

    def __init__(self, prog: str) -> None:
        columns = os.environ.get("COLUMNS", "")
        super().__init__(prog, width=int(columns) - 2 if columns.isdigit() else 98)


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """One line: what is wrong, then the command's usage (flattened)."""
        usage = " ".join(self.format_usage().split())
        name = self.prog.removeprefix("sessionwatch").strip() or "usage"
        raise BadInput(f"{name}: {message}; {usage}")


def non_negative(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {raw!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {raw}")
    if value > MAX_INT64:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_INT64}: {raw}")
    return value


def positive(raw: str) -> int:
    value = non_negative(raw)
    if value == 0:
        raise argparse.ArgumentTypeError("must be positive: 0")
    return value


class Kinds:
    """The registered upstream kinds, as argparse ``choices``: the registry is imported only
    when a command checks or lists them."""

    @staticmethod
    def _names() -> tuple[str, ...]:
        from adapters.registry import names

        return names()

    def __contains__(self, value: object) -> bool:
        return value in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())


DESCRIPTION = "The sessionwatch command line."

Argument = tuple[tuple[str, ...], dict[str, Any]]


def arg(*flags: str, **options: Any) -> Argument:
    """One argument of a command, as ``argparse``'s ``add_argument`` takes it."""
    return flags, options


class Command(NamedTuple):  # a NamedTuple: a dataclass costs every command's start-up
    """A command, declared once: its help and arguments; its handler and what the handler
    needs (``kernel``: it is handed the kernel and answers the JSON object printed; ``config``:
    it is handed the parsed arguments, with the configuration, and prints itself); how its
    answer ends the run (``done``: printing it and choosing the exit code); whether it needs
    an event loop; whether it reads ``[roots]``; and whether it only reads the database."""

    help: str
    arguments: tuple[Argument, ...]
    handler: KernelHandler | ConfigHandler
    needs: str = "kernel"  # or "config"
    done: Done | None = None  # default: print the answer as one JSON line, exit 0
    loop: bool = False  # the monitor reads files in threads, asks nodes over HTTP
    roots: bool = False  # its [roots] keys are checked against the registry first
    # it only reads the database (given its arguments): a SQLite file that does not exist
    # is refused, never created; "scratch": it runs on an empty one it removes afterwards
    reads: bool | str | Callable[[argparse.Namespace], bool] = False


COMMANDS: dict[str, Command] = {}


def command(
    name: str,
    help: str,
    *arguments: Argument,
    needs: str = "kernel",
    done: Done | None = None,
    loop: bool = False,
    roots: bool = False,
    reads: bool | str | Callable[[argparse.Namespace], bool] = False,
) -> Callable[[H], H]:
    """Declare the command its handler is: ``needs`` says what the handler is handed."""

    def register(fn: H) -> H:
        COMMANDS[name] = Command(help, arguments, fn, needs, done, loop, roots, reads)
        return fn

    return register


def db_origin(args: argparse.Namespace, config: Config) -> str:
    """What chose the database: the flag, the variable, the configuration or the default."""
    if args.db:
        return "--db"
    if os.environ.get("SESSIONWATCH_DB"):
        return "$SESSIONWATCH_DB"
    if config.store.url:
        return "[store] url"
    if config.store.path != Config().store.path:
        return "[store] path"
    from monitor.openclaw import locate

    install = locate()
    if install.db.is_file():
        return f"OpenClaw's state directory {install.state_dir} ({install.found_by})"
    return "the default [store] path"


def parse_json_arg(name: str, raw: str | None) -> Any:
    if raw is None:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"{name} is not valid JSON: {exc}") from None


GLOBAL_WITH_VALUE = frozenset({"--db", "--config", "--log-format"})


def command_of(argv: list[str]) -> str | None:
    """The command named in ``argv``, when it is one (else the whole parser is built, to
    explain what is wrong)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in GLOBAL_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of the ``only`` one."""
    p = Parser(prog="sessionwatch", description=DESCRIPTION)
    p.add_argument("--db", help="state database: a SQLite file or a postgresql:// URL")
    p.add_argument("--config", type=Path, help="TOML configuration ($SESSIONWATCH_CONFIG)")
    p.add_argument(
        "--log-format",
        choices=["plain", "json"],
        default="plain",
        help="serve and node: the log as text lines or one JSON object a line",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, declared in COMMANDS.items():
        # only the command this run names: argparse's parsers cost about a millisecond
        # each to build, most of a one-shot command's start-up
        if only in (None, name):
            parser = sub.add_parser(name, help=declared.help)
            for flags, options in declared.arguments:
                parser.add_argument(*flags, **options)
    return p
