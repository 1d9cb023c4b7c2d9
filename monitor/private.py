"""The files sessionwatch keeps private: the instance lock of a database, the modes of the
state files, the API token it makes, and secrets others made (the gateway's hooks token)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from monitor.errors import AlreadyRunning, ConfigError, NotPrivate

if TYPE_CHECKING:
    from contextlib import AsyncExitStack
from monitor.paths import make_private_dirs, refuse_if_not_ours

log = logging.getLogger(__name__)

SHORT_TOKEN = 16  # an API token shorter than this is said to be weak


class InstanceLock:
    """The locks :func:`take_instance_lock` holds; ``close`` lets them go."""

    def __init__(self, handles: list[IO[Any]]) -> None:
        self.handles = handles

    async def start(self, stack: AsyncExitStack, bus: object) -> None:
        """Held until ``stack`` closes: the first part started, the last let go."""
        stack.callback(self.close)

    def close(self) -> None:
        for handle in self.handles:
            handle.close()

    def say_serving(self, addresses: list[str]) -> None:
        """Write where this ``serve`` answers into its lock file, after its pid: ``open``
        reads it there (the configuration may have changed since, by a reload)."""
        if not self.handles:
            return
        handle = self.handles[0]
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n" + "".join(f"{a}\n" for a in addresses))
            handle.flush()
        except OSError as exc:  # `open` then finds the address in the configuration
            log.warning(
                "cannot write where serve answers into its lock file %s: %s",
                handle.name,
                os_reason(exc, Path(handle.name).parent),
            )


def serving_addresses(db: Path) -> list[str]:
    """The addresses the live ``serve`` of ``db`` answers on (from its lock file), or none
    when no ``serve`` holds it."""
    lines = _lock_lines(db)
    return lines[1:] if lines else []


def serving_pid(db: Path) -> int | None:
    """The pid of the live ``serve`` of ``db`` (from its lock file) when it is not this
    process, or None."""
    lines = _lock_lines(db)
    return int(lines[0]) if lines and int(lines[0]) != os.getpid() else None


def _lock_lines(db: Path) -> list[str] | None:
    """The lines of the lock file of ``db`` while the pid on its first line lives."""
    real = Path(os.path.realpath(db))
    try:  # read, never locked: a lock taken here could refuse a serve starting meanwhile
        lines = real.with_name(real.name + ".lock").read_text(encoding="utf-8").splitlines()
        os.kill(int(lines[0]), 0)  # its pid lives: a serve runs, and its addresses are current
    except (OSError, ValueError, IndexError):
        return None
    return lines


def pid_alive(pid: int) -> bool:
    """Whether a process of this pid exists on this machine (another user's too)."""
    if pid <= 0:  # 0 and below name process groups, not a process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    return True


def take_instance_lock(db: Path) -> InstanceLock:
    """One ``serve`` per database, whatever path names it: an exclusive lock on
    ``<db>.lock`` beside the real file (symlinks and ``..`` resolved; it holds the pid and
    the addresses ``open`` reads), and one on the database file itself (``flock``, which
    SQLite's own byte-range locks never touch), so that a hard link or a bind mount of the
    file is the same database too. Both are held until exit. The database file is created
    empty, mode 0600, when it is missing."""
    real = Path(os.path.realpath(db))
    handles: list[IO[Any]] = []
    try:
        handles.append(_lock(real.with_name(real.name + ".lock"), db))
        handles.append(
            _flocked(
                real,
                os.O_RDWR,
                "r+b",
                f"cannot create the state database {db}",
                lambda _: AlreadyRunning(
                    f"another sessionwatch serve is running on {db} under another name (a hard"
                    " link or a bind mount of the same file); refusing to start"
                ),
            )
        )
    except BaseException:
        InstanceLock(handles).close()
        raise
    return InstanceLock(handles)


def _flocked(
    path: Path, flags: int, mode: str, cannot: str, held: Callable[[IO[Any]], Exception]
) -> IO[Any]:
    """``path`` opened (made 0600 when missing) and locked exclusively without waiting:
    ConfigError ``cannot: why`` when it cannot be opened, ``held(its handle)`` when another
    process holds the lock."""
    try:
        fd = os.open(path, flags | os.O_CREAT, 0o600)
    except OSError as exc:
        raise ConfigError(f"{cannot}: {os_reason(exc, path.parent)}") from None
    handle = os.fdopen(fd, mode)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        refused = held(handle)
        handle.close()
        raise refused from None
    return handle


def _lock(path: Path, db: Path) -> IO[Any]:
    """The instance lock file, locked, with this process's pid in it."""
    cannot = f"cannot take the instance lock {path}"
    try:
        make_private_dirs(path.parent)  # the state directory
    except OSError as exc:
        raise ConfigError(f"{cannot}: {os_reason(exc, path.parent)}") from None

    def running(handle: IO[Any]) -> Exception:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        return AlreadyRunning(
            f"another sessionwatch serve (pid {holder}) is running on {db}; refusing to start"
        )

    handle = _flocked(path, os.O_RDWR | os.O_APPEND, "a+", cannot, running)
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
    except OSError as exc:
        with contextlib.suppress(OSError):  # its buffer cannot be written either
            handle.close()
        raise ConfigError(f"{cannot}: {os_reason(exc, path.parent)}") from None
    return handle


def refuse_if_shared(path: Path, what: str) -> None:
    """A state file that group or others can read is refused, as ssh refuses a key file."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"cannot check {what} {path}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{what} {path} is not a regular file")
    refuse_if_not_ours(path, what)
    if mode & 0o077:
        raise NotPrivate(
            f"{what} {path} is readable by others (mode {stat.S_IMODE(mode):04o});"
            f" run: chmod 600 {path}"
        )


def _state_files(db: Path) -> list[Path]:
    return [Path(f"{db}{suffix}") for suffix in ("", "-wal", "-shm")]


def loose_state_files(db: Path) -> list[Path]:
    """The database's files (itself, its ``-wal`` and ``-shm``) that group or others can
    read; a file that cannot be checked is left to :func:`check_private_state` to say."""
    loose = []
    for path in _state_files(db):
        try:
            mode = path.stat().st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode) and mode & 0o077:
            loose.append(path)
    return loose


def check_private_state(db: Path, *, ours: Callable[[Path], bool] | None = None) -> None:
    """Refuse a state database that others can read. With ``ours``, a database that
    sessionwatch itself made (its first release made its files 0644) is brought to 0600
    instead, said once in the log: an upgrade needs no manual step for a file the sidecar
    made. A database anyone else made (a gateway's) keeps the refusal."""
    loose = loose_state_files(db)
    if loose and ours is not None and ours(db):
        # reading it may have made its -shm, with the database's own loose mode
        loose = loose_state_files(db)
        was = {f"{stat.S_IMODE(path.stat().st_mode):04o}" for path in loose}
        for path in loose:
            try:
                path.chmod(0o600)
            except OSError as exc:
                raise ConfigError(f"cannot make {path} private: {exc.strerror}") from None
        log.warning(
            "the state database %s was made by an earlier sessionwatch with mode %s; %s set"
            " to 0600",
            db,
            "/".join(sorted(was)),
            ", ".join(p.name for p in loose),
        )
    for path in _state_files(db):
        refuse_if_shared(path, "the state database")


def load_token(path: Path) -> str:
    """The API token; a new random one is written with mode 0600 when the file is absent,
    or empty (an earlier release's start on a full disk left it so: it holds no secret). A
    new file takes its name only once whole, so a failed write leaves nothing behind. An
    existing one that others can read is refused."""
    refuse_if_shared(path, "the token file")
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        token = ""
    except OSError as exc:
        raise ConfigError(f"cannot read the API token file {path}: {exc.strerror}") from None
    if not token:
        empty = path.exists()
        token = secrets.token_urlsafe(32)
        if not write_private(path, token + "\n", "the API token file", replace=empty):
            return load_token(path)  # another serve made it meanwhile: theirs stands
        if empty:
            log.warning("the API token file %s was empty: wrote a new token in it", path)
        else:
            log.info("created the API token file %s", path)
        return token
    if len(token) < SHORT_TOKEN:
        log.warning(
            "the API token in %s is %d long, easy to guess; use at least %d characters"
            " (remove the file and serve makes a new one of 43)",
            path,
            len(token),
            SHORT_TOKEN,
        )
    return token


def write_private(path: Path, text: str, what: str, *, replace: bool = True) -> bool:
    """``text`` as the whole of ``path``, mode 0600, its missing directories made 0700: on a
    new file beside it, synced, then given the name, so that ``path`` is either as it was
    or whole. ``replace=False``: only when ``path`` does not exist (False when another
    process made it meanwhile: that one stands). A ConfigError names the cause (a full disk
    is not a permission)."""
    temp = path.with_name(f".{path.name}.new-{os.getpid()}")
    try:
        make_private_dirs(path.parent)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        if replace:
            os.replace(temp, path)
        else:
            try:
                os.link(temp, path)  # never over a file made meanwhile
            except FileExistsError:
                return False
            except OSError:  # a file system without hard links: a rename, checked just before
                if path.exists():
                    return False
                os.replace(temp, path)
            finally:
                temp.unlink(missing_ok=True)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {what} {path}: {os_reason(exc, path.parent)}") from None
    return True


def os_reason(exc: OSError, directory: Path) -> str:
    """Why a write failed, in words, with what to do: a full disk, a read-only file
    system and a directory this user may not write are three different fixes."""
    import errno

    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the disk is full ({exc.strerror}): free space on it, then start again"
    if exc.errno == errno.EROFS:
        return f"{directory} is on a read-only file system"
    return f"{exc.strerror or exc} (the directory {directory} must be writable by this user)"


def read_secret(path: Path, what: str) -> str:
    """A secret another program made (the gateway's hooks token): it must exist, be
    private, and hold one non-empty line."""
    refuse_if_shared(path, what)
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    if not secret:
        raise ConfigError(f"{what} {path} is empty")
    return secret
