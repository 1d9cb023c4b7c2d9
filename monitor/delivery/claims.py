"""The owner of ``sessionwatch_wakes``: per watcher, when its last wake went (the window) and
who holds the lease to wake it. With the notice outbox (:mod:`monitor.kernel.outbox`) it is
the wake ledger, in the store, so that every sidecar on it, and a sidecar restarted after a
crash, see the same: each function here is one step of a pass, run in its own transaction.

1. :func:`claim`: the watcher's lease, for the notices of its own that are due. A lease
   someone else holds and has not let expire says :class:`Busy`; a wake within the window
   says :class:`Wait`; else the lease is ours for ``lease_ms``, and the due notices are
   returned. A notice left ``sending`` by a holder whose lease expired was cut mid-call:
   that call may have reached the gateway, so it counts as one unanswered call (and a
   notice with :data:`~monitor.kernel.outbox.MAX_UNANSWERED` of them counts as delivered:
   acknowledged, never sent again).
2. :func:`hold`: just before each call, the lease is still ours (renewed) and the notice
   still pending (read again); then it is ``sending``, and the window starts: when the
   call goes out, not at the claim (a pass that waited for the store or for a peer's
   lease does not shorten it); it starts again when the call ends (step 3), as the
   request may reach the gateway any time until then. Else the call is withdrawn; and
   also when the gateway itself queued and woke the notice since it opened (OpenClaw's
   start-up sweep does that for every pending notice: a notice opened while the gateway
   was down reached it that way, and a call would put it in its queue twice).
3. :func:`settle`: the call's outcome. Accepted: acknowledged as a drain is, in the same
   transaction that marks it ``woken``. Unanswered: one more unanswered call. Failed: due
   again.
4. :func:`release`: the lease ends.

Every time a step writes or compares (a lease's expiry, the window's start) is the store's
clock, read inside the step's transaction once its lock is taken
(:func:`~monitor.kernel.store.protocol.store_now`): on PostgreSQL the server's, so that no
host's wall clock, however far off, breaks a window or takes over a live lease; a wait
comes back as the time left (``left_ms``), which the caller times on its monotonic clock.
"""

from __future__ import annotations

from typing import Literal

from monitor.kernel import outbox
from monitor.kernel.outbox import MAX_UNANSWERED, OutboxRow
from monitor.kernel.store.protocol import store_now
from monitor.records import NamedTuple

TYPE_CHECKING = False

if TYPE_CHECKING:
    from monitor.kernel.notices import Notice
    from monitor.kernel.store.protocol import Conn


class Claimed(NamedTuple):
    """The lease is ours: wake these, in order. ``settled``: notices an expired holder's
    cut calls had sent as often as they may go, now counted as delivered. ``repeats``: how
    many of ``entries`` an expired holder's cut call left with their one repeat."""

    entries: list[OutboxRow]
    settled: list[OutboxRow]
    reopened: list[Notice]
    repeats: int = 0


class Busy(NamedTuple):
    """Another holder's lease runs ``left_ms`` more (by the store's clock)."""

    left_ms: int


class Wait(NamedTuple):
    """The watcher was woken within the window, which ends in ``left_ms`` (by the store's
    clock)."""

    left_ms: int


Claim = Claimed | Busy | Wait | None  # None: nothing is due


class Settled(NamedTuple):
    """A call's outcome recorded: whether its notice now counts as delivered (and the
    notices its acknowledgement reopened), or ``repeat``: it went unanswered, and may go
    once more."""

    delivered: bool
    reopened: list[Notice]
    repeat: bool = False


def claim(conn: Conn, watcher: str, *, holder: str, window_ms: int, lease_ms: int) -> Claim:
    """Step 1 (see the module docstring). A wake stored at a time after the store's ``now``
    (its clock stepped back since: SQLite's is the host's) holds no window: one that lasted
    until the clock caught up would stall every wake meanwhile."""
    now = store_now(conn)
    row = conn.execute(
        "SELECT woken_at, holder, lease_until FROM sessionwatch_wakes"
        " WHERE watcher_session_key = ?",
        (watcher,),
    ).fetchone()
    if row is not None and row[1] not in (None, holder) and int(row[2]) > now:
        return Busy(int(row[2]) - now)
    settled: list[OutboxRow] = []
    reopened: list[Notice] = []
    repeats = 0
    for entry in outbox.due(conn, watcher, now):
        if entry.state != outbox.SENDING:
            continue
        # a call cut by a crash, or answered but not recorded (the store unreachable from
        # its holder until the lease ran out): no peer can tell which
        cut = _settle(conn, entry, "unanswered", now)
        settled += [entry] if cut.delivered else []
        reopened += cut.reopened
        repeats += cut.repeat
    entries = outbox.due(conn, watcher, now)
    if not entries:
        release(conn, watcher, holder)
        return None if not settled else Claimed([], settled, reopened)
    if row is not None and now - window_ms < int(row[0]) <= now:
        release(conn, watcher, holder)
        return Wait(int(row[0]) + window_ms - now)
    conn.execute(  # the window is not started here: at the call (hold)
        "INSERT INTO sessionwatch_wakes (watcher_session_key, woken_at, holder, lease_until)"
        " VALUES (?, 0, ?, ?) ON CONFLICT (watcher_session_key) DO UPDATE SET"
        " holder = excluded.holder, lease_until = excluded.lease_until",
        (watcher, holder, now + lease_ms),
    )
    return Claimed(entries, settled, reopened, repeats)


Hold = Literal["go", "gone", "theirs", "lost"]


def hold(conn: Conn, entry: OutboxRow, *, holder: str, lease_ms: int, window_ms: int) -> Hold:
    """Step 2: ``go`` when the call for ``entry`` may go now (it is then ``sending``, the
    lease runs ``lease_ms`` from now, and the window starts now unless a call of this pass
    started it, ``window_ms`` long); ``gone`` when its notice
    was acknowledged or drained, or settled by someone else; ``theirs`` when the gateway
    woke it itself (it is then ``woken``, and its cursor is left for the gateway's drain to
    acknowledge); ``lost`` when the lease expired (someone may have taken it over: the pass
    ends, and claims again)."""
    now = store_now(conn)
    held = conn.execute(
        "UPDATE sessionwatch_wakes SET lease_until = ? WHERE watcher_session_key = ?"
        " AND holder = ? AND lease_until > ?",
        (now + lease_ms, entry.watcher, holder, now),
    ).rowcount
    if held != 1:
        return "lost"
    current = outbox.read(conn, entry.id)
    if current is None or current.state not in (outbox.WAKE, outbox.SENDING):
        return "gone"
    if current.alive(conn) is None:
        outbox.set_state(conn, entry.id, outbox.GONE, now)
        return "gone"
    if current.woken_by_the_gateway(conn):  # at its restart: a call would repeat it
        outbox.set_state(conn, entry.id, outbox.WOKEN, now)
        return "theirs"
    outbox.set_state(conn, entry.id, outbox.SENDING, now)
    conn.execute(  # the window starts as the pass's first call goes out (the others in it)
        "UPDATE sessionwatch_wakes SET woken_at = ? WHERE watcher_session_key = ?"
        " AND NOT (woken_at > ? AND woken_at <= ?)",
        (now, entry.watcher, now - window_ms, now),
    )
    return "go"


def settle(conn: Conn, entry: OutboxRow, result: str, *, ended_ago_ms: int | None = 0) -> Settled:
    """Step 3, for a call's ``result`` (``accepted``, ``unanswered`` or anything else, a
    failure): whether the notice now counts as delivered, and the notices that its
    acknowledgement reopened (work that came after it froze). A call that went starts the
    window again where it ended, ``ended_ago_ms`` before now (an outcome recorded late, the
    store having refused it; None when no call went after all): the request may have
    reached the gateway any time until then (a connection retried, a slow link, a host
    paused after step 2), and the next call is a window after that."""
    now = store_now(conn)
    current = outbox.read(conn, entry.id)
    if ended_ago_ms is not None and current is not None and current.state == outbox.SENDING:
        conn.execute(
            "UPDATE sessionwatch_wakes SET woken_at = ? WHERE watcher_session_key = ?",
            (now - max(0, ended_ago_ms), entry.watcher),
        )
    return _settle(conn, entry, result, now)


def _settle(conn: Conn, entry: OutboxRow, result: str, now: int) -> Settled:
    current = outbox.read(conn, entry.id)
    if current is None or current.state not in (outbox.WAKE, outbox.SENDING):
        return Settled(False, [])  # settled by someone else meanwhile
    unanswered = current.unanswered + (result == "unanswered")
    if result != "accepted" and unanswered < MAX_UNANSWERED:
        outbox.set_state(conn, entry.id, outbox.WAKE, now, unanswered=unanswered)
        return Settled(False, [], repeat=result == "unanswered")
    cursor = current.alive(conn)
    if cursor is None:
        outbox.set_state(conn, entry.id, outbox.GONE, now, unanswered=unanswered)
        return Settled(False, [])
    reopened = outbox.acknowledge(conn, [cursor], now)
    outbox.set_state(conn, entry.id, outbox.WOKEN, now, unanswered=unanswered)
    return Settled(True, reopened)


def release(conn: Conn, watcher: str, holder: str) -> None:
    """Step 4: the lease ends (if it is still ``holder``'s)."""
    conn.execute(
        "UPDATE sessionwatch_wakes SET holder = NULL, lease_until = 0"
        " WHERE watcher_session_key = ? AND holder = ?",
        (watcher, holder),
    )


def release_all(conn: Conn) -> int:
    """Every lease ends: the one sidecar that may deliver on this store starts, so whoever
    held them is gone (SQLite: one ``serve`` per database)."""
    return int(
        conn.execute(
            "UPDATE sessionwatch_wakes SET holder = NULL, lease_until = 0 WHERE holder IS NOT NULL"
        ).rowcount
    )
