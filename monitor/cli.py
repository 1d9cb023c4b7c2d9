"""The ``sessionwatch`` command line.

Every command prints one JSON object on stdout and exits 0; bad input exits 2 with a one-line
message on stderr and writes nothing; a database that cannot be used exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

import orjson

from monitor.errors import BadInput, SessionwatchError
from monitor.events import parse_actor, parse_kind
from monitor.kernel import Kernel

Handler = Callable[[Kernel, argparse.Namespace], Awaitable[dict[str, Any]]]
_HANDLERS: dict[str, Handler] = {}


def default_db_path() -> Path:
    """``$SESSIONWATCH_DB``, else ``state.db`` in the user's state directory."""
    env = os.environ.get("SESSIONWATCH_DB")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or "~/.local/state"
    return Path(base).expanduser() / "sessionwatch" / "state.db"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise BadInput(f"{self.prog.removeprefix('sessionwatch').strip() or 'usage'}: {message}")


def command(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        _HANDLERS[name] = fn
        return fn

    return register


def parse_json_arg(name: str, raw: str | None) -> Any:
    if raw is None:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"{name} is not valid JSON: {exc}") from None


@command("record")
async def _record(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    result = await kernel.record(
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
    return result.event.record_json(duplicate=result.duplicate)


@command("spawn")
async def _spawn(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    result = await kernel.spawn(parent=a.parent, child=a.child, run_id=a.run_id)
    return result.event.record_json(duplicate=result.duplicate)


@command("watch")
async def _watch(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    watched = await kernel.watch(
        watcher=a.watcher, target=a.target, store_path=a.store_path, ambient=a.ambient
    )
    return {"watched": watched}


@command("notices")
async def _notices(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    notices = await kernel.notices(watcher=a.watcher, store_path=a.store_path, drain=a.drain)
    return {"notices": [n.as_json() for n in notices]}


@command("status")
async def _status(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    return await kernel.status(a.key, agent_id=a.agent, changes_since=a.changes_since)


@command("sessions")
async def _sessions(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    return {"sessions": await kernel.state_versions(a.keys)}


@command("reset")
async def _reset(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    await kernel.reset(a.key)
    return {"ok": True}


@command("delete")
async def _delete(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    await kernel.delete(a.key, agent_id=a.agent)
    return {"ok": True}


@command("prune")
async def _prune(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    return (await kernel.prune(a.now)).as_json()


@command("session")
async def _session(kernel: Kernel, a: argparse.Namespace) -> dict[str, Any]:
    run_active = None if a.run is None else a.run == "active"
    return await kernel.upsert_session(
        a.key,
        agent_id=a.agent,
        session_id=a.session_id,
        store_path=a.store_path,
        run_active=run_active,
    )


def _non_negative(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {raw!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {raw}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="sessionwatch", description=__doc__.splitlines()[0])
    p.add_argument("--db", type=Path, help="state database (default $SESSIONWATCH_DB)")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    r = sub.add_parser("record", help="record one state event")
    r.add_argument("--session", required=True)
    r.add_argument("--kind", required=True)
    r.add_argument("--actor", required=True)
    r.add_argument("--agent")
    r.add_argument("--actor-id")
    r.add_argument("--run-id")
    r.add_argument("--session-id")
    r.add_argument("--summary")
    r.add_argument("--dedupe-key")
    r.add_argument("--payload")
    r.add_argument("--occurred-at", type=_non_negative)

    s = sub.add_parser("spawn", help="record child_spawned, seeding the parent's cursor")
    s.add_argument("--parent", required=True)
    s.add_argument("--child", required=True)
    s.add_argument("--run-id", required=True)

    w = sub.add_parser("watch", help="register a watcher on a target")
    w.add_argument("--watcher", required=True)
    w.add_argument("--target", required=True)
    w.add_argument("--store-path")
    w.add_argument("--ambient", action="store_true")

    n = sub.add_parser("notices", help="a watcher's pending notices")
    n.add_argument("--watcher", required=True)
    n.add_argument("--store-path")
    n.add_argument("--drain", action="store_true")

    st = sub.add_parser("status", help="session_status, with changesSince on ask")
    st.add_argument("key")
    st.add_argument("--agent")
    st.add_argument("--changes-since", type=_non_negative)

    ss = sub.add_parser("sessions", help="state versions of sessions")
    ss.add_argument("keys", nargs="*")

    rs = sub.add_parser("reset", help="a session was reset: drop its cursors")
    rs.add_argument("key")

    d = sub.add_parser("delete", help="a session was deleted: drop everything of it")
    d.add_argument("key")
    d.add_argument("--agent")

    pr = sub.add_parser("prune", help="run retention now")
    pr.add_argument("--now", type=_non_negative, help="the clock, in ms since the epoch")

    se = sub.add_parser("session", help="create or update a known gateway session")
    se.add_argument("key")
    se.add_argument("--agent")
    se.add_argument("--session-id")
    se.add_argument("--store-path")
    se.add_argument("--run", choices=["active", "idle"])
    return p


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    handler = _HANDLERS[args.command]
    kernel = await Kernel.open(args.db or default_db_path())
    try:
        return await handler(kernel, args)
    finally:
        await kernel.close()


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        result = asyncio.run(_run(args))
    except BadInput as exc:
        print(f"sessionwatch: {exc}", file=sys.stderr)
        return 2
    except SessionwatchError as exc:
        print(f"sessionwatch: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
    return 0
