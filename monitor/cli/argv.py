"""A command line read without argparse, when every word of it is plain.

argparse costs a one-shot command (``status``, ``record``, ``notices --drain``) about 7 ms of
its start-up: its import, its parsers, and gettext's look-up of a translation for each of
their strings. A command line that gives the globals, then a command, then that command's
positionals, then its declared flags, each spelled out, is read here into the namespace
argparse makes of it; so is one whose flags come before the positionals, or some before
and the rest after them (``replay --adapter claude FILE``).

Anything else returns None and goes to argparse (:mod:`monitor.cli.parser`), which reads it or
explains what is wrong in its words: ``--help``, an abbreviated or unknown flag, ``--``, a
value that starts with ``-``, a missing argument, a value its type or its choices refuse, a
positional after a flag. ``tests/test_cli_argv.py`` holds the two to the same answer.
"""

from __future__ import annotations

from monitor.cli.declare import COMMANDS, GLOBALS, Args

TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

    from monitor.cli.declare import Argument

    Spec = dict[str, Any]  # an argument's add_argument options, with its "dest"

# what the options of a flag may be for it to be read here (argparse reads the rest)
_OPTION_KEYS = frozenset({"help", "type", "choices", "default", "required", "metavar", "action"})
_ACTIONS = (None, "store", "store_true", "append")
_POSITIONAL_KEYS = frozenset({"help", "type", "choices", "metavar", "nargs"})
_NARGS = (None, "?", "*")


class _Unplain(Exception):
    """A word (or a declaration) argparse must read."""


def parse_plain(argv: list[str]) -> Args | None:
    """``argv`` as argparse would parse it, or None when argparse must read it."""
    try:
        return _parse(argv)
    except _Unplain:
        return None


def _parse(argv: list[str]) -> Args:
    values: dict[str, Any] = {}
    global_flags = _flags(GLOBALS)
    at = _options(argv, 0, global_flags, values, stop_at_word=True)
    if at == len(argv) or argv[at] not in COMMANDS:
        raise _Unplain
    command = argv[at]
    declared = COMMANDS[command].arguments
    flags = _flags(tuple(a for a in declared if a[0][0].startswith("-")))
    positionals = [_positional(a) for a in declared if not a[0][0].startswith("-")]
    at += 1
    at = _options(argv, at, flags, values, stop_at_word=True)
    words = []
    while at < len(argv) and not argv[at].startswith("-"):
        words.append(argv[at])
        at += 1
    values.update(_assign(positionals, words))
    _options(argv, at, flags, values, stop_at_word=False)  # to the end, or _Unplain
    for spec in (*global_flags.values(), *flags.values()):
        if spec["dest"] not in values:
            if spec.get("required"):
                raise _Unplain  # argparse names what is missing
            default = spec.get("default", False if spec.get("action") == "store_true" else None)
            if isinstance(default, str):  # argparse converts a text default as given text
                default = _value(spec, default)
            values[spec["dest"]] = (
                list(default or ()) if spec.get("action") == "append" else default
            )
    return Args(**values, command=command)


def _flags(arguments: tuple[Argument, ...]) -> dict[str, Spec]:
    """Each flag's spec: ``--changes-since`` is read into ``changes_since``."""
    out: dict[str, Spec] = {}
    for names, options in arguments:
        if set(options) - _OPTION_KEYS or options.get("action") not in _ACTIONS:
            raise _Unplain
        long = next((n for n in names if n.startswith("--")), names[0])
        spec = {**options, "dest": long.lstrip("-").replace("-", "_")}
        for name in names:
            out[name] = spec
    return out


def _positional(argument: Argument) -> Spec:
    names, options = argument
    if len(names) != 1 or set(options) - _POSITIONAL_KEYS or options.get("nargs") not in _NARGS:
        raise _Unplain
    return {**options, "dest": names[0]}


def _assign(positionals: list[Spec], words: list[str]) -> dict[str, Any]:
    """The positionals, in their order: one word each; ``?`` one if there is one left (else
    its default), ``*`` every word left."""
    out: dict[str, Any] = {}
    left = list(words)
    for spec in positionals:
        nargs = spec.get("nargs")
        if nargs is None:
            if not left:
                raise _Unplain  # argparse names what is missing
            out[spec["dest"]] = _value(spec, left.pop(0))
        elif nargs == "?":
            out[spec["dest"]] = _value(spec, left.pop(0)) if left else None
        else:
            out[spec["dest"]] = [_value(spec, w) for w in left]
            left = []
    if left:
        raise _Unplain
    return out


def _options(
    argv: list[str], at: int, flags: dict[str, Spec], values: dict[str, Any], *, stop_at_word: bool
) -> int:
    """Read flags from ``argv[at]`` on, into ``values``; where they end."""
    while at < len(argv):
        word = argv[at]
        if not word.startswith("-"):
            if stop_at_word:
                return at
            raise _Unplain  # a positional after a flag
        name, equals, given = word.partition("=")
        spec = flags.get(name)
        if spec is None:
            raise _Unplain
        if spec.get("action") == "store_true":
            if equals:
                raise _Unplain
            values[spec["dest"]] = True
            at += 1
            continue
        if not equals:
            if at + 1 == len(argv) or argv[at + 1].startswith("-"):
                raise _Unplain
            given = argv[at + 1]
            at += 1
        value = _value(spec, given)
        if spec.get("action") == "append":
            values.setdefault(spec["dest"], list(spec.get("default") or ())).append(value)
        else:
            values[spec["dest"]] = value
        at += 1
    return at


def _value(spec: Spec, word: str) -> Any:
    """The word through the argument's type, if its choices take it."""
    convert = spec.get("type")
    try:
        value = word if convert is None else convert(word)
    except Exception:  # argparse explains it, in the usage line
        raise _Unplain from None
    if "choices" in spec and value not in spec["choices"]:
        raise _Unplain
    return value
