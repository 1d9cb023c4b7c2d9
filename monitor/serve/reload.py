"""``SIGHUP`` (and ``systemctl reload``): read the configuration again, without a restart.

Each running part says which of its fields apply live, checking them as it does
(:class:`LiveConfig`): the upstream monitor its roots and nodes (the adapters are built
again; roots or nodes the formats refuse refuse the file), the hooks client ``[gateway]``
(while the service wakes a gateway), the tick schedule ``[monitor] interval_s`` (from the
next tick on) and :class:`LogLevel` ``[log] level``. A reload applies those, and names field
by field what changed but waits for a restart (the store, ``[api]``, the monitor's other
settings, the session rules, the host id). A file that does not parse, or that a part
refuses, is refused, said once, and the configuration in force stays.

The configuration in force is a component (:class:`ConfigInForce`): on ``SIGHUP`` it reads
the file, asks each running part that applies configuration live (those of the service's
:class:`~monitor.serve.components.Parts`, none listed by hand), diffs (:func:`reload`) and
publishes
:class:`~monitor.kernel.bus.ConfigReloaded` (the old one and the new) on the bus; each part
applies its own fields when it hears it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from adapters.registry import roots_of
from monitor.config import Config, RootsConfig, load_config
from monitor.errors import BadInput, ConfigError, SessionwatchError
from monitor.kernel.bus import Bus, ConfigReloaded

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence
    from contextlib import AsyncExitStack

log = logging.getLogger(__name__)


@runtime_checkable
class LiveConfig(Protocol):
    """A part that applies some of its configuration live, on :class:`ConfigReloaded`."""

    def live_fields(self, new: Config) -> tuple[str, ...]:
        """The fields of ``new`` it applies when reloaded to it: ``section`` (all of it) or
        ``section.field``; none when it cannot take ``new`` live (said why, once). Raises
        :class:`~monitor.errors.SessionwatchError` when ``new`` must be refused whole."""
        ...


class LogLevel:
    """``[log] level``, applied live."""

    def live_fields(self, new: Config) -> tuple[str, ...]:
        return ("log.level",)

    async def start(self, stack: AsyncExitStack, bus: Bus) -> None:
        stack.enter_context(bus.subscribe(ConfigReloaded, self._reloaded))

    def _reloaded(self, change: ConfigReloaded) -> None:
        if change.new.log.level != change.old.log.level:
            logging.getLogger().setLevel(change.new.log.level.upper())


class Reloaded(NamedTuple):
    """What a reload changed: the configuration now in force, the fields applied and those
    that wait for a restart."""

    config: Config
    applied: list[str]
    restart: list[str]

    def say(self) -> None:
        if self.applied:
            log.info("configuration reloaded: %s changed and applied", ", ".join(self.applied))
        elif not self.restart:
            log.info("configuration reloaded: nothing changed in it")
        if self.restart:
            log.warning(
                "configuration: %s changed but apply only at a restart; the running values stay",
                ", ".join(self.restart),
            )


class ConfigInForce:
    """The configuration in force (:attr:`config`); with ``hangup``, ``SIGHUP`` reads
    ``path`` again (None: ``$SESSIONWATCH_CONFIG``, else the defaults, as at start) and
    publishes what changed; each of ``parts`` that is a :class:`LiveConfig` says which of
    its fields apply live (the service's running parts: read at each reload)."""

    def __init__(
        self,
        config: Config,
        path: Path | str | None,
        *,
        parts: Sequence[object] = (),
        hangup: bool = False,
    ) -> None:
        self.config = config
        self.path = path
        self.parts = parts
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
        done = reload(old, self.path, [p for p in self.parts if isinstance(p, LiveConfig)])
        if done is None:
            return
        self.config = done.config
        louder = _level(done.config.log.level) < _level(old.log.level)
        if not louder:  # said at the level in force, before it changes
            done.say()
        if self.config != old and self._bus is not None:
            self._bus.publish(ConfigReloaded(old, self.config))
        if louder:  # said once the level that lets it be heard applies
            done.say()


def changed_fields(old: Config, new: Config) -> Iterator[str]:
    """Each field that differs, as ``section.field`` (a section without fields, such as
    ``nodes``, as its name)."""
    for name in Config._fields:
        before, after = getattr(old, name), getattr(new, name)
        if before == after:
            continue
        if isinstance(before, RootsConfig):
            keys = sorted({*before.given, *after.given})
            yield from (f"roots.{k}" for k in keys if before.given.get(k) != after.given.get(k))
        elif hasattr(before, "_fields"):
            yield from (
                f"{name}.{f}" for f in before._fields if getattr(before, f) != getattr(after, f)
            )
        else:
            yield name


def _level(name: str) -> int:
    return int(logging.getLevelName(name.upper()))


def _covered(field: str, live: set[str]) -> bool:
    return field in live or field.partition(".")[0] in live


def _with(current: Config, new: Config, fields: list[str]) -> Config:
    """``current`` with ``fields`` taken from ``new``."""
    out = current
    for field in fields:
        section, _, name = field.partition(".")
        if not name or section == "roots":  # [roots] is taken whole
            out = out._replace(**{section: getattr(new, section)})
        else:
            part = getattr(out, section)._replace(**{name: getattr(getattr(new, section), name)})
            out = out._replace(**{section: part})
    return out


def reload(
    current: Config, path: Path | str | None, parts: Iterable[LiveConfig]
) -> Reloaded | None:
    """What a reload to the file changes: the fields the parts apply live, taken from it,
    and those that wait for a restart (the running values stay). None when the file is
    refused (said): it does not parse, or a part refuses it."""
    try:
        new = load_config(path)
        roots_of(new.roots.given)  # its [roots] keys are the formats' own
        live = {f for part in parts for f in part.live_fields(new)}
    except (ConfigError, BadInput, SessionwatchError) as exc:
        log.error("configuration not reloaded, the one in force stays: %s", exc)
        return None
    changed = list(changed_fields(current, new))
    applied = [f for f in changed if _covered(f, live)]
    restart = [f for f in changed if not _covered(f, live)]
    return Reloaded(_with(current, new, applied), applied, restart)
