"""The HTTP API on a real server on loopback, called with aiohttp's client."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from monitor.config import ApiConfig, Config
from monitor.errors import AlreadyRunning
from monitor.serve.root import running
from tests.helpers import REPO, Client, make_config, notice, refuse_event_inserts
from tests.hooks_gateway import HooksGateway

MAIN = "agent:main:main"
CHILD = "agent:main:subagent:child"
KEY = "agent:main:adopted:x"


async def test_healthz_needs_no_token_and_the_rest_does(client: Client, tmp_path: Path) -> None:
    assert (200, {"ok": True}) == await client.call("GET", "/healthz", token="")
    status, answer = await client.call("GET", "/v1/sessions", token="wrong")
    assert 401 == status
    assert "unauthorized" == answer["error"]["code"]
    assert 0o600 == (tmp_path / "token").stat().st_mode & 0o777


async def test_spawn_record_notices_status_round_trip(client: Client) -> None:
    status, spawned = await client.call(
        "POST", "/v1/spawns", {"parent": MAIN, "child": CHILD, "runId": "r1"}
    )
    assert (200, "child_spawned") == (status, spawned["kind"])
    for _ in range(2):
        status, event = await client.call(
            "POST",
            "/v1/events",
            {
                "sessionKey": CHILD,
                "kind": "human_direct_message",
                "actorType": "human",
                "payload": {"channel": "telegram"},
            },
        )
        assert (200, True) == (status, event["recorded"])
    expected = {"notices": [{"target": CHILD, "text": notice(CHILD, 1)}]}
    assert (200, expected) == await client.call("GET", f"/v1/watchers/{MAIN}/notices")
    assert (200, expected) == await client.call("POST", f"/v1/watchers/{MAIN}/notices/drain")
    reopened = {"notices": [{"target": CHILD, "text": notice(CHILD, 2)}]}
    assert (200, reopened) == await client.call("POST", f"/v1/watchers/{MAIN}/notices/drain")
    status, answer = await client.call("GET", f"/v1/sessions/{CHILD}/status?changesSince=2")
    assert [3] == [e["sequence"] for e in answer["stateChanges"]["events"]]
    status, answer = await client.call("GET", f"/v1/sessions?keys={CHILD},{MAIN}")
    assert [3, 0] == [s["stateVersion"] for s in answer["sessions"]]


async def test_watch_reset_delete_and_sessions(client: Client) -> None:
    assert (200, {"watched": True}) == await client.call(
        "POST", "/v1/watches", {"watcher": MAIN, "target": CHILD, "storePath": "/s.json"}
    )
    reason = 'the watcher "global" is not an agent-qualified key (agent:<agentId>:<rest>)'
    assert (200, {"watched": False, "reason": reason}) == await client.call(
        "POST", "/v1/watches", {"watcher": "global", "target": CHILD}
    )
    assert (200, {"watched": False, "reason": "a session does not watch itself"}) == (
        await client.call("POST", "/v1/watches", {"watcher": MAIN, "target": MAIN})
    )
    status, info = await client.call(
        "PUT", f"/v1/sessions/{CHILD}", {"sessionId": "s1", "runActive": True}
    )
    assert (200, True, "s1") == (status, info["runActive"], info["sessionId"])
    assert (200, {"ok": True}) == await client.call("POST", f"/v1/sessions/{MAIN}/reset")
    assert (200, {"ok": True}) == await client.call("DELETE", f"/v1/sessions/{CHILD}")
    assert (200, {"ok": True}) == await client.call(
        "POST", f"/v1/sessions/{CHILD}/own-messages", {"text": "hello"}
    )


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        (
            "POST",
            "/v1/events",
            {"sessionKey": CHILD, "kind": "bogus", "actorType": "human"},
            400,
            "bad_request",
        ),
        ("POST", "/v1/events", {"sessionKey": CHILD, "kind": "goal_changed"}, 400, "bad_request"),
        (
            "POST",
            "/v1/events",
            {
                "sessionKey": CHILD,
                "kind": "goal_changed",
                "actorType": "human",
                "occurredAt": "now",
            },
            400,
            "bad_request",
        ),
        (
            "POST",
            "/v1/events",
            {"sessionKey": CHILD, "kind": "goal_changed", "actorType": "human", "extra": 1},
            400,
            "bad_request",
        ),
        ("POST", "/v1/events", [1, 2], 400, "bad_request"),
        ("POST", "/v1/spawns", {"parent": MAIN, "child": CHILD}, 400, "bad_request"),
        ("GET", f"/v1/sessions/{CHILD}/status?changesSince=-3", None, 400, "bad_request"),
        ("GET", "/v1/sessions/global/status", None, 400, "bad_request"),
        ("GET", "/v1/sessions?state=sleeping", None, 400, "bad_request"),
        ("GET", "/v1/sessions?state=waiting,", None, 400, "bad_request"),
        ("GET", "/v1/nowhere", None, 404, "not_found"),
        ("PATCH", "/v1/events", None, 405, "method_not_allowed"),
        ("DELETE", "/v1/links/agent:main:none", None, 404, "not_found"),
        (
            "POST",
            "/v1/links",
            {"kind": "claude", "path": "/etc/passwd", "sessionKey": KEY},
            403,
            "outside_roots",
        ),
        ("POST", "/v1/links", {"catalogId": "claude:0000", "sessionKey": KEY}, 404, "not_found"),
    ],
)
async def test_client_mistakes_get_a_clear_4xx_and_write_nothing(
    client: Client, method: str, path: str, body: Any, status: int, code: str
) -> None:
    got_status, answer = await client.call(method, path, body)
    assert (status, code) == (got_status, answer["error"]["code"])
    assert answer["error"]["message"]
    assert (200, {"sessions": []}) == await client.call("GET", "/v1/sessions")


async def test_bad_json_wrong_type_and_oversized_bodies(client: Client) -> None:
    status, answer = await client.call("POST", "/v1/events", raw=b"{nope")
    assert (400, "bad_request") == (status, answer["error"]["code"])
    status, answer = await client.call("POST", "/v1/events", raw=b"{}", content_type="text/plain")
    assert (415, "unsupported_media_type") == (status, answer["error"]["code"])
    big = orjson.dumps(
        {
            "sessionKey": CHILD,
            "kind": "goal_changed",
            "actorType": "human",
            "summary": "x" * (2 * 1024 * 1024),
        }
    )
    status, answer = await client.call("POST", "/v1/events", raw=big)
    assert (413, "body_too_large") == (status, answer["error"]["code"])


async def test_a_database_failure_answers_503_recorded_false(client: Client) -> None:
    await client.sidecar.kernel.store.write(refuse_event_inserts)
    status, answer = await client.call(
        "POST", "/v1/events", {"sessionKey": CHILD, "kind": "goal_changed", "actorType": "human"}
    )
    assert (503, False) == (status, answer["recorded"])
    status, metrics = await client.call("GET", "/metrics")
    assert "sessionwatch_database_errors_total 1.0" in metrics


async def test_a_stored_payload_that_is_not_json_answers_as_none(client: Client) -> None:
    """A row another writer left with a payload that is not JSON is an event without one:
    changesSince and the status page answer 200, on both stores (PostgreSQL's statement
    fails on it and the answer is made from the rows)."""
    kernel = client.sidecar.kernel
    await kernel.store.write(
        lambda conn: conn.execute(
            "INSERT INTO session_state_events (session_key, agent_id, kind, actor_type,"
            " occurred_at, summary, payload_json) VALUES (?, 'main', 'human_direct_message',"
            " 'human', ?, 'human message via x', '{\"channel\": ')",
            (CHILD, kernel.store.clock()),
        )
    )
    status, answer = await client.call("GET", f"/v1/sessions/{CHILD}/status?changesSince=0")
    assert 200 == status
    [event] = answer["stateChanges"]["events"]
    assert ("human_direct_message", None) == (event["kind"], event.get("payload"))
    status, page = await client.call("GET", "/")
    assert (200, True) == (status, "<html" in page)


async def test_links_catalog_and_metrics(client: Client, tmp_path: Path) -> None:
    transcript = tmp_path / "claude" / "proj" / "abc.jsonl"
    transcript.parent.mkdir()
    transcript.write_bytes(b'{"type":"user","cwd":"/w","message":{"role":"user","content":"x"}}\n')
    status, catalog = await client.call("GET", "/v1/catalog")
    assert 200 == status
    [entry] = catalog["sessions"]
    assert ("claude", "abc", "/w") == (entry["kind"], entry["nativeId"], entry["cwd"])
    status, adopted = await client.call(
        "POST", "/v1/links", {"catalogId": entry["catalogId"], "sessionKey": KEY, "sessionId": "s1"}
    )
    assert (200, None) == (status, adopted["declined"])
    status, links = await client.call("GET", "/v1/links")
    assert [KEY] == [link["sessionKey"] for link in links["links"]]
    assert (200, {"ok": True}) == await client.call("DELETE", f"/v1/links/{KEY}")
    status, metrics = await client.call("GET", "/metrics")
    assert 'sessionwatch_events_recorded_total{kind="adopted"} 1.0' in metrics


async def test_sessions_by_what_they_are_doing(client: Client, tmp_path: Path) -> None:
    """``GET /v1/sessions?state=``: the adopted sessions doing that now, read from the real
    harness's records (a turn of Claude Code 2.1.332's that ended), with their state
    version; ``GET /v1/links`` says the same of each link."""
    lines = (REPO / "tests" / "fixtures" / "states" / "claude-2.1.332.jsonl").read_bytes()
    first, rest = lines.split(b"\n", 1)
    transcript = tmp_path / "claude" / "proj" / "abc.jsonl"
    transcript.parent.mkdir()
    transcript.write_bytes(first + b"\n")
    body = {"kind": "claude", "path": str(transcript), "sessionKey": KEY, "sessionId": "s1"}
    assert 200 == (await client.call("POST", "/v1/links", body))[0]
    watch = {"watcher": MAIN, "target": KEY}
    assert (200, {"watched": True}) == await client.call("POST", "/v1/watches", watch)
    assert (200, {"sessions": []}) == await client.call("GET", "/v1/sessions?state=waiting")
    _, unknown = await client.call("GET", "/v1/sessions?state=unknown")
    assert [(KEY, {"state": "unknown", "since": None, "upstreamKind": "claude-cli"})] == [
        (s["sessionKey"], s["doing"]) for s in unknown["sessions"]
    ]
    with transcript.open("ab") as f:
        f.write(rest)  # its three scenes, each ended
    await client.sidecar.monitor.ticker.tick()  # or file watching's early check got there first
    status, found = await client.call("GET", "/v1/sessions?state=asking,waiting")
    [session] = found["sessions"]
    assert (200, KEY, "waiting") == (status, session["sessionKey"], session["doing"]["state"])
    assert session["stateVersion"] >= 1  # adopted
    _, links = await client.call("GET", "/v1/links")
    assert session["doing"]["since"] == links["links"][0]["doing"]["since"]
    assert (200, {"sessions": []}) == await client.call(
        "GET", "/v1/sessions?state=waiting&keys=agent:main:other"
    )


async def test_a_second_instance_refuses_to_start(tmp_path: Path) -> None:
    """Whatever path names the database: itself, a symlink, a path through ``..``, or a
    hard link in another directory (as a bind-mount alias is: the same device and inode)."""
    config = make_config(tmp_path)
    db = tmp_path / "state.db"
    (tmp_path / "link.db").symlink_to(db)
    (tmp_path / "sub").mkdir()
    (tmp_path / "other").mkdir()
    async with running(config, db):
        os.link(db, tmp_path / "other" / "alias.db")
        for alias in (db, tmp_path / "link.db", tmp_path / "sub" / ".." / "state.db",
                      tmp_path / "other" / "alias.db"):  # fmt: skip
            with pytest.raises(AlreadyRunning, match="refusing to start"):
                async with running(config, alias):
                    pass
    async with running(config, tmp_path / "link.db"):  # the first has stopped: it starts
        pass


async def test_unix_socket_is_private(tmp_path: Path) -> None:
    sock = tmp_path / "sw.sock"
    base = make_config(tmp_path)
    config = Config(
        roots=base.roots,
        monitor=base.monitor,
        api=ApiConfig(listen=f"unix:{sock}", token_file=str(tmp_path / "token")),
    )
    async with running(config, tmp_path / "state.db"):
        assert 0o600 == sock.stat().st_mode & 0o777
        conn = aiohttp.UnixConnector(path=str(sock))
        async with (
            aiohttp.ClientSession(connector=conn) as http,
            http.get("http://sidecar/healthz") as r,
        ):
            assert 200 == r.status


async def test_end_to_end_a_typed_prompt_wakes_the_gateway(
    tmp_path: Path, hooks_gateway: HooksGateway
) -> None:
    """A prompt appended to an adopted, watched transcript reaches the gateway's hooks API as
    a wake carrying the notice (through file watching, long before the hour-long tick); the
    accepted wake is the delivery, so the notice is acknowledged and no longer pending."""
    config = make_config(tmp_path, gateway=hooks_gateway.config(tmp_path))
    transcript = tmp_path / "claude" / "s.jsonl"
    transcript.write_bytes(b"")
    async with (
        running(config, tmp_path / "state.db") as sidecar,
        aiohttp.ClientSession() as http,
    ):
        c = Client(sidecar.addresses[0], (tmp_path / "token").read_text().strip(), http, sidecar)
        await c.call(
            "POST",
            "/v1/links",
            {"kind": "claude", "path": str(transcript), "sessionKey": KEY, "sessionId": "s1"},
        )
        await c.call("POST", "/v1/watches", {"watcher": MAIN, "target": KEY})
        with transcript.open("ab") as f:
            f.write(b'{"type":"user","uuid":"u1","message":{"role":"user","content":"hi"}}\n')
        await asyncio.wait_for(hooks_gateway.woken.wait(), 30)
        expected = {"text": notice(KEY, 1), "mode": "now", "agentId": "main", "sessionKey": MAIN}
        assert [expected] == hooks_gateway.wakes
        for _ in range(100):  # the acknowledgement follows the gateway's answer
            _, pending = await c.call("GET", f"/v1/watchers/{MAIN}/notices")
            if not pending["notices"]:
                break
            await asyncio.sleep(0.05)
        assert {"notices": []} == pending


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (
            "/v1/spawns",
            {"parent": "global", "child": CHILD, "runId": "r"},
            "parent: expected an agent-qualified session key, agent:<agentId>:<rest>",
        ),
        ("/v1/events", {"sessionKey": CHILD, "kind": "x", "actorType": "human"}, "kind: "),
        ("/v1/watches", {"watcher": MAIN, "target": CHILD, "extra": 1}, "unknown field 'extra'"),
        ("/v1/spawns", {"parent": MAIN, "child": CHILD}, "runId is required"),
    ],
)
async def test_a_refusal_names_the_field_and_what_was_expected(
    client: Client, path: str, body: Any, message: str
) -> None:
    status, answer = await client.call("POST", path, body)
    assert 400 == status
    assert answer["error"]["message"].startswith(message), answer


@pytest.mark.parametrize("since", ["2026-11-29", "2026-11-30", "2026-12-31", "2026-11-30T09:00"])
async def test_the_catalog_takes_every_real_date(client: Client, since: str) -> None:
    status, answer = await client.call("GET", f"/v1/catalog?since={since}")
    assert 200 == status, answer


@pytest.mark.parametrize("since", ["2026-02-30", "yesterday", "5x"])
async def test_a_date_that_is_not_one_is_refused_in_words(client: Client, since: str) -> None:
    """The API and the CLI share one parser, and its refusal names the accepted forms."""
    status, answer = await client.call("GET", f"/v1/catalog?since={since}")
    assert 400 == status
    assert "an age (a number and s, m, h, d or w" in answer["error"]["message"]
    assert "ISO date or date and time" in answer["error"]["message"]


@pytest.mark.parametrize("at", [-9223372036854775808, -1, 253402300800000, 2**62])
async def test_a_time_before_1970_or_after_9999_is_refused(client: Client, at: int) -> None:
    body = {"sessionKey": CHILD, "kind": "goal_changed", "actorType": "human", "occurredAt": at}
    status, answer = await client.call("POST", "/v1/events", body)
    assert (400, "bad_request") == (status, answer["error"]["code"]), answer
    assert "occurredAt" in answer["error"]["message"]


@pytest.mark.parametrize("raw", ["1e3", "1.0", "+5", "٣"])
async def test_a_number_in_a_query_is_digits_only(client: Client, raw: str) -> None:
    status, answer = await client.call("GET", f"/v1/sessions/{CHILD}/status?changesSince={raw}")
    assert 400 == status
    assert "changesSince must be a whole number written in digits" in answer["error"]["message"]


async def test_an_unknown_query_parameter_is_refused_as_an_unknown_body_field_is(
    client: Client,
) -> None:
    status, answer = await client.call("GET", "/v1/sessions/agent:main:x/status?changesSinc=1")
    assert status == 400
    assert answer["error"]["message"] == (
        "unknown query parameter 'changesSinc' (this route takes: agentId, changesSince)"
    )
    status, answer = await client.call("GET", "/v1/links?verbose=1")
    assert (status, answer["error"]["code"]) == (400, "bad_request")
    status, _ = await client.call("GET", "/v1/sessions/agent:main:x/status?changesSince=0")
    assert status == 200


async def test_a_bare_key_is_refused_on_delete_and_reset_and_nothing_goes(
    client: Client,
) -> None:
    """``global`` is a session of every agent under OpenClaw's global scope: a deletion must
    name the agent, and a reset names one agent-qualified session; both refuse it with a
    400, and both agents' sessions keep their events."""
    for agent in ("main", "ops"):
        status, _ = await client.call(
            "POST",
            "/v1/events",
            {
                "sessionKey": "global",
                "agentId": agent,
                "kind": "goal_changed",
                "actorType": "human",
            },
        )
        assert 200 == status
    for method, path in (
        ("DELETE", "/v1/sessions/global"),
        ("POST", "/v1/sessions/global/reset"),
    ):
        status, body = await client.call(method, path)
        assert (400, "bad_request") == (status, body["error"]["code"]), body
        assert "bare key" in body["error"]["message"]
    versions = {}
    for agent in ("main", "ops"):
        status, body = await client.call("GET", f"/v1/sessions/global/status?agentId={agent}")
        assert 200 == status and body["stateVersion"] > 0, body
        versions[agent] = body["stateVersion"]
    assert (200, {"ok": True}) == await client.call("DELETE", "/v1/sessions/global?agentId=ops")
    status, body = await client.call("GET", "/v1/sessions/global/status?agentId=main")
    assert (200, versions["main"]) == (status, body["stateVersion"])
    status, body = await client.call("GET", "/v1/sessions/global/status?agentId=ops")
    assert (200, 0) == (status, body["stateVersion"])
