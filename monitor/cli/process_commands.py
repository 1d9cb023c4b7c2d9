"""The commands that need no kernel of their own: ``serve`` and ``node`` (which run until
stopped), ``config``, ``doctor``, ``open`` and ``replay``. Each is handed the parsed arguments
with the configuration, prints what it has to say, and answers its exit code."""

from __future__ import annotations

import os
import sys

import orjson

from monitor.cli.declare import (
    Args,
    Kinds,
    arg,
    command,
    db_origin,
    db_path,
    path_arg,
    positive,
)
from monitor.config import is_pg_url, without_password
from monitor.errors import SessionwatchError, one_line

SERVE_ABOUT = """\
SIGHUP reads the configuration again; SIGINT or SIGTERM stop it cleanly.

Its state database, the first of:
  --db PATH|URL (before the command: sessionwatch --db ... serve), $SESSIONWATCH_DB,
  [store] url or [store] path in the configuration (--config FILE or $SESSIONWATCH_CONFIG),
  OpenClaw's own state database when an OpenClaw install is found next to this user
  (waited for until the gateway's first start makes it),
  else ~/.local/state/sessionwatch/state.db (made on first start).

It listens on [api] listen (default 127.0.0.1:8765; "unix:PATH" for a socket), with the
bearer token in [api] token_file (default ~/.local/state/sessionwatch/token, made 0600 on
first start). Its log goes to stderr (--log-format json: one JSON object a line).

sessionwatch config shows each value in force and where it came from;
sessionwatch doctor checks them; sessionwatch open opens its status page."""


@command(
    "serve",
    "run the sidecar until SIGINT/SIGTERM",
    needs="config",
    roots=True,
    about=SERVE_ABOUT,
)
def _serve(args: Args) -> int:
    import asyncio

    from monitor.serve.root import serve

    _setup_logging(args.log_format, args.config_obj.log.level)
    config_path = args.config or os.environ.get("SESSIONWATCH_CONFIG")
    try:
        asyncio.run(serve(args.config_obj, db_path(args, args.config_obj), config_path))
    except OSError as exc:  # what the system refused that no part said: one line, no trace
        from pathlib import Path

        from monitor.private import os_reason

        where = Path(exc.filename).parent if exc.filename else Path.cwd()
        raise SessionwatchError(f"serve stopped: {os_reason(exc, where)}") from None
    return 0


@command(
    "node",
    "serve this machine's Claude Code, Codex, Pi and OpenCode sessions to a paired sidecar",
    arg(
        "--listen",
        default="127.0.0.1:8766",
        help="HOST:PORT (plain HTTP: loopback only; default: 127.0.0.1:8766)",
    ),
    arg("--token-file", required=True, type=path_arg, help="the node's bearer token (made 0600)"),
    arg(
        "--tls",
        type=path_arg,
        metavar="PEM_FILE",
        help="serve HTTPS with the key and certificate in PEM_FILE (made 0600 on first start;"
        " its fingerprint is logged: pin it in the sidecar's [nodes.NAME] fingerprint)",
    ),
    needs="config",
    roots=True,
)
def _node(args: Args) -> int:
    import asyncio

    from monitor.serve.root import serve_node

    _setup_logging(args.log_format, args.config_obj.log.level)
    asyncio.run(serve_node(args.config_obj, args.listen, args.token_file, args.tls))
    return 0


@command("config", "print the effective configuration", needs="config", roots=True)
def _config(args: Args) -> int:
    from adapters.registry import root_keys, roots_with_origin
    from monitor.openclaw.files import found_hooks
    from monitor.paths import expand_user

    config = args.config_obj
    shown = config.as_json()
    roots = roots_with_origin(config.roots.given)
    # expanded, as serve and doctor read them (``~`` and variables)
    shown["roots"] = {key: expand_user(roots[e.name][0]) for key, e in root_keys().items()}
    # where each came from: "[roots] KEY", "$VAR" (the harness's own) or "default"
    shown["rootsFrom"] = {key: roots[e.name][1] for key, e in root_keys().items()}
    target = db_path(args, config)  # what --db or $SESSIONWATCH_DB chose
    shown["store"]["effective"] = without_password(target) if is_pg_url(target) else str(target)
    shown["store"]["from"] = db_origin(args, config)
    hooks = found_hooks(config, target)
    if config.gateway.hooks_url:
        shown["gateway"]["from"] = "[gateway] hooks_url"
    elif hooks is not None:
        shown["gateway"]["from"] = str(hooks.install.config_path)
        try:  # the URL, never the token
            shown["gateway"]["hooks_url"] = hooks.current()[0]
        except SessionwatchError as exc:
            shown["gateway"]["problem"] = one_line(str(exc))
    sys.stdout.buffer.write(orjson.dumps(shown) + b"\n")
    return 0


@command(
    "doctor",
    "check the database, token, roots, the gateway's hooks and the nodes (wakes no one)",
    needs="config",
    roots=True,
)
def _doctor(args: Args) -> int:
    import asyncio

    from monitor import doctor

    found = asyncio.run(doctor.run(args.config_obj, db_path(args, args.config_obj)))
    return doctor.print_findings(found)


@command(
    "open",
    "a one-time link to the running serve's status page",
    arg("--url", help="serve's address, when [api] listen does not say it (port 0)"),
    arg("--browser", action="store_true", help="open the link in a browser too"),
    needs="config",
)
def _open(args: Args) -> int:
    from monitor.ui_open import open_link

    url = open_link(args.config_obj, args.url, db_path(args, args.config_obj))
    print(url)
    if args.browser:
        import webbrowser

        if not webbrowser.open(url):
            raise SessionwatchError("no browser could be opened here: open the link above")
    return 0


@command(
    "replay",
    "replay a native file through the classifier",
    arg("--adapter", required=True, choices=Kinds(), help="the file's format"),
    arg("file", help="the transcript (a Codex .jsonl.zst too), or the OpenCode database"),
    arg("--session", help="the session id (OpenCode)"),
    arg("--own-text", action="append", default=[], help="a gateway-sent text (self-echo); repeat"),
    arg("--scan-cap", type=positive, help="bytes read per tick (default [monitor])"),
    arg("--max-line-bytes", type=positive, help="the longest line read (default [monitor])"),
    needs="config",
    alone=True,
)
def _replay(args: Args) -> int:
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


def _setup_logging(fmt: str, level: str = "info") -> None:
    """Plain or JSON lines on stderr, for ``serve`` and ``node`` (they bring logging in)."""
    import logging

    class JsonFormatter(logging.Formatter):
        """A JSON object a line; an exception's type, message and traceback in its own
        fields (``exc_type``, ``exc_message``, ``exc``), as the plain format prints them."""

        def format(self, record: logging.LogRecord) -> str:
            line: dict[str, object] = {
                "ts": record.created,
                "level": record.levelname,
                "logger": record.name,
                "message": record.getMessage(),
            }
            if record.exc_info and record.exc_info[0] is not None:
                kind, exc, _ = record.exc_info
                line["exc_type"] = f"{kind.__module__}.{kind.__qualname__}"
                line["exc_message"] = str(exc)
                line["exc"] = self.formatException(record.exc_info)
            elif record.exc_text:
                line["exc"] = record.exc_text
            if record.stack_info:
                line["stack"] = self.formatStack(record.stack_info)
            return orjson.dumps(line).decode()

    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
