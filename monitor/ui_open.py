"""``sessionwatch open``: a one-time link to the running ``serve``'s status page.

It asks ``POST /v1/ui/tickets`` with the API token and prints ``BASE/ui/login?ticket=...``:
the link works once, within a minute, and sets the page's cookie; the token itself never
goes into a URL or a browser's history.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import orjson

from monitor.config import Config
from monitor.errors import BadInput, SessionwatchError
from monitor.paths import expand_user
from monitor.private import read_secret

TIMEOUT_S = 10.0


def base_url(config: Config, given: str | None, db: Path | str | None = None) -> str:
    """Where ``serve`` answers: ``--url``, else the address the running ``serve`` of
    ``db`` wrote into its lock file (it keeps its listener across a reload that changed
    ``[api] listen``), else what ``[api] listen`` says. The token goes to this sidecar's
    own address only: a ``--url`` must name one of those (or a host of ``[api]
    allowed_hosts`` on the same port)."""
    served = _served(db)
    if given:
        if not given.startswith(("http://", "https://")):
            raise BadInput(f"--url must start with http:// or https://, got {given!r}")
        url = given.rstrip("/")
        own = [*served, *([] if _port_zero(config) else [_listen_url(config)])]
        if not _is_own(url, own, config.api.allowed_hosts):
            where = ", ".join(own) or "nowhere known: is serve running?"
            raise BadInput(
                f"--url {url} is not where this sidecar serves ({where}): the API token is"
                " sent to this sidecar's own address only"
            )
        return url
    if served:
        return served[0]
    return _listen_url(config)


def _served(db: Path | str | None) -> list[str]:
    if not isinstance(db, Path):
        return []
    from monitor.private import serving_addresses

    return [a.rstrip("/") for a in serving_addresses(db) if a.startswith("http://")]


def _host_port(url: str) -> tuple[str, int | None]:
    """Where ``url`` points: its host (lower case, no brackets) and port (the scheme's when
    none is written; None for one that is no port)."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = None
    return parts.hostname or "", port


def _is_own(url: str, own: list[str], allowed_hosts: tuple[str, ...]) -> bool:
    host, port = _host_port(url)
    places = [_host_port(o) for o in own]
    if (host, port) in places:
        return True
    allowed = {h.lower() for h in allowed_hosts}
    return host in allowed and port in {p for _, p in places}


def _port_zero(config: Config) -> bool:
    return config.api.listen.rpartition(":")[2] == "0"


def _listen_url(config: Config) -> str:
    listen = config.api.listen
    if listen.startswith("unix:"):
        raise BadInput(
            f"[api] listen is {listen}: a browser cannot reach a unix socket; listen on"
            " 127.0.0.1:PORT to read the status page"
        )
    host, _, port = listen.rpartition(":")
    if port == "0":
        raise BadInput(
            "[api] listen has port 0, chosen when serve starts: pass --url with the address"
            " serve names in its start-up line"
        )
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def open_link(config: Config, given: str | None, db: Path | str | None = None) -> str:
    base = base_url(config, given, db)
    token = read_secret(Path(expand_user(config.api.token_file)), "the API token file")
    request = urllib.request.Request(
        f"{base}/v1/ui/tickets",
        data=b"{}",
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
            answer = orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise SessionwatchError(
                f"serve at {base} refused the token in {config.api.token_file} (401)"
            ) from None
        raise SessionwatchError(f"serve at {base} answered {exc.code}") from None
    except (urllib.error.URLError, OSError, orjson.JSONDecodeError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SessionwatchError(f"serve does not answer at {base} ({reason})") from None
    path = answer.get("path") if isinstance(answer, dict) else None
    if not isinstance(path, str) or not path.startswith("/ui/login?"):
        raise SessionwatchError(f"serve at {base} gave no login link; is it sessionwatch?")
    return base + path
