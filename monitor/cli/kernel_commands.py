"""The commands run on the kernel: each answers one JSON object, printed on stdout."""

from __future__ import annotations

import sys

import orjson

from monitor.cli.declare import (
    Args,
    Kinds,
    arg,
    command,
    epoch_ms,
    non_negative,
    parse_json_arg,
    positive,
)
from monitor.errors import BadInput, one_line
from monitor.kernel.events import parse_actor, parse_kind
from monitor.web import wire

TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from typing import Any, NoReturn

    from monitor.kernel import Kernel
    from monitor.upstream import UpstreamMonitor
    from monitor.upstream.links import Now


def printed(answer: dict[str, Any]) -> int:
    """The answer as one JSON line on stdout: the end of most commands. An answer that says
    the command was refused (see :func:`refusal`) exits 1, with its reason on stderr: a
    script carries on only when it worked."""
    sys.stdout.buffer.write(orjson.dumps(answer) + b"\n")
    said = refusal(answer)
    if said is None:
        return 0
    print(f"sessionwatch: {one_line(said, 2000)}", file=sys.stderr)
    return 1


def refusal(answer: dict[str, Any]) -> str | None:
    """What an answer says was refused, in one line, or None: an adoption without a link
    (``declined``), a watch not registered (``watched: false``)."""
    if answer.get("declined"):
        return f"adopted without a link: {answer['declined']}"
    if answer.get("watched") is False:
        return f"not watched: {answer.get('reason') or 'refused'}"
    return None


def _adopted(answer: dict[str, Any]) -> int:
    """The adoption, its notes on stderr, and exit 1 when it was adopted without a link."""
    for warning in answer.get("warnings", []):
        print(f"sessionwatch: note: {one_line(warning, 2000)}", file=sys.stderr)
    return printed(answer)


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
    arg(
        "--occurred-at",
        type=epoch_ms,
        help="when, in ms since the epoch (default now; kept within the last 24 h: a time"
        " before is taken as 24 h ago, one after as now)",
    ),
)
async def _record(kernel: Kernel, a: Args) -> dict[str, Any]:
    from monitor.kernel.drafts import NewEvent

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
async def _spawn(kernel: Kernel, a: Args) -> dict[str, Any]:
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
async def _watch(kernel: Kernel, a: Args) -> dict[str, Any]:
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
async def _notices(kernel: Kernel, a: Args) -> dict[str, Any]:
    if a.follow:
        if a.drain:
            raise BadInput("notices: --follow peeks; drain with a separate --drain call")
        await _follow(kernel, a)
    inbox = await kernel.inbox(watcher=a.watcher, store_path=a.store_path, drain=a.drain)
    return {"notices": inbox.as_json()}


async def _follow(kernel: Kernel, a: Args) -> NoReturn:
    """Each notice as it opens, as a JSON line, until interrupted or until the reader of a
    pipe goes away (``... --follow | head -n 1`` ends when ``head`` does; see
    monitor.kernel.feed). Told, not polled: on Linux one blocking wait hears the database
    written (inotify on its directory; looked at again shortly after, as the change hub does:
    the commit may be visible only then) and the pipe's reader gone; a look every
    ``WATCHED_S`` stays the safety net. Elsewhere (and on PostgreSQL) the change hub."""
    from monitor.kernel.changes import VISIBLE_AFTER_S, WATCHED_S
    from monitor.kernel.feed import NoticeFeed
    from monitor.kernel.store.sqlite_conn import DirectStore

    feed = NoticeFeed()
    out = sys.stdout.fileno()
    watched = kernel.store.watch() if isinstance(kernel.store, DirectStore) else None

    async def show() -> None:
        read = await kernel.follow(watcher=a.watcher, store_path=a.store_path, after=feed.after)
        for notice in feed.fresh(read):
            sys.stdout.buffer.write(orjson.dumps(notice) + b"\n")
        sys.stdout.flush()

    if watched is not None:
        watch, database = watched
        await show()
        again: tuple[float, ...] = ()  # the looks still due after the database was written
        while True:
            paths, gone = watch.wait(again[0] if again else WATCHED_S, out)
            if gone:
                raise SystemExit(0)
            if paths & database:
                again = VISIBLE_AFTER_S
            elif not paths:  # a look after a write, or the safety net's
                again = again[1:]
            else:
                continue  # another file in the database's directory
            await show()
    await _follow_the_hub(kernel, show, out)


async def _follow_the_hub(
    kernel: Kernel, show: Callable[[], Awaitable[None]], out: int
) -> NoReturn:
    import select

    from monitor.kernel.bus import NOTICE_CHANGES, notices_may_differ
    from monitor.kernel.changes import POLL_S

    reader_gone = select.poll()
    reader_gone.register(out, select.POLLERR)
    changed = True
    async with kernel.bus.listen(NOTICE_CHANGES) as heard:
        while True:
            if reader_gone.poll(0):
                raise SystemExit(0)
            if changed:
                heard.pending()  # what the read sees
                await show()
            change = await heard.next(POLL_S)  # and look at the pipe again
            changed = change is not None and notices_may_differ(change)


@command(
    "status",
    "session_status, with changesSince on ask",
    arg("key", help="the session key"),
    arg("--agent", help="the agent id (default: the key's own, agent:<id>:...)"),
    arg("--changes-since", type=non_negative, help="the events after this sequence"),
    reads=True,
)
async def _status(kernel: Kernel, a: Args) -> dict[str, Any]:
    return wire.status(await kernel.status(a.key, agent_id=a.agent, changes_since=a.changes_since))


@command(
    "sessions",
    "state versions of sessions; with --state, the adopted sessions doing that now",
    arg("keys", nargs="*", help="session keys (default: every session with a head)"),
    arg(
        "--state",
        metavar="STATE[,STATE]",
        help="working, waiting, asking, quiet or unknown: those doing it, the longest first",
    ),
    reads=True,
)
async def _sessions(kernel: Kernel, a: Args) -> dict[str, Any]:
    if a.state is None:
        return {"sessions": wire.state_versions(await kernel.state_versions(a.keys))}
    from adapters.states import STATES
    from monitor.upstream.links import doing_versions

    states = frozenset(a.state.split(","))
    if not states <= set(STATES):
        said = ", ".join(STATES)
        raise BadInput(f"--state: not a state: {a.state!r} (one or more of {said})")
    now = _now(kernel, a)
    found = await kernel.read(lambda c: doing_versions(c, states, now))
    keys = set(a.keys)
    return {"sessions": [wire.doing(d, v) for d, v in found if not keys or d.session_key in keys]}


@command(
    "reset",
    "a session was reset: drop its cursors",
    arg("key", help="the session key"),
)
async def _reset(kernel: Kernel, a: Args) -> dict[str, Any]:
    await kernel.gateway_sessions.reset(a.key)
    return {"ok": True}


@command(
    "delete",
    "a session was deleted: drop everything of it",
    arg("key", help="the session key"),
    arg("--agent", help="the agent id (default: the key's own, agent:<id>:...)"),
)
async def _delete(kernel: Kernel, a: Args) -> dict[str, Any]:
    await kernel.gateway_sessions.delete(a.key, agent_id=a.agent)
    return {"ok": True}


@command(
    "prune",
    "run retention now",
    arg("--now", type=non_negative, help="the clock, in ms since the epoch"),
)
async def _prune(kernel: Kernel, a: Args) -> dict[str, Any]:
    return wire.pruned(await kernel.retention.prune(a.now))


@command(
    "session",
    "create or update a known gateway session",
    arg("key", help="the session key"),
    arg("--agent", help="the agent id (default: the key's own, agent:<id>:...)"),
    arg("--session-id", help="the gateway's session id"),
    arg("--store-path", help="the session's store (default: the gateway's own)"),
    arg("--run", choices=["active", "idle"], help="whether a run is active (its ticks wait)"),
)
async def _session(kernel: Kernel, a: Args) -> dict[str, Any]:
    run_active = None if a.run is None else a.run == "active"
    row = await kernel.gateway_sessions.upsert(
        a.key,
        agent_id=a.agent,
        session_id=a.session_id,
        store_path=a.store_path,
        run_active=run_active,
    )
    return wire.session_info(row)


def _monitor(kernel: Kernel, a: Args) -> UpstreamMonitor:
    from monitor.upstream import UpstreamMonitor

    return UpstreamMonitor.from_config(kernel, a.config_obj)


@command(
    "adopt",
    "adopt a native session (catalog id, or kind and path)",
    arg("catalog_id", nargs="?", metavar="CATALOG_ID", help="from the catalog, or its short id"),
    arg("--kind", help="with --path: claude, codex, pi, opencode; with --node: KIND-node"),
    arg("--path", help="with --kind: the transcript (or OpenCode database) to adopt"),
    arg("--thread", help="the native session id (OpenCode, and every kind on a node)"),
    arg("--node", help="the paired node's name (claude-node, codex-node, pi-node, ...)"),
    arg("--session-key", required=True, help="the gateway session it becomes"),
    arg("--agent", help="the agent id (default: the key's own, agent:<id>:...)"),
    arg("--session-id", help="the gateway's session id (default: the native one)"),
    done=lambda answer, a: _adopted(answer),
    loop=True,
    roots=True,
)
async def _adopt(kernel: Kernel, a: Args) -> dict[str, Any]:
    adopted = await _monitor(kernel, a).adoption.adopt_source(
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
async def _own(kernel: Kernel, a: Args) -> dict[str, Any]:
    from adapters.base import own_text_hash

    await kernel.gateway_sessions.remember_own_message(
        a.key, own_text_hash(a.text), agent_id=a.agent
    )
    return {"ok": True}


@command(
    "links",
    "the upstream links and their state",
    reads=True,
)
async def _links(kernel: Kernel, a: Args) -> dict[str, Any]:
    # read as the monitor reads them, without building its adapters (a node's client
    # imports aiohttp: a third of a second of a 10,000-link listing)
    from monitor.kernel.cursors import watched_targets
    from monitor.upstream.links import list_links

    now = _now(kernel, a)
    return {
        "links": wire.links(await kernel.read(lambda c: list_links(c, watched_targets(c), now)))
    }


def _now(kernel: Kernel, a: Args) -> Now:
    """When a listing reads what sessions are doing (the store's clock), as ``serve``'s."""
    from monitor.upstream.links import Now

    return Now(kernel.clock(), int(a.config_obj.monitor.quiet_after_s * 1000))


@command(
    "tick",
    "run one monitor tick now",
    loop=True,
    roots=True,
)
async def _tick(kernel: Kernel, a: Args) -> dict[str, Any]:
    return {"outcomes": [wire.link_result(r) for r in await _monitor(kernel, a).ticker.tick()]}


@command(
    "catalog",
    "list the native sessions (local and on paired nodes)",
    arg("--kind", choices=Kinds(), help="only this kind"),
    arg("--cwd", help="only sessions in this directory or below it"),
    arg("--since", help="only sessions updated since: 30m, 6h, 2d, 1w or a date"),
    arg("--search", help="rank by a fuzzy match of title, prompt and directory"),
    arg("--limit", type=positive, help="at most this many"),
    arg("--json", action="store_true", help="JSON instead of a table"),
    done=lambda answer, a: _catalog_done(answer, a),
    loop=True,
    roots=True,
    reads="scratch",  # the native sessions are listed before any database exists
)
async def _catalog(kernel: Kernel, a: Args) -> dict[str, Any]:
    found = await _monitor(kernel, a).sessions.find(
        a.kind, cwd=a.cwd, since=a.since, search=a.search, limit=a.limit
    )
    if a.json:
        return found.as_json()
    from monitor.cli.table import print_catalog

    print_catalog(found, kernel.clock())
    return {"errors": found.errors}  # not printed: the exit code's


def _catalog_done(answer: dict[str, Any], a: Args) -> int:
    """The JSON printed (or the table, printed already); exit 1 when a paired node could
    not be listed at all: its sessions are missing from what was shown."""
    code = printed(answer) if a.json else 0
    down = {f"node {name}" for name in a.config_obj.nodes}
    return code or int(any(e.get("path") in down for e in answer.get("errors", ())))
