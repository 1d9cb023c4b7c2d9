"""``~`` in paths a person or a client gives, and the private directories we create."""

from __future__ import annotations

import contextlib
import os

from monitor.errors import BadInput, ConfigError


def expand_user(path: str | os.PathLike[str]) -> str:
    """``path`` with ``~`` or ``~user`` expanded; a home that cannot be found is refused,
    never taken as a directory literally named ``~user`` (nor raised as a RuntimeError),
    and so is a NUL byte (which the system calls refuse with a ValueError)."""
    text = os.fspath(path)
    if "\x00" in text:
        raise BadInput("a path cannot hold a NUL byte")
    expanded = os.path.expanduser(text)
    if expanded.startswith("~"):
        user = text[1:].split("/", 1)[0]
        raise BadInput(f"cannot expand {text!r}: no home directory for user {user!r}")
    return expanded


def make_private_dirs(directory: str | os.PathLike[str]) -> None:
    """Create ``directory`` and each missing parent readable by their owner only (0700),
    outermost first: ``mkdir -p`` would leave the parents it creates open to everyone."""
    missing: list[str] = []
    at = os.path.normpath(os.fspath(directory))
    while not os.path.exists(at):
        missing.append(at)
        parent = os.path.dirname(at) or "."
        if parent == at:
            break
        at = parent
    home = os.path.expanduser("~")
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another: theirs
            try:
                os.mkdir(path, mode=0o700)
            except PermissionError:
                if home in missing or not os.path.isdir(home):  # HOME unset, or wrong
                    raise ConfigError(
                        f"cannot create {directory}: the home directory {home} does not exist"
                        " (HOME is unset or names a missing directory): set HOME, or name"
                        " the path in the configuration"
                    ) from None
                raise


def refuse_if_not_ours(path: str | os.PathLike[str], what: str) -> None:
    """A file of another user's that this one cannot read and write (the gateway's state
    database, when the gateway runs as its own user) is refused, saying who must run it."""
    try:
        owner = os.stat(path).st_uid
    except OSError:
        return
    if owner != os.getuid() and not os.access(path, os.R_OK | os.W_OK):
        raise ConfigError(
            f"{what} {path} belongs to {_user(owner)}, and this sidecar runs as"
            f" {_user(os.getuid())}: run the sidecar as {_user(owner)} (the gateway's user,"
            " in that user's systemd unit)"
        )


def _user(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
