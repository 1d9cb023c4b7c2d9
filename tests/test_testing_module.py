"""``monitor.testing`` as a gateway's developer uses it: the docstring's example, run."""

from __future__ import annotations

from pathlib import Path

from monitor.kernel import NewEvent
from monitor.kernel.events import ActorType, EventKind
from monitor.testing import HooksGateway, running_hooks_gateway, waking_kernel

MAIN = "agent:main:main"
CHILD = "agent:main:subagent:a"


def turn() -> NewEvent:
    return NewEvent(
        session_key=CHILD, kind=EventKind.HUMAN_DIRECT_MESSAGE, actor_type=ActorType.HUMAN
    )


async def test_a_wake_and_the_next_after_the_window_with_no_sleep(tmp_path: Path) -> None:
    gateway = HooksGateway()
    async with waking_kernel(tmp_path / "state.db", gateway, tmp_path / "token") as (
        kernel,
        timers,
    ):
        await kernel.watch(watcher=MAIN, target=CHILD)
        await kernel.record(turn())
        await timers.advance(0)
        assert 1 == len(gateway.texts)  # at once
        await kernel.record(turn())
        await timers.advance(19_000)
        assert 1 == len(gateway.texts)  # within the window: held
        await timers.advance(1_000)
        assert 2 == len(gateway.texts)  # the window passed, on the manual clock
        assert all(w["sessionKey"] == MAIN for w in gateway.wakes)
    assert 0o600 == (tmp_path / "token").stat().st_mode & 0o777


async def test_the_stand_in_answers_as_the_gateway_does_on_loopback() -> None:
    import aiohttp

    async with running_hooks_gateway() as gateway, aiohttp.ClientSession() as http:
        url = gateway.url + "/wake"
        async with http.post(url, json={"text": "x"}) as r:
            assert 401 == r.status  # no token
        auth = {"Authorization": f"Bearer {gateway.token}"}
        async with http.post(url, json={}, headers=auth) as r:
            assert (400, {"ok": False, "error": "text required"}) == (r.status, await r.json())
        async with http.post(url, json={"text": "wake up"}, headers=auth) as r:
            assert 200 == r.status and "queued" == (await r.json())["eventOutcome"]
        gateway.status = 503
        async with http.post(url, json={"text": "again"}, headers=auth) as r:
            assert 503 == r.status
    assert ["wake up"] == gateway.texts
