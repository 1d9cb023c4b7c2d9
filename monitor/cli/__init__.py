"""The ``sessionwatch`` command line.

Every command prints one JSON object on stdout and exits 0; bad input exits 2 with a one-line
message on stderr and writes nothing; a database that cannot be used exits 1.

A command imports only what it runs: the kernel's one-shot commands (``record``, ``status``,
``notices``...) run on the calling thread over plain ``sqlite3`` (:class:`DirectStore`),
without asyncio; the upstream monitor, the catalog, ``serve`` and ``node`` bring in their
own modules when they are the command.
"""

from __future__ import annotations

import os
import sys

import orjson

from monitor.cli import kernel_commands, process_commands  # noqa: F401  (they declare)
from monitor.cli.argv import parse_plain
from monitor.cli.declare import COMMANDS, Args, db_origin, db_path, db_target
from monitor.cli.kernel_commands import printed
from monitor.config import is_pg_url, load_config
from monitor.errors import BadInput, ConfigError, SessionwatchError, one_line

TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any, NoReturn

    from monitor.cli.declare import ConfigHandler, KernelHandler
    from monitor.config import Config

__all__ = ["COMMANDS", "db_path", "main", "parse", "run"]


def main(argv: list[str] | None = None) -> int:
    """Run one command: exit 0, 2 for bad input (nothing written), 1 for a database or
    anything else that cannot be used, 130 when interrupted; or what the command says."""
    return _main(sys.argv[1:] if argv is None else argv)[0]


def run() -> NoReturn:
    """The ``sessionwatch`` entry point: :func:`main`, then the exit.

    A command that ran on the calling thread (a kernel command on SQLite: no event loop, its
    database closed; ``replay``), with no other thread alive, ends as soon as what it printed
    is flushed, without the interpreter's teardown of every module and object: about 6 ms,
    most of it orjson's, a tenth of such a command's whole run (and for ``replay``, the
    freeing of what it read). Anything else exits as Python does."""
    code, direct = _main(sys.argv[1:])
    threading = sys.modules.get("threading")
    if direct and (threading is None or threading.active_count() == 1):
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:  # a reader that went away: Python's own exit says so
            pass
        else:
            os._exit(code)
    sys.exit(code)


def _main(given: list[str]) -> tuple[int, bool]:
    """The exit code, and whether the command ran on the calling thread (run_now)."""
    direct = False
    _tolerant_streams()
    try:
        _check_utf8(given)
        args = parse(given)
        try:
            args.config_obj = load_config(args.config)
        except ConfigError as exc:  # a bad configuration file is bad input: exit 2
            raise BadInput(str(exc)) from None
        declared = COMMANDS[args.command]
        if declared.roots:  # its [roots] keys are the formats' own
            from adapters.registry import roots_of

            roots_of(args.config_obj.roots.given)
        if declared.needs == "config":
            config_handler: ConfigHandler = declared.handler  # type: ignore[assignment]
            return config_handler(args), declared.alone
        target = db_target(args, args.config_obj)  # found once: next to OpenClaw, stats
        # PostgreSQL is reached over the network: its store needs an event loop
        direct = not declared.loop and not is_pg_url(target)
        answer = _run_command(args, target, direct)
    except BadInput as exc:
        _say_fatal(str(exc), given)
        return 2, direct
    except SessionwatchError as exc:
        _say_fatal(str(exc), given)
        return 1, direct
    except KeyboardInterrupt:
        return 130, False
    return (declared.done or _printed)(answer, args), direct


def parse(argv: list[str]) -> Args:
    """The command line, as the commands declare it: read at once when every word is plain
    (:mod:`monitor.cli.argv`), else by argparse, which raises :class:`BadInput` for a wrong
    one and prints ``--help``."""
    plain = parse_plain(argv)
    if plain is not None:
        return plain
    from monitor.cli.parser import build_parser, command_of

    return build_parser(command_of(argv)).parse_args(argv, namespace=Args())


def _printed(answer: dict[str, Any], args: Args) -> int:
    return printed(answer)


async def _run(args: Args, target: str) -> dict[str, Any]:
    handler: KernelHandler = COMMANDS[args.command].handler  # type: ignore[assignment]
    config: Config = args.config_obj
    reads = COMMANDS[args.command].reads
    only_reads = reads(args) if callable(reads) else bool(reads)
    scratch = None
    if not is_pg_url(target) and not os.path.exists(target):
        _refuse_the_gateways_to_make(target, args.command, reads == "scratch")
    if only_reads and not is_pg_url(target) and not os.path.exists(target):
        if reads != "scratch":
            raise BadInput(
                f"no state database at {target} (chosen by {db_origin(args, config)});"
                f" {args.command} only reads, and creates none: check the path, or start"
                " serve, which creates it"
            )
        import tempfile

        scratch = tempfile.TemporaryDirectory(prefix="sessionwatch-")
        target = os.path.join(scratch.name, "state.db")  # nothing adopted yet: an empty one
    fresh = None
    if not only_reads and not is_pg_url(target) and not os.path.exists(target):
        fresh = NewDatabase(target)
    try:
        answer = await _on(handler, args, fresh.path if fresh else target, target)
        if fresh is not None and not fresh.publish():  # made meanwhile (a serve): write there
            answer = await _on(handler, args, target, target)
        return answer
    finally:
        if fresh is not None:
            fresh.discard()
        if scratch is not None:
            scratch.cleanup()


def _refuse_the_gateways_to_make(target: str, command: str, scratch: bool) -> None:
    """A command never makes the state database an OpenClaw install's gateway has yet to
    make (its first start): the gateway would not find its own schema there."""
    from monitor.openclaw.home import state_dir_of

    if scratch or state_dir_of(os.path.abspath(target)) is None:  # not in a gateway's place
        return
    from pathlib import Path

    from monitor.openclaw.files import awaited_state_db

    install = awaited_state_db(Path(target))
    if install is not None:
        raise BadInput(
            f"OpenClaw at {install.state_dir} has not made its state database {target} yet"
            f" (its gateway makes it at its first start): start the gateway, then run"
            f" {command} again; or name a database of sessionwatch's own with --db"
        )


async def _on(handler: KernelHandler, args: Args, path: str, named: str) -> dict[str, Any]:
    """The command on the database at ``path``, known as ``named``."""
    from monitor.kernel import Kernel, KernelSettings

    settings = KernelSettings.of(args.config_obj)._replace(database_name=named)
    kernel = await Kernel.open(path, settings, direct=True, on_delete=(_unlink,))
    try:
        return await handler(kernel, args)
    finally:
        await kernel.close()


class NewDatabase:
    """A write to a SQLite database that does not exist yet is made on a new file beside
    it, which takes its name only once the command succeeded (a hard link, which never
    replaces a database made meanwhile): a refused write, a typo in ``--db``, leaves
    neither a database nor the directories made for it behind."""

    def __init__(self, target: str) -> None:
        self.target = target
        directory = os.path.dirname(target) or "."
        self.made: list[str] = []  # the directories that open_path will create, innermost first
        at = os.path.normpath(directory)
        while not os.path.exists(at) and os.path.dirname(at) != at:
            self.made.append(at)
            at = os.path.dirname(at) or "."
        self.path = os.path.join(directory, f".{os.path.basename(target)}.new-{os.getpid()}")
        self.published = False

    def publish(self) -> bool:
        """Give the new database its name; False when a database took it meanwhile."""
        try:
            os.link(self.path, self.target)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: a rename, checked just before
            if os.path.exists(self.target):
                return False
            os.replace(self.path, self.target)
        self.published = True
        return True

    def discard(self) -> None:
        import contextlib

        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(OSError):
                os.unlink(self.path + suffix)
        if not self.published:
            for directory in self.made:
                with contextlib.suppress(OSError):
                    os.rmdir(directory)


def _unlink(conn: Any, scope: str, params: tuple[str, ...]) -> int:
    """A deleted session's links go too; the upstream module loads only when one is deleted."""
    from monitor.upstream.links import delete_links

    return delete_links(conn, scope, params)


def _run_command(args: Args, target: str, direct: bool) -> dict[str, Any]:
    """The kernel command on ``target``: on the calling thread when ``direct``, else in an
    event loop."""
    if direct:  # sqlite3 and the store load here: not for replay, config, serve or node
        from monitor.kernel.store.sqlite_conn import run_now

        return run_now(_run(args, target))
    import asyncio

    return asyncio.run(_run(args, target))


def _tolerant_streams() -> None:
    """Print on any locale: on a terminal that is not UTF-8 (Latin-1, say), what it cannot
    show is replaced (``?``), never a UnicodeEncodeError (a title's "…" killed catalog)."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if encoding not in ("utf8", "utf_8") and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")


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
