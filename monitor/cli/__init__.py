"""The ``sessionwatch`` command line.

Every command prints one JSON object on stdout and exits 0; bad input exits 2 with a one-line
message on stderr and writes nothing; a database that cannot be used exits 1.

A command imports only what it runs: the kernel's one-shot commands (``record``, ``status``,
``notices``...) run on the calling thread over plain ``sqlite3`` (:class:`DirectStore`),
without asyncio; the upstream monitor, the catalog, ``serve`` and ``node`` bring in their
own modules when they are the command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, cast

import orjson

from monitor.cli import kernel_commands, process_commands  # noqa: F401  (they declare)
from monitor.cli.declare import (
    COMMANDS,
    ConfigHandler,
    KernelHandler,
    build_parser,
    command_of,
    db_origin,
    db_path,
)
from monitor.cli.kernel_commands import printed
from monitor.config import Config, load_config
from monitor.errors import BadInput, ConfigError, SessionwatchError, one_line
from monitor.kernel.store.sqlite_conn import run_now

__all__ = ["COMMANDS", "build_parser", "db_path", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run one command: exit 0, 2 for bad input (nothing written), 1 for a database or
    anything else that cannot be used, 130 when interrupted; or what the command says."""
    given = sys.argv[1:] if argv is None else argv
    try:
        _check_utf8(given)
        args = build_parser(command_of(given)).parse_args(given)
        try:
            args.config_obj = load_config(args.config)
        except ConfigError as exc:  # a bad configuration file is bad input: exit 2
            raise BadInput(str(exc)) from None
        declared = COMMANDS[args.command]
        if declared.roots:  # its [roots] keys are the formats' own
            from adapters.registry import roots_of

            roots_of(args.config_obj.roots.given)
        if declared.needs == "config":
            return cast(ConfigHandler, declared.handler)(args)
        answer = _run_command(args)
    except BadInput as exc:
        _say_fatal(str(exc), given)
        return 2
    except SessionwatchError as exc:
        _say_fatal(str(exc), given)
        return 1
    except KeyboardInterrupt:
        return 130
    return (declared.done or _printed)(answer, args)


def _printed(answer: dict[str, Any], args: argparse.Namespace) -> int:
    return printed(answer)


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from monitor.kernel import Kernel, KernelSettings  # not for replay, config, serve, node

    handler = cast(KernelHandler, COMMANDS[args.command].handler)  # main ran the others
    config: Config = args.config_obj
    target = db_path(args, config)
    reads = COMMANDS[args.command].reads
    only_reads = reads(args) if callable(reads) else bool(reads)
    scratch = None
    if only_reads and isinstance(target, Path) and not target.exists():
        if reads != "scratch":
            raise BadInput(
                f"no state database at {target} (chosen by {db_origin(args, config)});"
                f" {args.command} only reads, and creates none: check the path, or start"
                " serve, which creates it"
            )
        import tempfile

        scratch = tempfile.TemporaryDirectory(prefix="sessionwatch-")
        target = Path(scratch.name) / "state.db"  # nothing adopted yet: an empty one
    try:
        kernel = await Kernel.open(
            target, KernelSettings.of(config), direct=True, on_delete=(_unlink,)
        )
        try:
            return await handler(kernel, args)
        finally:
            await kernel.close()
    finally:
        if scratch is not None:
            scratch.cleanup()


def _unlink(conn: Any, scope: str, params: tuple[str, ...]) -> int:
    """A deleted session's links go too; the upstream module loads only when one is deleted."""
    from monitor.upstream.links import delete_links

    return delete_links(conn, scope, params)


def _run_command(args: argparse.Namespace) -> dict[str, Any]:
    # PostgreSQL is reached over the network: its store needs an event loop
    if COMMANDS[args.command].loop or isinstance(db_path(args, args.config_obj), str):
        import asyncio

        return asyncio.run(_run(args))
    return run_now(_run(args))


def _check_utf8(argv: list[str]) -> None:
    """Arguments that are not valid UTF-8 reach Python as lone surrogates: refuse them."""
    for i, arg in enumerate(argv, 1):
        if any("\udc80" <= ch <= "\udcff" for ch in arg):
            raise BadInput(f"argument {i} is not valid UTF-8")


def _say_fatal(message: str, argv: list[str]) -> None:
    """The one line a failed command ends with, on stderr: as the log's JSON lines when
    ``--log-format json`` was asked for (a fatal start-up error of ``serve`` included)."""
    text = one_line(message, 2000)
    wants_json = "--log-format=json" in argv or any(
        argv[i : i + 2] == ["--log-format", "json"] for i in range(len(argv) - 1)
    )
    if wants_json:
        import time

        line = {"ts": time.time(), "level": "ERROR", "logger": "sessionwatch", "message": text}
        sys.stderr.write(orjson.dumps(line).decode() + "\n")
    else:
        print(f"sessionwatch: {text}", file=sys.stderr)
