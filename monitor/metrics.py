"""Prometheus metrics of one running sidecar (``GET /metrics``).

Each :class:`Metrics` owns its registry, so several sidecars in one process (the tests) do
not share counters.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# What a wake call can come to (``sessionwatch_wake_calls_total``'s ``result``)
WAKE_RESULTS = (
    "accepted",
    "refused",
    "unauthorized",
    "throttled",
    "redirected",
    "no_token",
    "failed",
    "unanswered",
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self, event_kinds: Iterable[str] = ()) -> None:
        """``event_kinds``: the kinds whose counters start at 0 (the signal log's)."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.events = Counter(
            "sessionwatch_events_recorded_total",
            "State events recorded, by kind",
            ["kind"],
            registry=r,
        )
        self._events_of: dict[str, Any] = {}  # kind -> its labelled child of ``events``
        self.notices_queued = Counter(
            "sessionwatch_notices_queued_total", "Stale-state notices opened", registry=r
        )
        self.notices_drained = Counter(
            "sessionwatch_notices_drained_total", "Notices returned and acknowledged", registry=r
        )
        self.wake_repeats = Counter(
            "sessionwatch_wake_repeats_allowed_total",
            "Wake calls allowed their one repeat, by why: unanswered (no whole answer once"
            " the request went out, or the connection cut after it), taken_over (the"
            " sidecar that made the call did not record its outcome before its wake lease"
            " ran out: it died, or the store was unreachable from it until then)",
            ["reason"],
            registry=r,
        )
        self.notices_woken = Counter(
            "sessionwatch_notices_delivered_by_wake_total",
            "Notices the gateway accepted in a wake, acknowledged as delivered",
            registry=r,
        )
        self.link_write_failures = Counter(
            "sessionwatch_link_write_failures_total",
            "A link's findings the store refused for a reason of that write's own (a constraint,"
            " a trigger); the link's marker stays and the tick goes on",
            registry=r,
        )
        self.ticks = Counter(
            "sessionwatch_ticks_total",
            "Monitor ticks run (a scheduled tick with nothing to read is left out)",
            registry=r,
        )
        self.tick_seconds = Histogram(
            "sessionwatch_tick_duration_seconds",
            "Duration of monitor ticks",
            # up to minutes: a tick over the adapter budget (45 s) must be visible
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 15, 30, 45, 60, 120, 300),
            registry=r,
        )
        self.outcomes = Counter(
            "sessionwatch_link_outcomes_total",
            "Tick outcomes, by adapter and outcome",
            ["adapter", "outcome"],
            registry=r,
        )
        self.links_now = Gauge(
            "sessionwatch_links",
            "Watched links by adapter and the outcome of their last check (quiet, activity,"
            " missing, inconclusive, blocked, skipped), set at each tick",
            ["adapter", "outcome"],
            registry=r,
        )
        self.undecided_notices = Gauge(
            "sessionwatch_notices_undecided",
            "Pending notices an upgrade could not tell from the gateway's own, left to the"
            " gateway until a change on their pair (counted at start)",
            registry=r,
        )
        self.sessions_doing = Gauge(
            "sessionwatch_adopted_sessions_doing",
            "Adopted sessions by what they are doing now (working, waiting, asking, quiet,"
            " unknown), set at each scrape",
            ["state"],
            registry=r,
        )
        self.doing_longest = Gauge(
            "sessionwatch_adopted_sessions_longest_seconds",
            "How long the adopted session doing each state the longest has done it, by its"
            " records (0: none does), set at each scrape",
            ["state"],
            registry=r,
        )
        self.waited = Histogram(
            "sessionwatch_waited_for_person_seconds",
            "How long an adopted session waited for a person (its turn ended, or it asked)"
            " before the next turn began, observed by the sidecar that read that turn",
            buckets=(10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 86400),
            registry=r,
        )
        self.blocked_links = Gauge(
            "sessionwatch_blocked_links",
            "Links blocked at a line longer than max_line_bytes",
            registry=r,
        )
        self.shared_lease = Gauge(
            "sessionwatch_shared_lease",
            "1 while this sidecar ticks the links without a host (a shared store's lease)",
            registry=r,
        )
        self.db_errors = Counter(
            "sessionwatch_database_errors_total",
            "State database operations that failed",
            registry=r,
        )
        self.wakes = Counter(
            "sessionwatch_wake_calls_total",
            "Wake calls to the gateway's hooks API, by result: accepted, refused (400),"
            " unauthorized (401), throttled (429), redirected (3xx, never followed),"
            " no_token (the token cannot be read: no call), failed (5xx, a refused"
            " connection, no connection in time: the gateway never had it), unanswered (no"
            " answer once the request went out: the gateway may have taken it; sent at most"
            " once more)",
            ["result"],
            registry=r,
        )

        # Each known label set starts at 0, so that an alert's increase() sees its first
        # event (a series born at 1 has no increase in Prometheus's eyes)
        for kind in event_kinds:
            self._events_of[kind] = self.events.labels(kind)
        for result in WAKE_RESULTS:
            self.wakes.labels(result)

        self.drift_unknown = Counter(
            "sessionwatch_drift_unknown_records_total",
            "Records of a type the adapter never saw, by adapter and type",
            ["adapter", "type"],
            registry=r,
        )
        self.drift_unclassified = Counter(
            "sessionwatch_drift_unclassified_user_records_total",
            "Records that look like a user's but that no rule classifies, by adapter",
            ["adapter"],
            registry=r,
        )
        self.drift_newer_version = Gauge(
            "sessionwatch_drift_newer_version",
            "1 for a format version newer than the adapter was tested on",
            ["adapter", "version"],
            registry=r,
        )
        self.invalid_lines = Counter(
            "sessionwatch_invalid_lines_total",
            "Complete transcript lines that are not JSON at all, by adapter",
            ["adapter"],
            registry=r,
        )

    def recorded(self, kind: str, notices: int) -> None:
        """An event of ``kind`` recorded, opening ``notices`` notices. On every request's
        path, so each kind's labelled child is looked up once, not per event."""
        child = self._events_of.get(kind)
        if child is None:
            child = self._events_of[kind] = self.events.labels(kind)
        child.inc()
        if notices:
            self.notices_queued.inc(notices)

    def render(self) -> bytes:
        return generate_latest(self.registry)
