"""The rig that proves each shipped alert by a run (tests/test_alerts_run.py and
tests/test_alerts_faults.py, two files so that their runs go side by side): a real
``serve`` at its default settings under libfaketime, its ``/metrics`` scraped each minute of
its time, and promtool firing the rules over what was scraped.

The serve lives through half an hour of its own time in under a minute: once it serves, it
runs under libfaketime at 40 times the speed (``+0 x40``, its wall and monotonic clocks
alike), so that its default tick interval (60 s) is 1.5 s here, and each scrape, 1.5 s
apart, is a minute of its time, as promtool's series step is. Nothing in the
serve is changed or configured for the test: its ticks, misses, retries and histograms run
on its own clocks, at their defaults.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import REPO, served_address

LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
RULES = REPO / "docs" / "monitoring" / "sessionwatch-alerts.yml"
MAIN = "agent:main:main"
KEY = "agent:main:adopted"
LINE = b'{"type":"user","uuid":"u1","cwd":"/srv","message":{"role":"user","content":"hi"}}\n'


def _needs() -> str | None:
    if not Path(LIB).exists():
        return "libfaketime is not installed (Debian's faketime)"
    if subprocess.run(["which", "promtool"], capture_output=True).returncode != 0:
        return "promtool is not installed (Debian's prometheus package)"
    return None


WHY = _needs()
if WHY and os.environ.get("SESSIONWATCH_REQUIRE_PROMTOOL"):
    raise RuntimeError(f"the alerts must be proven here, but {WHY}")
UNLESS_RUNNABLE = pytest.mark.skipif(WHY is not None, reason=WHY or "")


@dataclass
class Rig:
    """A scratch home, configuration and transcript for one run."""

    tmp: Path
    extra: str = ""  # more of the configuration
    env: dict[str, str] = field(default_factory=dict)
    transcript: Path = Path()

    def __post_init__(self) -> None:
        self.transcript = self.tmp / "claude" / "p" / "s1.jsonl"
        self.transcript.parent.mkdir(parents=True)
        self.transcript.write_bytes(LINE)
        keep = ("SESSIONWATCH_", "OPENCLAW_", "FAKETIME", "LD_PRELOAD")
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(keep)},
            "HOME": str(self.tmp / "home"),
            "SESSIONWATCH_DB": str(self.tmp / "state.db"),
            "SESSIONWATCH_CONFIG": str(self.tmp / "sw.toml"),
        }
        self.write_config()

    def write_config(self) -> None:
        (self.tmp / "sw.toml").write_text(
            f'[roots]\nclaude = "{self.tmp / "claude"}"\n[api]\nlisten = "127.0.0.1:0"\n'
            f'token_file = "{self.tmp / "token"}"\n{self.extra}'
        )

    def cli(self, *argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "monitor", *argv],
            cwd=REPO, env=self.env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (argv, done.stderr)
        return done.stdout

    def type(self, minute: int) -> None:
        """A person types a prompt into the adopted session (a uuid of the minute's)."""
        with self.transcript.open("ab") as f:
            f.write(LINE.replace(b'"u1"', f'"m{minute}"'.encode()))

    def adopt_and_watch(self) -> None:
        self.cli("adopt", "--kind", "claude", "--path", str(self.transcript),
                 "--session-key", KEY, "--session-id", "s1")  # fmt: skip
        self.cli("watch", "--watcher", MAIN, "--target", KEY)

    @contextlib.contextmanager
    def serving(self, speed: int = 40) -> Iterator[Scraper]:
        """The real serve, its clocks at ``speed`` times the speed once it serves, and a
        scraper of its /metrics that scrapes once a minute of the serve's time. It starts at
        the real speed (libfaketime reads its spec from a file at each clock read): a start
        on a loaded machine whose writes waited a moment would otherwise see its 5 s write
        timeout pass in a fraction of that."""
        spec = self.tmp / "faketime"
        spec.write_text("+0 x1\n")
        env = {
            **self.env,
            "LD_PRELOAD": LIB,
            "FAKETIME_TIMESTAMP_FILE": str(spec),
            "FAKETIME_NO_CACHE": "1",
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "monitor", "serve"],
            cwd=REPO, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        try:
            said: list[str] = []
            try:
                address = served_address(proc, said)
            except AssertionError:
                raise AssertionError("".join(said)) from None
            drain = threading.Thread(target=lambda: proc.stderr and proc.stderr.read())
            drain.start()
            token = (self.tmp / "token").read_text().strip()
            spec.write_text(f"+0 x{speed}\n")  # from here, a minute of its time is 60/speed s
            yield Scraper(address, token, proc.pid, minute_s=60 / speed)
        finally:
            proc.terminate()
            proc.wait(30)


Series = dict[str, float]  # a series (name{labels}) and its value


@dataclass
class Scraper:
    address: str
    token: str
    pid: int
    minute_s: float  # a minute of the serve's time, in seconds of ours
    scrapes: list[Series] = field(default_factory=list)

    def scrape(self) -> Series:
        request = urllib.request.Request(
            f"{self.address}/metrics", headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            text = answer.read().decode()
        found: Series = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.startswith("sessionwatch_") and not sample.name.endswith("_created"):
                    labels = ", ".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                    found[f"{sample.name}{{{labels}}}"] = sample.value
        return found

    def minutes(self, n: int, during: Callable[[int], None] = lambda minute: None) -> None:
        """``n`` scrapes, a minute of the serve's time apart."""
        start = time.monotonic()
        for minute in range(n):
            during(minute)
            self.scrapes.append(self.scrape())
            time.sleep(max(0.0, start + (minute + 1) * self.minute_s - time.monotonic()))


def fired(scrapes: list[Series], alert: str) -> list[dict[str, str]]:
    """The alerts named ``alert`` that the rules fire at any minute of the run (each, once),
    as promtool says when they are fed the scraped series, each scrape a minute apart."""
    names = sorted({s for scrape in scrapes for s in scrape})
    lines = ["rule_files: [" + str(RULES) + "]", "evaluation_interval: 1m", "tests:",
             "  - interval: 1m", "    input_series:"]  # fmt: skip
    for name in names:
        labelled = name.replace("{", '{instance="run", ', 1).replace(", }", "}")
        values = " ".join(_value(s.get(name)) for s in scrapes)
        lines += [f"      - series: '{labelled}'", f"        values: '{values}'"]
    lines.append("    alert_rule_test:")
    for minute in range(len(scrapes)):
        lines += [f"      - eval_time: {minute}m", f"        alertname: {alert}",
                  "        exp_alerts: []"]  # fmt: skip
    with tempfileish() as path:
        path.write_text("\n".join(lines) + "\n")
        done = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
    if done.returncode == 0:
        return []
    got = re.findall(r"Labels:\{([^}]*)\}", done.stdout + done.stderr)
    assert got, done.stdout + done.stderr  # a failure that is not a fired alert
    labels = [dict(re.findall(r'(\w+)="([^"]*)"', g)) for g in got]
    return [dict(t) for t in sorted({tuple(sorted(one.items())) for one in labels})]


def _value(v: float | None) -> str:
    if v is None:
        return "_"  # no sample: the series was not exported at that scrape
    return "Inf" if v == float("inf") else repr(float(v))


@contextlib.contextmanager
def tempfileish() -> Iterator[Path]:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder) / "run.test.yml"


def alert_names() -> list[str]:
    return re.findall(r"^\s+- alert: (\w+)", RULES.read_text(), re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def adopt_many(tmp: Path, files: list[Path]) -> None:
    """Adopt and watch many sessions at once, in this process (a command each would take
    a minute)."""
    from monitor.config import Config, RootsConfig
    from monitor.kernel import Kernel, KernelSettings
    from monitor.upstream import UpstreamMonitor

    kernel = await Kernel.open(tmp / "state.db", KernelSettings())
    try:
        monitor = UpstreamMonitor.from_config(
            kernel, Config(roots=RootsConfig(claude=str(tmp / "claude")))
        )
        for path in files:
            key = f"agent:main:{path.stem}"
            await monitor.adoption.adopt(
                kind="claude", path=str(path), session_key=key, session_id=path.stem
            )
            await kernel.watch(watcher=MAIN, target=key)
    finally:
        await kernel.close()
