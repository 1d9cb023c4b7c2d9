"""argparse's parser of the declared commands: it reads every command line that
:mod:`monitor.cli.argv` leaves to it, and explains, in one line, what is wrong with one."""

from __future__ import annotations

import argparse
import os

from monitor.cli.declare import COMMANDS, DESCRIPTION, GLOBALS
from monitor.errors import BadInput

TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any, NoReturn


class Formatter(argparse.HelpFormatter):
    """argparse's formatter with a fixed width: asking the terminal imports ``shutil``."""

    def __init__(self, prog: str) -> None:
        columns = os.environ.get("COLUMNS", "")
        super().__init__(prog, width=int(columns) - 2 if columns.isdigit() else 98)


class Parser(argparse.ArgumentParser):
    command: str | None = None  # the top parser's: the command the line names, if any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """One line: what is wrong, then the command's usage (flattened)."""
        usage = " ".join(self.format_usage().split())
        # argparse leaves words it did not take to the top parser: the command is ours to say
        command = self.prog.removeprefix("sessionwatch").strip() or self.command
        name = command or "usage"
        misplaced = [f for flags, _ in GLOBALS for f in flags if f in message.split()]
        if message.startswith("unrecognized arguments") and misplaced:
            message += (
                f" ({', '.join(misplaced)} is an option of sessionwatch itself: it goes before"
                f" the command, as in sessionwatch {misplaced[0]} VALUE {command or 'COMMAND'}"
                " ...)"
            )
        raise BadInput(f"{name}: {message}; {usage}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of the ``only`` one."""
    p = Parser(prog="sessionwatch", description=DESCRIPTION)
    p.command = only
    from monitor import __version__

    p.add_argument("--version", action="version", version=f"sessionwatch {__version__}")
    for flags, options in GLOBALS:
        p.add_argument(*flags, **options)
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, declared in COMMANDS.items():
        # only the command this run names: argparse's parsers cost about a millisecond
        # each to build
        if only in (None, name):
            parser = sub.add_parser(
                name,
                help=declared.help,
                description=declared.help + (f"\n\n{declared.about}" if declared.about else ""),
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
            for flags, options in declared.arguments:
                parser.add_argument(*flags, **options)
    return p


def command_of(argv: list[str]) -> str | None:
    """The command named in ``argv``, when it is one (else the whole parser is built, to
    explain what is wrong)."""
    with_value = {flags[0] for flags, options in GLOBALS if options.get("action") is None}
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in with_value:
            skip = True
        elif not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None
