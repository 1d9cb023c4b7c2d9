"""``SIGHUP`` (and ``systemctl reload``): read the configuration again, without a restart.

What applies live: the roots and the paired nodes (the adapters are built again from them),
the gateway's hooks (its URL, its token file, the retry interval), the tick's
``[monitor] interval_s`` (from the next tick on: the wait in course is measured again) and
the log level. What cannot (the store, the listen address and the rest of ``[api]``, the
monitor's other settings, the session rules, the host id) is named as needing a restart. A
file that does not parse is refused, said once, and the configuration in force stays.

The configuration in force is a component (:class:`ConfigInForce`): it holds the one in
force, and on ``SIGHUP`` reads, validates and diffs the file (:func:`reload`) and publishes
:class:`~monitor.kernel.bus.ConfigReloaded` (the old one and the new) on the bus. Each part
applies its own section: the adapters are built again (the upstream monitor), the hooks
client takes ``[gateway]``, the tick schedule its interval, node watching its nodes, and
file and node watching look at what they watch again.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from adapters.registry import build_adapters, roots_of
from monitor.config import Config, load_config
from monitor.errors import BadInput, ConfigError, SessionwatchError
from monitor.kernel.bus import Bus, ConfigReloaded
from monitor.upstream.monitor import adapter_settings

if TYPE_CHECKING:
    from contextlib import AsyncExitStack

log = logging.getLogger(__name__)

LIVE = ("roots", "nodes", "gateway", "log")


class ConfigInForce:
    """The configuration in force (:attr:`config`); with ``hangup``, ``SIGHUP`` reads
    ``path`` again (None: ``$SESSIONWATCH_CONFIG``, else the defaults, as at start) and
    publishes what changed. ``wakes``: the service wakes a gateway (turning wakes on or off
    needs a restart)."""

    def __init__(
        self, config: Config, path: Path | str | None, *, wakes: bool, hangup: bool = False
    ) -> None:
        self.config = config
        self.path = path
        self.wakes = wakes
        self.hangup_reloads = hangup
        self._bus: Bus | None = None

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        """Listen for ``SIGHUP`` until ``stack`` closes (``serve``: one per process)."""
        self._bus = bus
        if not self.hangup_reloads:
            return
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, self.hangup)
        stack.callback(loop.remove_signal_handler, signal.SIGHUP)

    def hangup(self) -> None:
        old = self.config
        self.config = reload(old, self.path, wakes=self.wakes)
        if self.config is not old and self._bus is not None:
            self._bus.publish(ConfigReloaded(old, self.config))


def changed_sections(old: Config, new: Config) -> list[str]:
    return [name for name in Config._fields if getattr(old, name) != getattr(new, name)]


def _level(name: str) -> int:
    return int(logging.getLevelName(name.upper()))


def _token_file_usable(config: Config) -> bool:
    """The hooks token file as serve checks it at start (private, readable, not empty):
    whether the configuration changed or not, a file that became unusable is said."""
    from monitor.paths import expand_user
    from monitor.private import read_secret

    try:
        read_secret(Path(expand_user(config.gateway.hooks_token_file)), "the hooks token file")
    except SessionwatchError as exc:
        log.error("%s; wakes fail until it is fixed (serve refuses it at start)", exc)
        return False
    return True


def reload(current: Config, path: Path | str | None, *, wakes: bool) -> Config:
    """The configuration in force after a reload (the new one, or ``current`` when the
    file is refused). Says what changed, what applies and what needs a restart; the parts
    apply theirs when it is published."""
    try:
        new = load_config(path)
        roots_of(new.roots.given)  # its [roots] keys are the formats' own
    except (ConfigError, BadInput) as exc:
        log.error("configuration not reloaded, the one in force stays: %s", exc)
        return current
    interval = new.monitor.interval_s
    if interval != current.monitor.interval_s:  # live, whatever else [monitor] changed
        current = current._replace(monitor=current.monitor._replace(interval_s=interval))
        log.info("the tick's interval is now %g s, from the next tick", interval)
    elif not changed_sections(current, new):
        log.info("configuration reloaded: nothing changed in it")
    changed = changed_sections(current, new)
    if wakes and new.gateway.wakes and not _token_file_usable(new):
        changed = [s for s in changed if s != "gateway"]  # its token file said why
    if not changed:
        return current
    louder = _level(new.log.level) < _level(current.log.level)
    if "log" in changed and louder:  # first, so that what the reload did is said at all
        logging.getLogger().setLevel(new.log.level.upper())
    wakes_live = wakes and new.gateway.wakes  # turning wakes on or off: restart
    applied = [s for s in changed if s in LIVE and (s != "gateway" or wakes_live)]
    restart = [s for s in changed if s not in applied]
    try:
        if "roots" in applied or "nodes" in applied:
            build_adapters(adapter_settings(new))  # what the monitor builds: refused here
    except SessionwatchError as exc:
        log.error("configuration not reloaded, the one in force stays: %s", exc)
        return current
    if applied:
        log.info("configuration reloaded: %s changed and applied", ", ".join(applied))
    if restart:
        log.warning(
            "configuration: %s changed but apply only at a restart; the running values stay",
            ", ".join(restart),
        )
    if "log" in applied and not louder:  # last: what the reload did is said at the old level
        logging.getLogger().setLevel(new.log.level.upper())
    # The sections that apply only at a restart keep their running values.
    kept = {s: getattr(current, s) for s in changed if s not in applied}
    return new._replace(**kept)
