"""End to end with the running OpenClaw gateway: a person types into a Claude Code session the
gateway adopted from its catalog; the sidecar records the turn in the gateway's own database
and wakes the gateway through its hooks API; the woken agent's model request carries the
notice, once; OpenClaw's own ``session_status`` tool returns the sidecar's event.

Everything is real but the model: ``openclaw gateway run`` (OpenClaw's npm package on Node
24), the Claude Code CLI from its npm package, and ``sessionwatch serve``, each its own
process, with a mock model on loopback (``tests/mock_model.py``). ``install.sh`` installs the
packages; where they are missing, or where this is not root (the catalog path runs the
gateway as a throwaway user), these tests skip and say why.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from monitor.kernel.notices import notice_text
from tests.interop import NODE, unless_runnable
from tests.interop.gateway_rig import (
    ClaudeCode,
    Gateway,
    MockModelProcess,
    Sidecar,
    mentions,
    model_texts,
    serve_before_first_start,
    throwaway_user,
    wait_for,
    why_not_runnable,
)

MAIN = "agent:main:main"
WHY = why_not_runnable()
pytestmark = unless_runnable(WHY)


@dataclass
class CatalogRig:
    gateway: Gateway
    model: MockModelProcess
    sidecar: Sidecar
    claude: ClaudeCode
    thread: str
    key: str


def state_version(sidecar: Sidecar, key: str) -> int:
    return int(sidecar.cli("status", key)["stateVersion"])


def events_since(sidecar: Sidecar, key: str, since: int) -> list[dict[str, Any]]:
    answer = sidecar.cli("status", key, "--changes-since", str(since))
    return list(answer["stateChanges"]["events"])


def delivered_once(model: MockModelProcess, before: int, text: str, sidecar: Any = None) -> None:
    """``text`` reaches the model from request ``before`` on, and then exactly once; or
    twice when ``sidecar`` said a call of it went unanswered (the gateway may have taken it:
    the one repeat docs/gateway-integration.md allows, as a gateway just started and slow
    to answer can cause)."""
    wait_for(
        f"the model to be asked with: {text}",
        lambda: mentions(model.requests()[before:], text),
        120,
    )
    time.sleep(3)  # a second delivery would follow within this
    times = mentions(model.requests()[before:], text, new_only=True)  # history is not a wake
    log = "" if sidecar is None else sidecar.log_text()
    if times == 2 and "it may have taken it" in log:
        return
    said = "\n---\n".join(model_texts(model.requests()[before:])[-3:])[-6000:]
    assert 1 == times, f"{log[-3000:]}\nwhat the model was asked last:\n{said}"


def no_lock_errors(*logs: str) -> None:
    for log in logs:
        assert "database is locked" not in log


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CatalogRig]:
    """The gateway as a throwaway user with no state overrides, a Claude Code session of
    that user's, adopted through the gateway's own catalog, and ``serve`` on the gateway's
    database with no configuration, started before the gateway's first start (it waits
    for the database the gateway makes) and so before the adoption."""
    work = tmp_path_factory.mktemp("catalog")
    with throwaway_user() as user:
        readable = subprocess.run(["runuser", "-u", user, "--", "test", "-x", str(NODE)])
        if readable.returncode != 0:
            pytest.skip(f"{NODE} is not readable by other users: install it elsewhere")
        model = MockModelProcess(work)
        gateway = Gateway(work, model, user=user)
        sidecar: Sidecar | None = None
        try:
            assert not gateway.db.exists()
            sidecar = serve_before_first_start(work, gateway)
            assert 1 == sidecar.log_text().count("has not made its state database yet")
            assert "made its state database" in sidecar.log_text()
            project = gateway.home / "billing"
            subprocess.run(["runuser", "-u", user, "--", "mkdir", "-p", str(project)], check=True)
            claude = ClaudeCode(gateway, project)
            thread = claude.prompt("fix the failing billing tests")
            found = sidecar.cli("config")
            assert found["store"]["effective"] == str(gateway.db), found
            assert found["gateway"]["hooks_url"] == f"{gateway.base}/hooks", found
            assert gateway.hooks_token not in sidecar.log_text()
            assert "next to OpenClaw at" in sidecar.log_text()
            listed = gateway.call("sessions.catalog.list", {"catalogId": "claude"})
            (host,) = listed["catalogs"][0]["hosts"]
            assert "gateway:local" == host["hostId"]
            assert thread in [s["threadId"] for s in host["sessions"]]
            adopted = gateway.call(
                "sessions.catalog.continue",
                {"catalogId": "claude", "hostId": "gateway:local", "threadId": thread},
            )
            key = adopted["sessionKey"]
            assert key.startswith("agent:main:plugin:anthropic:catalog-adopt:claude:")
            assert {"watched": True} == sidecar.cli("watch", "--watcher", MAIN, "--target", key)
            yield CatalogRig(gateway, model, sidecar, claude, thread, key)
        finally:
            if sidecar is not None:
                sidecar.stop()
            gateway.stop()
            model.stop()


def test_a_typed_prompt_reaches_the_running_agent_once(catalog: CatalogRig) -> None:
    rig = catalog
    links = rig.sidecar.cli("links")["links"]
    (link,) = [link for link in links if link["sessionKey"] == rig.key]
    assert ("claude-cli", "gateway:local", rig.thread) == (
        link["upstreamKind"],
        link["hostId"],
        link["threadId"],
    )
    seen = state_version(rig.sidecar, rig.key)  # created and adopted, by the gateway
    before = len(rig.model.requests())
    time.sleep(1.0)  # serve picks up the link the gateway wrote within a second
    rig.claude.prompt("and run them again", resume=rig.thread)

    events = wait_for(
        "the typed prompt to be recorded", lambda: events_since(rig.sidecar, rig.key, seen), 90
    )
    assert [("human_direct_message", "human", "human message via claude")] == [
        (e["kind"], e["actorType"], e["summary"]) for e in events
    ]
    text = notice_text(rig.key, seen)
    delivered_once(rig.model, before, text)

    # What the notice asks the agent to call answers with the sidecar's event.
    status = rig.gateway.session_status(rig.key, seen)
    assert [e["sequence"] for e in events] == [
        e["sequence"] for e in status["stateChanges"]["events"]
    ]
    assert ["human_direct_message"] == [e["kind"] for e in status["stateChanges"]["events"]]
    # The accepted wake was the delivery: nothing is pending any more.
    wait_for(
        "the notice to be acknowledged",
        lambda: not rig.sidecar.cli("notices", "--watcher", MAIN)["notices"],
    )
    assert 1 <= rig.sidecar.metric("sessionwatch_wake_calls_total", result="accepted")

    # A prompt typed after that delivery is one fresh notice.
    seen = state_version(rig.sidecar, rig.key)
    before = len(rig.model.requests())
    rig.claude.prompt("and the integration tests too", resume=rig.thread)
    wait_for("the second prompt", lambda: events_since(rig.sidecar, rig.key, seen), 90)
    delivered_once(rig.model, before, notice_text(rig.key, seen))
    assert 1 == len(events_since(rig.sidecar, rig.key, seen))

    no_lock_errors(rig.sidecar.log_text(), rig.gateway.log_text())
    assert rig.gateway.ready()
    api_token = (rig.sidecar.work / "token").read_text().strip()
    for secret in (rig.gateway.hooks_token, rig.gateway.token, api_token):
        assert secret not in rig.sidecar.log_text()  # no secret reaches the log


def test_an_event_the_gateway_records_itself_reaches_the_model_once(catalog: CatalogRig) -> None:
    """The gateway opens this notice and delivers it from its own queue: the sidecar, which
    sees it pending in the shared database, must not wake it a second time."""
    rig = catalog
    peer = "agent:main:dashboard:e2e-peer"
    rig.gateway.call("sessions.create", {"key": peer, "agentId": "main"})
    assert {"watched": True} == rig.sidecar.cli("watch", "--watcher", MAIN, "--target", peer)
    seen = state_version(rig.sidecar, peer)
    accepted = rig.sidecar.metric("sessionwatch_wake_calls_total", result="accepted")
    before = len(rig.model.requests())
    # The main session is busy in a slow turn, so the gateway's notice waits in its queue,
    # pending in the database, long enough for a sidecar that wrongly woke it to do so.
    rig.model.script(delay_s=6)
    body = {"text": "a long errand", "mode": "now", "agentId": "main", "sessionKey": MAIN}
    assert 200 == rig.gateway.hook_wake(body)[0]
    wait_for("the busy turn", lambda: mentions(rig.model.requests()[before:], "a long errand"), 60)
    rig.gateway.call(
        "agent",
        {"sessionKey": peer, "message": "a person in the dashboard", "idempotencyKey": "e2e-1"},
    )
    events = wait_for("the gateway's own event", lambda: events_since(rig.sidecar, peer, seen), 60)
    assert ["human_direct_message"] == [e["kind"] for e in events]
    pending = rig.sidecar.cli("notices", "--watcher", MAIN)["notices"]
    assert [notice_text(peer, seen)] == [n["text"] for n in pending]  # the gateway's, waiting
    time.sleep(3)  # the sidecar sees it within half a second
    rig.model.script(delay_s=0)
    delivered_once(rig.model, before, notice_text(peer, seen))
    assert accepted == rig.sidecar.metric("sessionwatch_wake_calls_total", result="accepted")
    no_lock_errors(rig.sidecar.log_text(), rig.gateway.log_text())


# -- a gateway in a scratch state directory: what needs no catalog ----------------------------


@dataclass
class ScratchRig:
    gateway: Gateway
    model: MockModelProcess
    work: Path

    def sidecar(self, name: str, hooks_token: str | None = None, zero: bool = False) -> Sidecar:
        work = self.work / name
        work.mkdir(mode=0o700)
        claude = work / "claude"
        claude.mkdir()
        token = self.gateway.hooks_token if hooks_token is None else hooks_token
        sidecar = Sidecar(work, self.gateway, claude_root=claude, hooks_token=token, zero=zero)
        sidecar.start()
        return sidecar

    def human_turn(self, sidecar: Sidecar, key: str) -> None:
        sidecar.cli(
            "record", "--session", key, "--kind", "human_direct_message", "--actor", "human"
        )


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScratchRig]:
    work = tmp_path_factory.mktemp("scratch")
    work.chmod(0o700)
    model = MockModelProcess(work)
    gateway = Gateway(work, model, user=None)
    try:
        gateway.start()
        yield ScratchRig(gateway, model, work)
    finally:
        gateway.stop()
        model.stop()


def test_a_wrong_hooks_token_is_said_once_and_the_notice_waits(scratch: ScratchRig) -> None:
    sidecar = scratch.sidecar("wrong-token", hooks_token="not-the-token")
    target = "agent:main:dashboard:wrong-token"
    try:
        sidecar.cli("watch", "--watcher", MAIN, "--target", target)
        seen = state_version(sidecar, target)
        before = len(scratch.model.requests())
        scratch.human_turn(sidecar, target)
        # the second call comes a window (20 s) after the first, and the first came 20 s
        # after the turn in one full run on a loaded machine (it may wait out a window an
        # earlier test's wake of MAIN left running in the shared database)
        wait_for(
            "a 401",
            lambda: sidecar.metric("sessionwatch_wake_calls_total", result="unauthorized") >= 2,
            70,
        )
        log = sidecar.log_text()
        assert 1 == log.count("the gateway refused the hooks token (401)")
        assert str(sidecar.hooks_token_file) in log
        assert [notice_text(target, seen)] == [
            n["text"] for n in sidecar.cli("notices", "--watcher", MAIN)["notices"]
        ]
        sidecar.set_hooks_token(scratch.gateway.hooks_token)  # the operator fixes the file
        delivered_once(scratch.model, before, notice_text(target, seen))
        assert [] == sidecar.cli("notices", "--watcher", MAIN)["notices"]
    finally:
        sidecar.stop()


def test_a_notice_opened_while_the_gateway_is_down_arrives_once_it_is_back(
    scratch: ScratchRig,
) -> None:
    sidecar = scratch.sidecar("down")
    target = "agent:main:dashboard:down"
    try:
        sidecar.cli("watch", "--watcher", MAIN, "--target", target)
        seen = state_version(sidecar, target)
        scratch.gateway.stop()
        before = len(scratch.model.requests())
        scratch.human_turn(sidecar, target)
        wait_for(
            "a failed wake",
            lambda: sidecar.metric("sessionwatch_wake_calls_total", result="failed") >= 1,
            60,
        )
        assert 1 == sidecar.log_text().count("did not take a wake")
        assert 1 == len(sidecar.cli("notices", "--watcher", MAIN)["notices"])
        scratch.gateway.start()
        delivered_once(scratch.model, before, notice_text(target, seen), sidecar)
        wait_for(
            "the acknowledgement", lambda: not sidecar.cli("notices", "--watcher", MAIN)["notices"]
        )
        no_lock_errors(sidecar.log_text(), scratch.gateway.log_text())
    finally:
        sidecar.stop()


def test_a_gateway_that_refuses_caller_chosen_keys(scratch: ScratchRig) -> None:
    """The main session is woken through its agent's main session; another watcher's notice
    stays pending, and the log names the gateway setting once."""
    scratch.gateway.stop()
    scratch.gateway.allow_keys = False
    scratch.gateway.start()
    sidecar = scratch.sidecar("keys")
    target = "agent:main:dashboard:keys"
    coordinator = "agent:main:dashboard:coordinator"
    try:
        sidecar.cli("watch", "--watcher", MAIN, "--target", target)
        sidecar.cli("watch", "--watcher", coordinator, "--target", target)
        seen = state_version(sidecar, target)
        before = len(scratch.model.requests())
        scratch.human_turn(sidecar, target)
        delivered_once(scratch.model, before, notice_text(target, seen))
        log = sidecar.log_text()
        assert 1 == log.count("hooks.allowRequestSessionKey: true")
        assert [] == sidecar.cli("notices", "--watcher", MAIN)["notices"]
        pending = sidecar.cli("notices", "--watcher", coordinator)["notices"]
        assert [notice_text(target, seen)] == [n["text"] for n in pending]
        assert scratch.gateway.ready()
    finally:
        sidecar.stop()


def test_two_processes_write_one_file_with_no_lock_error_and_nothing_lost(
    scratch: ScratchRig,
) -> None:
    """The gateway records its own events (its ``agent`` method, into a watched session)
    while the sidecar records through its API and ticks: every event of both is there, and
    neither side logs a lock error. bench/gateway_contention.py measures the waits."""
    import threading

    from tests.interop.gateway_rig import http

    sidecar = scratch.sidecar("two-writers")
    peer = "agent:main:dashboard:two-writers"
    target = "agent:main:dashboard:sidecar-writes"
    try:
        sidecar.cli("watch", "--watcher", MAIN, "--target", peer)
        token = (sidecar.work / "token").read_text().strip()
        url = f"http://127.0.0.1:{sidecar.port}/v1/events"
        answers: list[int] = []

        def sidecar_writes() -> None:
            for i in range(200):
                body = {
                    "sessionKey": target,
                    "kind": "goal_changed",
                    "actorType": "agent",
                    "summary": "goal updated",
                    "dedupeKey": f"two-writers-{i}",
                }
                answers.append(http("POST", url, body, token)[0])

        writer = threading.Thread(target=sidecar_writes)
        writer.start()
        seen = state_version(sidecar, peer)
        for i in range(3):
            params = {"sessionKey": peer, "message": f"typed {i}", "idempotencyKey": f"tw-{i}"}
            scratch.gateway.call("agent", params)
        writer.join(120)
        assert [200] * 200 == answers
        wait_for(
            "the gateway's three events", lambda: len(events_since(sidecar, peer, seen)) == 3, 90
        )
        assert 200 == len(events_since(sidecar, target, 0))
        no_lock_errors(sidecar.log_text(), scratch.gateway.log_text())
        assert scratch.gateway.ready()
    finally:
        sidecar.stop()


def test_with_its_state_dir_moved_and_its_hook_token_rotated_no_restart(
    scratch: ScratchRig,
) -> None:
    """The gateway runs with OPENCLAW_STATE_DIR (and its config path) moved; the sidecar,
    with no configuration, finds them through the same variables. Then the hook token is
    rotated in openclaw.json: the gateway takes it without a restart, and so does the
    sidecar at its next wake."""
    import secrets as random

    sidecar = scratch.sidecar("zero", zero=True)
    target = "agent:main:dashboard:zero"
    try:
        assert sidecar.cli("config")["store"]["effective"] == str(scratch.gateway.db)
        sidecar.cli("watch", "--watcher", MAIN, "--target", target)
        seen = state_version(sidecar, target)
        before = len(scratch.model.requests())
        scratch.human_turn(sidecar, target)
        delivered_once(scratch.model, before, notice_text(target, seen))
        old = scratch.gateway.hooks_token
        scratch.gateway.hooks_token = "hooks-" + random.token_hex(16)
        scratch.gateway.write_config()  # the operator rotates hooks.token
        wait_for(
            "the gateway to take the rotated token",
            lambda: scratch.gateway.hook_wake({})[0] == 400 or None,
            60,
        )
        assert scratch.gateway.hook_wake({}, token=old)[0] == 401
        seen = state_version(sidecar, target)
        before = len(scratch.model.requests())
        scratch.human_turn(sidecar, target)
        delivered_once(scratch.model, before, notice_text(target, seen))
        assert scratch.gateway.hooks_token not in sidecar.log_text()
        no_lock_errors(sidecar.log_text(), scratch.gateway.log_text())
    finally:
        sidecar.stop()


def test_a_prompt_the_gateway_sent_into_a_session_is_its_own_not_a_person(
    scratch: ScratchRig,
) -> None:
    """Self-echo from the gateway's own transcript: the gateway runs a turn in a session
    (its ``agent`` method, as when it drives an adopted session), and the same text then
    appears in the session's native transcript; the sidecar, next to OpenClaw with no
    configuration, reads the gateway's last user texts from its agent database and does
    not count that one as a person typing. A person's prompt after it is counted once."""
    import json

    from monitor.openclaw.files import GatewayTranscripts, locate

    sidecar = scratch.sidecar("echo", zero=True)
    key = "agent:main:dashboard:echo"
    sent = "the gateway drives this session"
    try:
        scratch.gateway.call("sessions.create", {"key": key, "agentId": "main"})
        project = scratch.gateway.home / ".claude" / "projects" / "-echo"
        project.mkdir(parents=True, exist_ok=True)
        transcript = project / "echo.jsonl"

        def line(text: str, uuid: str) -> bytes:
            record = {"type": "user", "uuid": uuid, "message": {"role": "user", "content": text}}
            return json.dumps(record).encode() + b"\n"

        transcript.write_bytes(line("before adoption", "u0"))
        sidecar.cli("adopt", "--kind", "claude", "--path", str(transcript), "--session-key", key,
                    "--session-id", "echo")  # fmt: skip
        sidecar.cli("watch", "--watcher", MAIN, "--target", key)
        scratch.gateway.call("agent", {"sessionKey": key, "message": sent, "idempotencyKey": "e1"})
        reader = GatewayTranscripts(locate(scratch.gateway.env()))
        wait_for("the gateway's transcript", lambda: sent in reader.recent("main", key) or None, 90)
        with transcript.open("ab") as f:
            f.write(line(sent, "u1"))  # the gateway's prompt, as its harness writes it
        sidecar.cli("tick")
        ours = [
            e
            for e in events_since(sidecar, key, 0)
            if e.get("summary") == "human message via claude"
        ]
        assert ours == [], ours  # the gateway's own words: no person typed them
        with transcript.open("ab") as f:
            f.write(line("and a person types this", "u2"))
        sidecar.cli("tick")
        ours = [
            e
            for e in events_since(sidecar, key, 0)
            if e.get("summary") == "human message via claude"
        ]
        assert len(ours) == 1, ours
    finally:
        sidecar.stop()
