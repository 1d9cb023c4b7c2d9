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
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

import orjson

from monitor.config import Config, is_pg_url, load_config, without_password
from monitor.errors import BadInput, ConfigError, SessionwatchError, one_line
from monitor.kernel.events import MAX_INT64, parse_actor, parse_kind
from monitor.kernel.store.sqlite_conn import run_now
from monitor.paths import expand_user
from monitor.web import wire

if TYPE_CHECKING:
    from monitor.kernel import Kernel
    from monitor.upstream import UpstreamMonitor


Handler = Callable[["Kernel", argparse.Namespace], Awaitable[dict[str, Any]]]


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


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter with a fixed width: asking the terminal imports ``shutil``,
    which costs a one-shot command a tenth of its start-up."""

    def __init__(self, prog: str) -> None:
        columns = os.environ.get("COLUMNS", "")
        super().__init__(prog, width=int(columns) - 2 if columns.isdigit() else 98)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """One line: what is wrong, then the command's usage (flattened)."""
        usage = " ".join(self.format_usage().split())
        name = self.prog.removeprefix("sessionwatch").strip() or "usage"
        raise BadInput(f"{name}: {message}; {usage}")


def _non_negative(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {raw!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {raw}")
    if value > MAX_INT64:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_INT64}: {raw}")
    return value


def _positive(raw: str) -> int:
    value = _non_negative(raw)
    if value == 0:
        raise argparse.ArgumentTypeError("must be positive: 0")
    return value


class _Kinds:
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


Argument = tuple[tuple[str, ...], dict[str, Any]]


def arg(*flags: str, **options: Any) -> Argument:
    """One argument of a command, as ``argparse``'s ``add_argument`` takes it."""
    return flags, options


class Command(NamedTuple):  # a NamedTuple: a dataclass costs every command's start-up
    """A command, declared once: its help and arguments, what runs it (None: ``main``
    itself), whether it needs an event loop and whether it reads ``[roots]``."""

    help: str
    arguments: tuple[Argument, ...]
    handler: Handler | None = None
    loop: bool = False  # the monitor reads files in threads, asks nodes over HTTP
    roots: bool = False  # its [roots] keys are checked against the registry first
    # it only reads the database (given its arguments): a SQLite file that does not exist
    # is refused, never created; "scratch": it runs on an empty one it removes afterwards
    reads: bool | str | Callable[[argparse.Namespace], bool] = False


COMMANDS: dict[str, Command] = {}


def declare(
    name: str, help: str, *arguments: Argument, loop: bool = False, roots: bool = False
) -> None:
    """A command ``main`` runs itself (``serve``, ``config``...)."""
    COMMANDS[name] = Command(help, arguments, loop=loop, roots=roots)


def command(
    name: str,
    help: str,
    *arguments: Argument,
    loop: bool = False,
    roots: bool = False,
    reads: bool | str | Callable[[argparse.Namespace], bool] = False,
) -> Callable[[Handler], Handler]:
    """A command run on the kernel by the handler it decorates."""

    def register(fn: Handler) -> Handler:
        COMMANDS[name] = Command(help, arguments, fn, loop=loop, roots=roots, reads=reads)
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


@command(
    "record",
    "record one state event",
    arg("--session", required=True, help="the session key the event is about"),
    arg("--kind", required=True, help="the event kind: human_direct_message, goal_changed, ..."),
    arg("--actor", required=True, help="who acted: human, agent or system"),
    arg("--agent", help="the agent id (default: the key's own, agent:<id>:...)"),
    arg("--actor-id", help="the acting session's key (an agent's own events wake no one)"),
    arg("--run-id", help="the run the event belongs to"),
    arg("--session-id", help="the gateway's session id"),
    arg("--summary", help="one of the kind's summary templates (never free text)"),
    arg("--dedupe-key", help="a second event with this key is the first one again"),
    arg("--payload", help='JSON: {"channel": ...}, {"turns": N}, {"outcome": ...}'),
    arg("--occurred-at", type=_non_negative, help="when, in ms since the epoch (default now)"),
)
async def _record(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    from monitor.kernel.signal_log import NewEvent

    result = await kernel.record(
        NewEvent(
            session_key=a.session,
            kind=parse_kind(a.kind),
            actor_type=parse_actor(a.actor),
            agent_id=a.agent,
            actor_id=a.actor_id,
            run_id=a.run_id,
            session_id=a.session_id,
            summary=a.summary,
            dedupe_key=a.dedupe_key,
            payload=parse_json_arg("--payload", a.payload),
            occurred_at=a.occurred_at,
        )
    )
    return wire.event_record(result.event, duplicate=result.duplicate)


@command(
    "spawn",
    "record child_spawned, seeding the parent's cursor",
    arg("--parent", required=True, help="the session that spawned (it watches the child)"),
    arg("--child", required=True, help="the spawned session's key"),
    arg("--run-id", required=True, help="the child's run id (one spawn per run)"),
)
async def _spawn(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    result = await kernel.spawn(parent=a.parent, child=a.child, run_id=a.run_id)
    return wire.event_record(result.event, duplicate=result.duplicate)


@command(
    "watch",
    "register a watcher on a target",
    arg("--watcher", required=True, help="the session told when the target changes"),
    arg("--target", required=True, help="the session watched"),
    arg("--store-path", help="the watcher's session store (default: the gateway's own)"),
    arg("--ambient", action="store_true", help="a group's ambient watch: queued, never woken"),
)
async def _watch(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    watched = await kernel.watch(
        watcher=a.watcher, target=a.target, store_path=a.store_path, ambient=a.ambient
    )
    if watched:
        return {"watched": True}
    return {
        "watched": False,
        "reason": kernel.why_not_watched(a.watcher, a.target, ambient=a.ambient),
    }


@command(
    "notices",
    "a watcher's pending notices",
    arg("--watcher", required=True, help="whose notices"),
    arg("--store-path", help="the watcher's session store (default: the gateway's own)"),
    arg("--drain", action="store_true", help="acknowledge what is returned (else a peek)"),
    arg("--follow", action="store_true", help="print each notice as it opens"),
    reads=lambda a: not a.drain,
)
async def _notices(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    if a.follow:
        if a.drain:
            raise BadInput("notices: --follow peeks; drain with a separate --drain call")
        await _follow(kernel, a)
    notices = await kernel.notices(watcher=a.watcher, store_path=a.store_path, drain=a.drain)
    return {"notices": [n.as_json() for n in notices]}


async def _follow(kernel: Kernel, a: argparse.Namespace) -> NoReturn:
    """Each notice as it opens, as a JSON line, until interrupted or until the reader of a
    pipe goes away (``... --follow | head -n 1`` ends when ``head`` does; see
    monitor.kernel.feed)."""
    import select

    from monitor.kernel.feed import POLL_S, NoticeFeed

    feed = NoticeFeed(kernel.store.version)
    reader_gone = select.poll()
    reader_gone.register(sys.stdout.fileno(), select.POLLERR)
    while True:
        if reader_gone.poll(0):
            raise SystemExit(0)
        if feed.changed():
            pending = await kernel.notices(watcher=a.watcher, store_path=a.store_path)
            for notice in feed.fresh([n.as_json() for n in pending]):
                sys.stdout.buffer.write(orjson.dumps(notice) + b"\n")
            sys.stdout.flush()
        await kernel.store.changed(POLL_S)  # SQLite: a sleep; PostgreSQL: its notification


@command(
    "status",
    "session_status, with changesSince on ask",
    arg("key", help="the session key"),
    arg("--agent", help="the agent id (default: the key's own, agent:<id>:...)"),
    arg("--changes-since", type=_non_negative, help="the events after this sequence"),
    reads=True,
)
async def _status(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    return wire.status(await kernel.status(a.key, agent_id=a.agent, changes_since=a.changes_since))


@command(
    "sessions",
    "state versions of sessions",
    arg("keys", nargs="*", help="session keys (default: every session with a head)"),
    reads=True,
)
async def _sessions(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    return {"sessions": wire.state_versions(await kernel.state_versions(a.keys))}


@command(
    "reset",
    "a session was reset: drop its cursors",
    arg("key", help="the session key"),
)
async def _reset(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    await kernel.reset(a.key)
    return {"ok": True}


@command(
    "delete",
    "a session was deleted: drop everything of it",
    arg("key", help="the session key"),
    arg("--agent", help="the agent id (default: the key's own, agent:<id>:...)"),
)
async def _delete(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    from monitor.kernel.keys import normalize_key, parse_agent_key

    if parse_agent_key(normalize_key(a.key)) is None and not a.agent:
        raise BadInput(
            f'"{a.key}" is a bare key, a session of every agent: name one with --agent'
            " (the API refuses bare keys the same way)"
        )
    await kernel.delete(a.key, agent_id=a.agent)
    return {"ok": True}


@command(
    "prune",
    "run retention now",
    arg("--now", type=_non_negative, help="the clock, in ms since the epoch"),
)
async def _prune(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    return wire.pruned(await kernel.prune(a.now))


@command(
    "session",
    "create or update a known gateway session",
    arg("key", help="the session key"),
    arg("--agent", help="the agent id (default: the key's own, agent:<id>:...)"),
    arg("--session-id", help="the gateway's session id"),
    arg("--store-path", help="the session's store (default: the gateway's own)"),
    arg("--run", choices=["active", "idle"], help="whether a run is active (its ticks wait)"),
)
async def _session(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    run_active = None if a.run is None else a.run == "active"
    row = await kernel.upsert_session(
        a.key,
        agent_id=a.agent,
        session_id=a.session_id,
        store_path=a.store_path,
        run_active=run_active,
    )
    return wire.session_info(row)


def _monitor(kernel: Kernel, a: argparse.Namespace) -> UpstreamMonitor:
    from monitor.upstream import UpstreamMonitor

    return UpstreamMonitor.from_config(kernel, a.config_obj)


@command(
    "adopt",
    "adopt a native session (catalog id, or kind and path)",
    arg("catalog_id", nargs="?", metavar="CATALOG_ID", help="from the catalog, or its short id"),
    arg("--kind", help="with --path: claude, codex, pi, opencode or claude-node"),
    arg("--path", help="with --kind: the transcript (or OpenCode database) to adopt"),
    arg("--thread", help="the native session id (OpenCode, claude-node)"),
    arg("--node", help="the paired node's name (claude-node)"),
    arg("--session-key", required=True, help="the gateway session it becomes"),
    arg("--agent", help="the agent id (default: the key's own, agent:<id>:...)"),
    arg("--session-id", help="the gateway's session id (default: the native one)"),
    loop=True,
    roots=True,
)
async def _adopt(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    adopted = await _monitor(kernel, a).adopt_source(
        session_key=a.session_key,
        agent_id=a.agent,
        session_id=a.session_id,
        catalog_id=a.catalog_id,
        kind=a.kind,
        path=a.path,
        node=a.node,
        thread=a.thread,
    )
    return wire.adopted(adopted)


@command(
    "own-message",
    "remember an OpenClaw-side message (self-echo)",
    arg("key", help="the session the gateway sent the message into"),
    arg("text", help="the message (only its hash is kept)"),
    arg("--agent", help="the agent id (default: the key's own, agent:<id>:...)"),
)
async def _own(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    from adapters.base import own_text_hash

    await kernel.remember_own_message(a.key, own_text_hash(a.text), agent_id=a.agent)
    return {"ok": True}


@command(
    "links",
    "the upstream links and their state",
    reads=True,
)
async def _links(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    return {"links": wire.links(await _monitor(kernel, a).links())}


@command(
    "tick",
    "run one monitor tick now",
    loop=True,
    roots=True,
)
async def _tick(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    return {"outcomes": [wire.link_result(r) for r in await _monitor(kernel, a).tick()]}


_GLOBAL_WITH_VALUE = frozenset({"--db", "--config", "--log-format"})


def _command_of(argv: list[str]) -> str | None:
    """The command named in ``argv``, when it is one (else the whole parser is built, to
    explain what is wrong)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _GLOBAL_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


# The commands main runs itself (no kernel handler): declared here, as the others are at
# their handlers.
declare(
    "serve",
    "run the sidecar until SIGINT/SIGTERM",
    roots=True,
)

declare(
    "config",
    "print the effective configuration",
    roots=True,
)

declare(
    "doctor",
    "check the database, token, roots, the gateway's hooks and the nodes (wakes no one)",
    roots=True,
)

declare(
    "open",
    "a one-time link to the running serve's status page",
    arg("--url", help="serve's address, when [api] listen does not say it (port 0)"),
    arg("--browser", action="store_true", help="open the link in a browser too"),
)

declare(
    "node",
    "serve this machine's Claude transcripts to a paired sidecar",
    arg("--listen", default="127.0.0.1:8766", help="HOST:PORT"),
    arg("--token-file", required=True, type=Path, help="the node's bearer token (made 0600)"),
    roots=True,
)

declare(
    "replay",
    "replay a native file through the classifier",
    arg("--adapter", required=True, choices=_Kinds(), help="the file's format"),
    arg("file", help="the transcript (a Codex .jsonl.zst too), or the OpenCode database"),
    arg("--session", help="the session id (OpenCode)"),
    arg("--own-text", action="append", default=[], help="a gateway-sent text (self-echo); repeat"),
    arg("--scan-cap", type=_non_negative, help="bytes read per tick (default [monitor])"),
    arg("--max-line-bytes", type=_non_negative, help="the longest line read (default [monitor])"),
)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of the ``only`` one."""
    p = _Parser(prog="sessionwatch", description=__doc__.splitlines()[0].replace("``", ""))
    p.add_argument("--db", help="state database: a SQLite file or a postgresql:// URL")
    p.add_argument("--config", type=Path, help="TOML configuration ($SESSIONWATCH_CONFIG)")
    p.add_argument(
        "--log-format",
        choices=["plain", "json"],
        default="plain",
        help="serve and node: the log as text lines or one JSON object a line",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, declared in COMMANDS.items():
        # only the command this run names: argparse's parsers cost about a millisecond
        # each to build, most of a one-shot command's start-up
        if only in (None, name):
            parser = sub.add_parser(name, help=declared.help)
            for flags, options in declared.arguments:
                parser.add_argument(*flags, **options)
    return p


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from monitor.kernel import Kernel, KernelSettings  # not for replay, config, serve, node

    handler = COMMANDS[args.command].handler
    assert handler is not None  # main runs the others itself
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


def _replay(args: argparse.Namespace) -> int:
    from adapters.base import Settings
    from monitor.upstream.replay import replay

    m = args.config_obj.monitor
    settings = Settings(
        scan_cap=args.scan_cap or m.scan_cap_bytes,
        max_line=args.max_line_bytes or m.max_line_bytes,
        replay_lookback=m.replay_lookback,
    )
    lines = list(
        replay(
            args.adapter, args.file, thread=args.session, own_texts=args.own_text, settings=settings
        )
    )
    for line in lines:
        sys.stdout.buffer.write(orjson.dumps(line) + b"\n")
    return 0


@command(
    "catalog",
    "list the native sessions (local and on paired nodes)",
    arg("--kind", choices=_Kinds(), help="only this kind"),
    arg("--cwd", help="only sessions in this directory or below it"),
    arg("--since", help="only sessions updated since: 30m, 6h, 2d, 1w or a date"),
    arg("--search", help="rank by a fuzzy match of title, prompt and directory"),
    arg("--limit", type=_positive, help="at most this many"),
    arg("--json", action="store_true", help="JSON instead of a table"),
    loop=True,
    roots=True,
    reads="scratch",  # the native sessions are listed before any database exists
)
async def _catalog(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    found = await _monitor(kernel, a).find_catalog(
        a.kind, cwd=a.cwd, since=a.since, search=a.search, limit=a.limit
    )
    if a.json:
        return found.as_json()
    from monitor.cli_table import print_catalog

    print_catalog(found, kernel.clock())
    return {}


def _setup_logging(fmt: str, level: str = "info") -> None:
    """Plain or JSON lines on stderr, for ``serve`` and ``node`` (they bring logging in)."""
    import logging

    class JsonFormatter(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            return orjson.dumps(
                {
                    "ts": record.created,
                    "level": record.levelname,
                    "logger": record.name,
                    "message": record.getMessage(),
                }
            ).decode()

    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    # watchfiles says "N changes detected" at INFO for every append to a watched file: the
    # log would grow with writes, not with changes of state
    logging.getLogger("watchfiles").setLevel(logging.WARNING)


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


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    try:
        _check_utf8(given)
        args = build_parser(_command_of(given)).parse_args(given)
        try:
            args.config_obj = load_config(args.config)
        except ConfigError as exc:  # a bad configuration file is bad input: exit 2
            raise BadInput(str(exc)) from None
        if COMMANDS[args.command].roots:  # its [roots] keys are the formats' own
            from adapters.registry import roots_of

            roots_of(args.config_obj.roots.given)
        if args.command == "replay":
            return _replay(args)
        if args.command == "config":
            from adapters.registry import root_keys, roots_with_origin

            shown = args.config_obj.as_json()
            roots = roots_with_origin(args.config_obj.roots.given)
            shown["roots"] = {key: roots[e.name][0] for key, e in root_keys().items()}
            # where each came from: "[roots] KEY", "$VAR" (the harness's own) or "default"
            shown["rootsFrom"] = {key: roots[e.name][1] for key, e in root_keys().items()}
            target = db_path(args, args.config_obj)  # what --db or $SESSIONWATCH_DB chose
            shown["store"]["effective"] = (
                without_password(target) if is_pg_url(target) else str(target)
            )
            shown["store"]["from"] = db_origin(args, args.config_obj)
            from monitor.openclaw import found_hooks

            hooks = found_hooks(args.config_obj, target)
            if args.config_obj.gateway.hooks_url:
                shown["gateway"]["from"] = "[gateway] hooks_url"
            elif hooks is not None:
                shown["gateway"]["from"] = str(hooks.install.config_path)
                try:  # the URL, never the token
                    shown["gateway"]["hooks_url"] = hooks.current()[0]
                except SessionwatchError as exc:
                    shown["gateway"]["problem"] = one_line(str(exc))
            sys.stdout.buffer.write(orjson.dumps(shown) + b"\n")
            return 0
        if args.command == "doctor":
            import asyncio

            from monitor import doctor

            found = asyncio.run(doctor.run(args.config_obj, db_path(args, args.config_obj)))
            return doctor.print_findings(found)
        if args.command == "open":
            from monitor.ui_open import open_link

            url = open_link(args.config_obj, args.url, db_path(args, args.config_obj))
            print(url)
            if args.browser:
                import webbrowser

                if not webbrowser.open(url):
                    raise SessionwatchError("no browser could be opened here: open the link above")
            return 0
        if args.command in ("node", "serve"):
            import asyncio

            from monitor.service import serve, serve_node

            _setup_logging(args.log_format, args.config_obj.log.level)
            if args.command == "node":
                asyncio.run(serve_node(args.config_obj, args.listen, args.token_file))
            else:
                config_path = args.config or os.environ.get("SESSIONWATCH_CONFIG")
                asyncio.run(serve(args.config_obj, db_path(args, args.config_obj), config_path))
            return 0
        result = _run_command(args)
    except BadInput as exc:
        _say_fatal(str(exc), given)
        return 2
    except SessionwatchError as exc:
        _say_fatal(str(exc), given)
        return 1
    except KeyboardInterrupt:
        return 130
    if result or args.command != "catalog":  # the catalog's table was printed already
        sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
    for warning in result.get("warnings", []) if args.command == "adopt" else []:
        print(f"sessionwatch: note: {one_line(warning, 2000)}", file=sys.stderr)
    declined = result.get("declined") if args.command == "adopt" else None
    if declined:  # adopted without a link: say why, and do not exit as if all went well
        print(f"sessionwatch: adopted without a link: {declined}", file=sys.stderr)
        return 1
    return 0
