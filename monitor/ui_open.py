"""``sessionwatch open``: a one-time link to the running ``serve``'s status page.

It asks ``POST /v1/ui/tickets`` with the API token and prints ``BASE/ui/login?ticket=...``:
the link works once, within a minute, and sets the page's cookie; the token itself never
goes into a URL or a browser's history.
"""

from __future__ import annotations

import urllib.error
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
    ``[api] listen``), else what ``[api] listen`` says."""
    if given:
        if not given.startswith(("http://", "https://")):
            raise BadInput(f"--url must start with http:// or https://, got {given!r}")
        return given.rstrip("/")
    if isinstance(db, Path):
        from monitor.private import serving_addresses

        served = [a for a in serving_addresses(db) if a.startswith("http://")]
        if served:
            return served[0].rstrip("/")
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
