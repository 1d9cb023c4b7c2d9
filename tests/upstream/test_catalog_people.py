"""Adoption that yields a monitored session, and the catalog for people: titles, filters,
fuzzy search, the adopted key, the short id, a table that fits 100 columns."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.helpers import Client
from tests.test_cli import sw

WATCHER = "agent:main:main"


def _claude(root: Path, name: str, prompt: str, *, cwd: str, title: str | None = None) -> Path:
    path = root / "proj" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    records = [
        {"type": "summary", "summary": "ignored"},
        {"type": "user", "uuid": f"{name}-0", "cwd": cwd,
         "message": {"role": "user", "content": "<ide_opened_file>x</ide_opened_file>"}},
        {"type": "user", "uuid": f"{name}-1", "cwd": cwd,
         "message": {"role": "user", "content": f"{prompt}\n\nsecond line"}},
    ]  # fmt: skip
    if title:
        records.append({"type": "custom-title", "customTitle": title})
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


@pytest.fixture
def sessions(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "claude"
    config = tmp_path / "c.toml"
    config.write_text(f'[roots]\nclaude = "{root}"\ncodex = "{tmp_path / "codex"}"\n')
    billing = _claude(root, "billing", "Fix the failing billing tests", cwd="/w/shop")
    _claude(root, "login", "Refactor the login page", cwd="/w/web")
    _claude(root, "docs", "write docs for the API", cwd="/w/api", title="API docs pass")
    old = _claude(root, "old", "an old session about flaky tests", cwd="/w/ci")
    past = time.time() - 3 * 86400
    os.utime(old, (past, past))
    return config, billing


def _catalog(tmp_path: Path, config: Path, *args: str) -> list[dict[str, object]]:
    found = sw(tmp_path / "s.db", "--config", str(config), "catalog", "--json", *args)
    return list(found["sessions"])


def test_titles_come_from_the_harness_else_the_first_prompt(
    tmp_path: Path, sessions: tuple[Path, Path]
) -> None:
    config, _ = sessions
    titles = {e["nativeId"]: e["title"] for e in _catalog(tmp_path, config)}
    assert "Fix the failing billing tests second line" == titles["billing"]  # one line
    assert "API docs pass" == titles["docs"]  # the harness's own title wins


def test_search_ranks_by_fuzzy_match_whatever_the_typos_and_order(
    tmp_path: Path, sessions: tuple[Path, Path]
) -> None:
    config, _ = sessions
    for query in ("bilin test", "test bilin", "failing billing"):
        found = _catalog(tmp_path, config, "--search", query)
        assert "billing" == found[0]["nativeId"], query
        scores = [e["score"] for e in found]
        assert scores == sorted(scores, reverse=True)
        assert all(isinstance(s, float) and s >= 75 for s in scores)
    assert "docs" == _catalog(tmp_path, config, "--search", "api docs")[0]["nativeId"]
    assert [] == _catalog(tmp_path, config, "--search", "kubernetes ingress")


def test_filters_by_directory_and_age(tmp_path: Path, sessions: tuple[Path, Path]) -> None:
    config, _ = sessions
    assert ["billing"] == [e["nativeId"] for e in _catalog(tmp_path, config, "--cwd", "/w/shop")]
    recent = {e["nativeId"] for e in _catalog(tmp_path, config, "--since", "1d")}
    assert {"billing", "login", "docs"} == recent
    assert 4 == len(_catalog(tmp_path, config, "--since", "2020-01-01"))
    error = sw(tmp_path / "s.db", "--config", str(config), "catalog", "--since", "soon", code=2)
    assert "since must be an age" in error


def test_the_table_fits_100_columns_and_shows_the_adopted_key(
    tmp_path: Path, sessions: tuple[Path, Path]
) -> None:
    config, billing = sessions
    db = tmp_path / "s.db"
    [entry] = _catalog(tmp_path, config, "--search", "billing tests", "--limit", "1")
    short = str(entry["catalogId"]).split(":")[1][:8]
    sw(db, "--config", str(config), "adopt", short, "--session-key", "agent:main:billing")
    table = subprocess.run(
        [sys.executable, "-m", "monitor", "--db", str(db), "--config", str(config), "catalog"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert all(len(line) <= 100 for line in table.splitlines()), table
    row = next(line for line in table.splitlines() if short in line)
    assert "agent:main:billing" in row and "claude" in row
    assert "ago" in row or "now" in row
    adopted = _catalog(tmp_path, config, "--search", "billing")[0]
    assert "agent:main:billing" == adopted["sessionKey"]
    # the catalog writes no prompt text anywhere: not into the database
    assert b"failing billing" not in db.read_bytes()
    assert (
        not (tmp_path / "s.db-wal").exists()
        or b"failing" not in (tmp_path / "s.db-wal").read_bytes()
    )
    assert billing.exists()


async def test_adoption_through_the_api_yields_a_monitored_session(
    client: Client, tmp_path: Path
) -> None:
    path = _claude(tmp_path / "claude", "api", "start", cwd="/w")
    key = "agent:main:adopted:api"
    found = (await client.call("GET", "/v1/catalog?search=start"))[1]["sessions"]
    status, adopted = await client.call(
        "POST", "/v1/links", {"catalogId": found[0]["catalogId"], "sessionKey": key}
    )
    assert (200, None) == (status, adopted["declined"])
    await client.call("POST", "/v1/watches", {"watcher": WATCHER, "target": key})
    with path.open("ab") as f:
        f.write(b'{"type":"user","uuid":"t","message":{"role":"user","content":"typed"}}\n')
    await client.sidecar.monitor.ticker.tick()  # or file watching's early check got there first
    events = await client.sidecar.kernel.recent_events(key)
    assert 1 == sum(e.kind == "human_direct_message" for e in events)
    status, session = await client.call("PUT", f"/v1/sessions/{key}", {})
    assert "api" == session["sessionId"]  # the native session id


async def test_an_existing_session_keeps_its_id_on_adoption(client: Client, tmp_path: Path) -> None:
    path = _claude(tmp_path / "claude", "keep", "start", cwd="/w")
    key = "agent:main:adopted:keep"
    await client.call("PUT", f"/v1/sessions/{key}", {"sessionId": "mine"})
    body = {"kind": "claude", "path": str(path), "sessionKey": key, "sessionId": "other"}
    assert 200 == (await client.call("POST", "/v1/links", body))[0]
    _, session = await client.call("PUT", f"/v1/sessions/{key}", {})
    assert "mine" == session["sessionId"]


def test_the_latest_recap_titles_a_session_without_a_title_of_its_own(tmp_path: Path) -> None:
    """Claude Code (2.1.108 on) writes a recap when a person comes back: the latest one is a
    better title than the first prompt, and a custom title still wins over it."""
    root = tmp_path / "claude"
    config = tmp_path / "c.toml"
    config.write_text(f'[roots]\nclaude = "{root}"\n')

    def recap(text: str) -> dict[str, object]:
        return {"type": "system", "subtype": "away_summary",
                "content": f"{text} (disable recaps in /config)"}  # fmt: skip

    recapped = _claude(root, "recapped", "fix it", cwd="/w")
    with recapped.open("ab") as f:
        for text in ("Fixed the login redirect.", "Billing tests pass; refunds next."):
            f.write(orjson.dumps(recap(text)) + b"\n")
    titled = _claude(root, "titled", "fix it", cwd="/w", title="My own title")
    with titled.open("ab") as f:
        f.write(orjson.dumps(recap("A recap")) + b"\n")
    titles = {e["nativeId"]: e["title"] for e in _catalog(tmp_path, config)}
    assert "Billing tests pass; refunds next." == titles["recapped"]
    assert "My own title" == titles["titled"]


def test_a_catalog_entry_names_the_real_file_through_a_linked_root_and_a_linked_file(
    tmp_path: Path,
) -> None:
    """The catalog's path (and id) is the file's resolved path, whether the root is a link
    or the file is: a session adopted through either is the same session."""
    real = tmp_path / "real-claude"
    session = _claude(real, "linked", "a prompt", cwd="/w")
    elsewhere = _claude(tmp_path / "elsewhere", "target", "another prompt", cwd="/w")
    (real / "proj" / "alias.jsonl").symlink_to(elsewhere)
    root = tmp_path / "claude-link"
    root.symlink_to(real)
    config = tmp_path / "c.toml"
    config.write_text(f'[roots]\nclaude = "{root}"\n')
    paths = {str(e["nativeId"]): e["path"] for e in _catalog(tmp_path, config)}
    assert str(session.resolve()) == paths["linked"]
    assert str(elsewhere.resolve()) == paths["alias"]


async def test_adoption_by_id_reads_only_the_session_it_names(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Among 40 sessions, adoption by full id, by short id, or by the digest alone reads
    one file (it listed and read all 40, 1.7 s a call at 10,000); an unknown id reads none
    and is a 404."""
    import adapters.jsonl_catalog as jsonl_catalog

    for i in range(40):
        _claude(tmp_path / "claude", f"s{i}", f"prompt {i}", cwd="/w")
    found = (await client.call("GET", "/v1/catalog"))[1]["sessions"]
    assert 40 == len(found)
    read: list[str] = []
    entry = jsonl_catalog.file_entry

    def counted(fmt: object, path: str, *args: object, **kwargs: bool) -> object:
        read.append(path)
        return entry(fmt, path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(jsonl_catalog, "file_entry", counted)
    chosen = found[7]
    digest = str(chosen["catalogId"]).partition(":")[2]
    for n, named in enumerate((chosen["catalogId"], digest[:8], digest)):
        key = f"agent:main:adopted:{n}"
        status, _ = await client.call("POST", "/v1/links", {"catalogId": named, "sessionKey": key})
        assert 200 == status
        assert [chosen["path"]] == read, named
        read.clear()
    status, _ = await client.call(
        "POST", "/v1/links", {"catalogId": "claude:ffffffffffffffff", "sessionKey": "agent:main:x"}
    )
    assert 404 == status and [] == read


async def test_opencode_adoption_by_id_reads_only_the_session_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenCode's sessions live in one database: adoption by id lists their ids and reads
    (counts the messages of) only the session whose id's digest matches."""
    import sqlite3

    import adapters.opencode as opencode
    from adapters.registry import entry
    from monitor.config import Config, RootsConfig
    from monitor.upstream.configured import adapter_settings
    from tests.opencode_db import OpenCodeDB

    db = OpenCodeDB(tmp_path / "opencode.db", events=False)
    for i in range(40):
        db.session(f"ses_{i:03d}", title=f"task {i}")
        db.message(f"ses_{i:03d}")
    db.session("ses_child", parent="ses_001")
    settings = adapter_settings(Config(roots=RootsConfig(opencode_db=str(db.path))))
    adapter = entry("opencode").build(settings)
    listed = (await adapter.catalog()).entries
    chosen = next(e for e in listed if e.native_id == "ses_007")
    digest = chosen.catalog_id.partition(":")[2]
    statements: list[str] = []
    run = opencode.READERS.run

    def traced(path: str, query: Any) -> Any:
        def read(conn: sqlite3.Connection) -> Any:
            conn.set_trace_callback(statements.append)
            try:
                return query(conn)
            finally:
                conn.set_trace_callback(None)

        return run(path, read)

    monkeypatch.setattr(opencode.READERS, "run", traced)
    for named in (digest, digest[:8]):
        statements.clear()
        assert [chosen] == (await adapter.catalog_matching(named)).entries
        counted = [s for s in statements if "count(*)" in s]
        assert 1 == len(counted) and "IN ('ses_007')" in counted[0], statements
    assert [] == (await adapter.catalog_matching("ffffffffffffffff")).entries
    short = digest[:1]  # a prefix that names several: each of them, as the listing has them
    want = [e for e in listed if e.catalog_id.partition(":")[2].startswith(short)]
    assert want and sorted(want, key=str) == sorted(
        (await adapter.catalog_matching(short)).entries, key=str
    )
