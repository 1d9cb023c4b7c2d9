"""A command line read without argparse (monitor.cli.argv) reads as argparse reads it, or
is left to argparse; and the one-shot commands start without typing, pathlib or argparse."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.cli import COMMANDS, parse
from monitor.cli.argv import parse_plain
from monitor.cli.declare import GLOBALS, Args
from monitor.cli.parser import build_parser, command_of
from monitor.errors import BadInput
from tests.helpers import REPO

KEY = "agent:main:subagent:bench"
# what a hook or a gateway shells out to, as bench/cli.py times it
ONE_SHOT = {
    "status": ["status", KEY, "--changes-since", "0"],
    "record": ["record", "--session", KEY, "--kind", "human_direct_message", "--actor", "human"],
    "notices --drain": ["notices", "--watcher", "agent:main:main", "--drain"],
}


def _argparse(argv: list[str]) -> dict[str, Any] | None:
    """What argparse makes of ``argv``; None when it refuses it or prints help."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return vars(build_parser(command_of(argv)).parse_args(argv, namespace=Args()))
    except (BadInput, SystemExit):
        return None


VALUES = ["7", "0", "-1", "", "x y", "agent:main:main", "human", "json", "plain", "claude"]
NOISE = ["--", "-h", "--help", "--se", "--unknown", "-", "--db", "--log-format", "7", "x"]


def _given(
    draw: st.DrawFn, arguments: tuple[tuple[tuple[str, ...], dict[str, Any]], ...]
) -> list[str]:
    """Words for declared ``arguments``, as a person might give them: every positional
    (``?`` and ``*`` ones some of the time), every required flag and some others, in any
    order, some before the positionals, spelled ``--flag VALUE`` or ``--flag=VALUE``,
    values of every shape a type or choices may refuse."""
    positionals: list[str] = []
    flags: list[list[str]] = []
    for names, options in arguments:
        if not names[0].startswith("-"):
            count = {"?": draw(st.integers(0, 1)), "*": draw(st.integers(0, 2))}
            positionals += [
                draw(st.sampled_from(VALUES)) for _ in range(count.get(options.get("nargs"), 1))
            ]
        elif options.get("required") or draw(st.booleans()):
            flag = draw(st.sampled_from(names))
            if options.get("action") == "store_true":
                flags.append([flag])
            elif draw(st.booleans()):
                flags.append([flag, draw(st.sampled_from(VALUES))])
            else:
                flags.append([f"{flag}={draw(st.sampled_from(VALUES))}"])
    order = draw(st.permutations(flags))
    first = draw(st.integers(0, len(order)))  # flags before the positionals, then the rest
    before = [word for flag in order[:first] for word in flag]
    return [*before, *positionals, *(word for flag in order[first:] for word in flag)]


@st.composite
def _command_lines(draw: st.DrawFn) -> list[str]:
    """A command line of a declared command, then some of the time a few words put
    anywhere in it that only argparse reads (or refuses)."""
    command = draw(st.sampled_from(sorted(COMMANDS)))
    words = [*_given(draw, GLOBALS), command, *_given(draw, COMMANDS[command].arguments)]
    for _ in range(draw(st.integers(0, 2))):
        words.insert(draw(st.integers(0, len(words))), draw(st.sampled_from(NOISE)))
    return words


@settings(max_examples=3000, deadline=None)
@given(argv=_command_lines())
def test_a_plain_reading_is_argparses_own(argv: list[str]) -> None:
    """Whatever the words, a command line read plainly gives argparse's namespace, and one
    argparse refuses is never read plainly."""
    plain = parse_plain(argv)
    if plain is not None:
        assert _argparse(argv) == vars(plain)


def test_the_one_shot_commands_are_read_plainly() -> None:
    """The lines a hook runs, with the globals before them, never build a parser."""
    for argv in ONE_SHOT.values():
        for line in (argv, ["--db", "/tmp/x.db", *argv], ["--config=/c.toml", *argv]):
            plain = parse_plain(line)
            assert plain is not None, line
            assert _argparse(line) == vars(plain)


def test_a_wrong_line_is_still_explained_by_argparse() -> None:
    """Left to argparse, a wrong line raises its one-line message with the usage."""
    for argv, says in [
        (["status"], "the following arguments are required: key"),
        (["status", KEY, "--changes-since", "-3"], "must not be negative"),
        (["record", "--session", KEY], "the following arguments are required: --kind"),
        (["notices", "--watcher"], "expected one argument"),
    ]:
        assert parse_plain(argv) is None
        try:
            parse(argv)
        except BadInput as exc:
            assert says in str(exc), exc
            assert "usage: sessionwatch" in str(exc)
        else:
            raise AssertionError(f"{argv} was accepted")


def _heavy_modules_loaded(argv: list[str], env: dict[str, str]) -> tuple[list[str], str]:
    """Which of the modules that cost a start-up most ``sessionwatch ARGV`` loads (it must
    succeed), and what it printed; run without site, so that an editable install's finder
    (which imports pathlib itself) does not hide them."""
    found = [str(REPO), *sorted({sysconfig.get_path(p) for p in ("purelib", "platlib")})]
    probe = (
        "import sys\n"
        f"sys.path[:0] = {found!r}\n"
        "import orjson\n"
        "before = set(sys.modules)\n"
        "from monitor.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "heavy = ('typing', 'pathlib', 'argparse', 'asyncio', 'urllib.parse', 'gettext')\n"
        "loaded = [m for m in heavy if m in sys.modules and m not in before]\n"
        "sys.stderr.write(orjson.dumps(loaded).decode())\n"
        "raise SystemExit(code)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-S", "-c", probe, *argv],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert 0 == proc.returncode, proc.stderr
    loaded: list[str] = orjson.loads(proc.stderr)
    return loaded, proc.stdout


def test_the_one_shot_commands_load_no_typing_pathlib_or_argparse(tmp_path: Path) -> None:
    """``status``, ``record`` and ``notices --drain`` run without the modules that cost
    their start-up most (each some milliseconds; bench/cli.py measures the whole): on a
    given database, and next to OpenClaw with no configuration (its state database found
    through ``$OPENCLAW_STATE_DIR``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SESSIONWATCH_", "OPENCLAW_"))}
    spawn = ["spawn", "--parent", "agent:main:main", "--child", KEY, "--run-id", "r"]
    db = str(tmp_path / "state.db")
    for argv in [spawn, *ONE_SHOT.values()]:
        assert [] == _heavy_modules_loaded(["--db", db, *argv], env)[0], argv
    state = tmp_path / "openclaw"
    (state / "state").mkdir(parents=True)
    next_to_openclaw = {**env, "OPENCLAW_STATE_DIR": str(state)}
    _heavy_modules_loaded(["--db", str(state / "state" / "openclaw.sqlite"), *spawn], env)
    for argv in ONE_SHOT.values():
        assert [] == _heavy_modules_loaded(argv, next_to_openclaw)[0], argv
    status = _heavy_modules_loaded(["status", KEY], next_to_openclaw)[1]
    assert 1 <= orjson.loads(status)["stateVersion"]  # the child spawned in OpenClaw's own
