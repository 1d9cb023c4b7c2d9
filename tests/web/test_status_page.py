"""The status page in a real browser: Debian's ``chromium``, headless, driven by Playwright,
against a real ``serve`` with adopted transcripts, one of them blocked and one missing.

It reads the page as a person would (rows, states, reasons), appends a prompt to a
transcript and waits for the page to show it without a reload, opens a session's timeline,
and keeps a screenshot in ``test-artefacts/``. Where chromium or Playwright is missing the
test skips and says why (CI installs both, and there their absence is an error).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.helpers import REPO, run_ok, served_address, user_line

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTEFACTS = REPO / "test-artefacts"
STATES = REPO / "tests" / "fixtures" / "states"
MAX_LINE = 16_384  # above the longest line of the harness capture the page is fed


def why_no_browser() -> str | None:
    if not Path(CHROMIUM).exists():
        return "chromium is not installed (Debian's chromium package)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install -e '.[test]')"
    return None


def skip_without_browser() -> None:
    why = why_no_browser()
    if why is None:
        return
    if os.environ.get("SESSIONWATCH_REQUIRE_BROWSER"):
        pytest.fail(f"the browser test is required here: {why}")
    pytest.skip(why)


def closed_port() -> int:
    """A loopback port nothing listens on."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


MISSING_AFTER = 1000  # the [monitor] missing_threshold of the served sidecar


class Serve:
    """``sessionwatch serve`` on a scratch database, and its one-shot commands."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.root = work / "claude"
        self.db = work / "state.db"
        self.config = work / "sessionwatch.toml"
        hooks_token = work / "hooks-token"
        hooks_token.write_text("a-hooks-token\n")
        hooks_token.chmod(0o600)
        self.config.write_text(
            f'[roots]\nclaude = "{self.root}"\n'
            f'[api]\nlisten = "127.0.0.1:0"\ntoken_file = "{work / "token"}"\n'
            f"[monitor]\ninitial_delay_s = 0\ninterval_s = 2\nmax_line_bytes = {MAX_LINE}\n"
            # a missing link stays missing while the test runs, however slow the machine:
            # its upstream_missing notice would join the watcher's pending ones
            f"missing_threshold = {MISSING_AFTER}\n"
            # a gateway that is down: the page says the last wake failed, and why
            f'[gateway]\nhooks_url = "http://127.0.0.1:{closed_port()}/hooks"\n'
            f'hooks_token_file = "{hooks_token}"\nretry_interval_s = 3600\n'
        )
        self.proc: subprocess.Popen[str] | None = None
        self.base = ""

    def cli(self, *args: str) -> str:
        argv = [sys.executable, "-m", "monitor", "--db", str(self.db), "--config"]
        return run_ok([*argv, str(self.config), *args])

    def start(self) -> None:
        argv = [sys.executable, "-m", "monitor", "--db", str(self.db), "--config"]
        self.proc = subprocess.Popen(
            [*argv, str(self.config), "serve"], cwd=REPO, stderr=subprocess.PIPE, text=True
        )
        self.base = served_address(self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    sidecar = Serve(tmp_path)
    yield sidecar
    sidecar.stop()


def transcript(serve: Serve, name: str, *prompts: str) -> Path:
    path = serve.root / "-work-project" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(user_line(p, f"{name}-{i}") for i, p in enumerate(prompts)))
    return path


def test_the_page_shows_states_reasons_and_a_new_turn_live(serve: Serve) -> None:
    skip_without_browser()
    from playwright.sync_api import expect, sync_playwright

    healthy = transcript(serve, "healthy", "fix the billing tests")
    blocked = transcript(serve, "blocked", "look at the logs")
    missing = transcript(serve, "missing", "start the migration")
    waiting = transcript(serve, "waiting")  # Claude Code's own records: its first, then a turn
    captured = (STATES / "claude-2.1.332.jsonl").read_bytes().splitlines(keepends=True)
    waiting.write_bytes(captured[0])
    named = (("healthy", healthy), ("blocked", blocked), ("missing", missing), ("waiting", waiting))
    for name, path in named:
        serve.cli(
            "adopt", "--kind", "claude", "--path", str(path), "--session-key", f"agent:main:{name}"
        )
        serve.cli("watch", "--watcher", "agent:main:main", "--target", f"agent:main:{name}")

    with blocked.open("ab") as f:  # a line over max_line_bytes blocks its link
        f.write(user_line("x" * (2 * MAX_LINE), "huge"))
    ended = orjson.loads((STATES / "claude-2.1.332.json").read_bytes())["ends"]["ends"]
    with waiting.open("ab") as f:  # the turn ended: the next move is a person's
        f.write(b"".join(captured[1:ended]))
    missing.unlink()
    serve.start()
    link = serve.cli("open", "--url", serve.base).strip()
    assert link.startswith(f"{serve.base}/ui/login?ticket=")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(link)
        assert page.url == f"{serve.base}/"  # the ticket is spent, the URL holds none
        expect(page.locator("#live-state")).to_have_text("live")

        rows = page.locator("tr.link")
        expect(rows).to_have_count(4)
        needs = page.locator("#needs-you li.needs")  # the panel: only the session that waits
        expect(needs).to_have_count(1, timeout=15_000)
        expect(needs).to_have_attribute("data-key", "agent:main:waiting")
        expect(needs.locator(".doing")).to_contain_text("waiting")
        expect(page.locator('tr[data-key="agent:main:healthy"]')).to_have_attribute(
            "data-state", "healthy"
        )
        blocked_row = page.locator('tr[data-key="agent:main:blocked"]')
        expect(blocked_row).to_have_attribute("data-state", "blocked", timeout=15_000)
        expect(blocked_row.locator(".reason")).to_contain_text("max_line_bytes")
        missing_row = page.locator('tr[data-key="agent:main:missing"]')
        expect(missing_row).to_have_attribute("data-state", "missing", timeout=15_000)
        expect(missing_row.locator(".reason")).to_contain_text(f"of {MISSING_AFTER} checks")

        healthy_row = page.locator('tr[data-key="agent:main:healthy"]')
        expect(healthy_row.locator(".hour")).to_have_text("0")
        # a second view, CSP bypassed only so that it can time the change at every frame
        timer = browser.new_context(bypass_csp=True)
        timer.add_cookies(page.context.cookies())
        timed = timer.new_page()
        timed.goto(f"{serve.base}/")
        expect(timed.locator("#live-state")).to_have_text("live")
        started = time.monotonic()
        with healthy.open("ab") as f:
            f.write(user_line("and run them again", "healthy-new"))
        hour = 'tr[data-key="agent:main:healthy"] .hour'
        timed.wait_for_function(
            f"document.querySelector('{hour}').textContent.trim() === '1'",
            polling="raf",
            timeout=15_000,
        )
        shown_after = time.monotonic() - started
        timer.close()
        expect(healthy_row.locator(".hour")).to_have_text("1")  # and in the page with its CSP
        expect(healthy_row.locator(".typed")).to_contain_text("s ago")
        watcher = page.locator('.watcher[data-watcher="agent:main:main"]')
        expect(watcher).to_contain_text("2 pending (agent:main:healthy, agent:main:waiting)")
        expect(watcher.locator(".wake")).to_contain_text("last wake failed", timeout=15_000)
        expect(watcher.locator(".wake")).to_contain_text("refused")  # connection refused

        events = serve.cli("status", "agent:main:healthy", "--changes-since", "0")
        sequences = [e["sequence"] for e in orjson.loads(events)["stateChanges"]["events"]]
        ARTEFACTS.mkdir(exist_ok=True)
        phone = browser.new_page(viewport={"width": 390, "height": 844})
        phone.context.add_cookies(page.context.cookies())
        phone.goto(f"{serve.base}/")
        expect(phone.locator('tr[data-key="agent:main:healthy"]')).to_be_visible()
        phone.screenshot(path=str(ARTEFACTS / "status-page-phone.png"), full_page=True)
        for view in (page, phone):  # a desktop and a phone: the timeline comes into view
            view.set_viewport_size({"width": 1280, "height": 700} if view is page else
                                   {"width": 390, "height": 844})  # fmt: skip
            row = view.locator('tr[data-key="agent:main:healthy"]')
            row.locator(".open-timeline").click()
            timeline = view.locator("#timeline")
            expect(timeline).to_be_visible()
            expect(timeline).to_be_in_viewport()
            expect(timeline.locator(".close-timeline")).to_be_focused()
            turn = timeline.locator(".event.kind-human_direct_message")
            expect(turn).to_have_count(1)
            expect(turn.locator(".seq")).to_have_text(f"#{sequences[-1]}")  # as notices quote
            assert "human human" not in timeline.inner_text()
            assert "and run them again" not in timeline.inner_text()  # never message content
            view.screenshot(path=str(ARTEFACTS / f"timeline-{view.viewport_size['width']}.png"))
            if view is phone:  # a live refresh while it is open replaces the table's links
                with healthy.open("ab") as f:
                    f.write(user_line("and once more", "healthy-third"))
                expect(row.locator(".hour")).to_have_text("2", timeout=15_000)
                expect(timeline.locator(".close-timeline")).to_be_focused()  # kept through it
            view.keyboard.press("Escape")
            expect(timeline).to_be_hidden()
            expect(row.locator(".open-timeline")).to_be_focused()  # focus back where it was
            row.locator(".open-timeline").click()
            expect(timeline).to_be_visible()
            view.go_back()  # Back closes it, and stays on the page
            expect(timeline).to_be_hidden()
            assert view.url.startswith(f"{serve.base}/")
        page.screenshot(path=str(ARTEFACTS / "status-page.png"), full_page=True)
        browser.close()
    assert [] == errors  # no script error, no CSP violation
    print(f"the appended turn was on the page {shown_after:.2f} s after the append")


def api(serve: Serve, method: str, path: str, body: Any = None) -> Any:
    import urllib.request

    token = (serve.work / "token").read_text().strip()
    request = urllib.request.Request(
        serve.base + path,
        method=method,
        data=None if body is None else orjson.dumps(body),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return orjson.loads(resp.read())


def test_many_sessions_come_in_pages_with_titles_and_a_chart_of_their_day(serve: Serve) -> None:
    """150 adopted sessions: the first page shows the 100 typed into most recently, each with
    its own title at first paint (read from its file, not from the whole catalog later);
    the next page the other 50. A session typed into shows its day as a chart, drawn by the
    server as inline SVG, on a desktop and on a phone."""
    skip_without_browser()
    from playwright.sync_api import expect, sync_playwright

    serve.start()
    for i in range(150):
        path = transcript(serve, f"s{i:03d}", f"prompt {i}")
        with path.open("ab") as f:
            f.write(orjson.dumps({"type": "custom-title", "customTitle": f"task {i:03d}"}) + b"\n")
        api(serve, "POST", "/v1/links", {"kind": "claude", "path": str(path),
                                         "sessionKey": f"agent:main:s{i:03d}"})  # fmt: skip
    for _ in range(3):  # a person typed into s042 three times
        api(serve, "POST", "/v1/events", {"sessionKey": "agent:main:s042",
            "kind": "human_direct_message", "actorType": "human"})  # fmt: skip
    link = serve.cli("open", "--url", serve.base).strip()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        errors: list[str] = []
        for viewport in ({"width": 1280, "height": 900}, {"width": 390, "height": 844}):
            page = browser.new_page(viewport=viewport)  # type: ignore[arg-type]
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            answer = page.goto(link)
            assert answer is not None and len(answer.body()) < 200_000
            expect(page.locator("#live-state")).to_have_text("live")
            rows = page.locator("tr.link")
            expect(rows).to_have_count(100)
            assert "agent:main:s042" == rows.first.get_attribute("data-key")  # typed into
            expect(rows.first.locator(".title")).to_have_text("task 042")  # at first paint
            chart = rows.first.locator("svg.turns")
            expect(chart).to_have_attribute(
                "aria-label", "3 turns typed in the last 24 hours, at most 3 in one hour"
            )
            expect(chart).to_be_visible()  # drawn, in the page's CSP (a live swap may come)
            expect(rows.nth(1).locator("svg.turns path.bars")).to_have_count(0)
            expect(page.locator(".pages .range")).to_contain_text("1\u2013100 of 150")
            page.screenshot(path=str(ARTEFACTS / f"many-{viewport['width']}.png"))
            page.locator('.pages a[rel="next"]').click()
            expect(rows).to_have_count(50)
            expect(page.locator(".pages .range")).to_contain_text("101\u2013150 of 150")
            expect(rows.first.locator(".title")).not_to_have_text("—")
            link = serve.cli("open", "--url", serve.base).strip()  # a ticket a page
        browser.close()
    assert [] == errors


def test_catalog_keys_and_long_titles_fit_a_phone_and_stay_told_apart(serve: Serve) -> None:
    """Sessions the gateway's catalog adopted carry keys that end in a 64-hex run and differ
    only there: on a 390 px phone the page stays 390 px wide, the keys shown differ (their
    tails are kept), and a long title takes at most three lines, whole in its tooltip."""
    skip_without_browser()
    from playwright.sync_api import sync_playwright

    serve.start()
    head = "agent:main:plugin:anthropic:catalog-adopt:claude:"
    keys = [head + digit * 56 + f"{i:08x}" for i, digit in enumerate("ab")]
    title = "rework the billing pipeline so that " * 12
    for i, key in enumerate(keys):
        path = transcript(serve, f"c{i}", title)
        api(serve, "POST", "/v1/links", {"kind": "claude", "path": str(path), "sessionKey": key})
        api(serve, "POST", "/v1/watches", {"watcher": "agent:main:main", "target": key})
        api(serve, "POST", "/v1/events", {"sessionKey": key,
            "kind": "human_direct_message", "actorType": "human"})  # fmt: skip
    link = serve.cli("open", "--url", serve.base).strip()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        for width in (390, 1280):
            page = browser.new_page(viewport={"width": width, "height": 844})
            page.goto(link)
            page.locator("tr.link").first.wait_for()
            assert width >= page.evaluate("document.documentElement.scrollWidth"), width
            shown = page.locator("tr.link .open-timeline").all_inner_texts()
            assert 2 == len(set(shown)) and all(k[-8:] in " ".join(shown) for k in keys)
            title_cell = page.locator("tr.link .title").first
            whole = (title_cell.get_attribute("title") or "").rstrip("…").strip()
            assert len(whole) > 150 and title.startswith(whole)  # the title as the sidecar keeps it
            line = float(page.evaluate(
                "parseFloat(getComputedStyle(document.querySelector('tr.link .clamp')).lineHeight)"
            ))  # fmt: skip
            box = _box(page.locator("tr.link .clamp").first)
            assert box["height"] <= 3 * line + 1, (box, line)
            if width == 390:
                page.screenshot(path=str(ARTEFACTS / "catalog-keys-phone.png"), full_page=True)
            link = serve.cli("open", "--url", serve.base).strip()
        browser.close()


def _box(element: Any) -> Any:
    """An element's bounding box. A live refresh swaps the whole table in while the
    monitor's first checks of the links still change what it shows, so the element found
    may be gone when it is measured (a box of None): it is found and measured again."""
    for _ in range(100):
        if (box := element.bounding_box()) is not None:
            return box
        time.sleep(0.05)
    raise AssertionError(f"{element} has no box: not shown")


def test_the_page_needs_a_ticket_and_a_ticket_works_once(serve: Serve) -> None:
    """Without the cookie: a 401 page naming ``sessionwatch open``, and no data; a ticket
    is spent by its first use; the API's token opens the page too (for scripts)."""
    import urllib.error
    import urllib.request

    serve.start()

    def get(url: str) -> tuple[int, str, dict[str, str]]:
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return resp.status, resp.read().decode(), dict(resp.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), dict(exc.headers)

    for path in ("/", "/ui/live", "/ui/sessions/agent:main:any", "/ui/stream"):
        status, body, headers = get(serve.base + path)
        assert 401 == status, path
        assert "sessionwatch open" in body
        assert "script-src 'self'" in headers["Content-Security-Policy"]
    link = serve.cli("open", "--url", serve.base).strip()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    with opener.open(link, timeout=10) as resp:
        assert 200 == resp.status
        assert "Adopted sessions" in resp.read().decode()
    status, body, _ = get(link)
    assert 403 == status and "spent or expired" in body
    token = (serve.work / "token").read_text().strip()
    request = urllib.request.Request(serve.base + "/", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert 200 == resp.status


def test_the_page_answers_only_to_its_own_host_names(serve: Serve) -> None:
    """A page of another site whose DNS name was rebound to loopback gets 421, and no
    ticket: the status page is behind the API's Host check."""
    import http.client

    serve.start()
    host, port = serve.base.removeprefix("http://").rsplit(":", 1)
    for path in ("/", "/ui/login?ticket=x", "/static/app.js", "/v1/ui/tickets"):
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        method = "POST" if path.startswith("/v1/") else "GET"
        conn.request(method, path, headers={"Host": "evil.example"})
        assert 421 == conn.getresponse().status, path
        conn.close()


def _view(**given: object) -> object:
    from adapters.base import Drift
    from monitor.upstream.links import LinkView, UpstreamLink

    foreign = bool(given.pop("foreign", False))
    link = UpstreamLink(
        session_key="agent:main:adopted:x",
        agent_id="main",
        catalog_id=None,
        host_id=None,
        thread_id=None,
        upstream_kind="hologram" if foreign else "claude",
        kind=None if foreign else "claude",
        ref={},
        marker={},
        last_scanned_at=None,
        created_at=0,
        updated_at=0,
    )
    fields: dict[str, object] = {
        "link": link,
        "marker": {},
        "watched": True,
        "blocked": None,
        "missing_streak": 0,
        "status": None,
        "drift": Drift(),
    }
    fields.update(given)
    return LinkView(**fields)  # type: ignore[arg-type]


def _views() -> list[tuple[object, str, str]]:
    from adapters.base import Drift
    from monitor.upstream.links import Blocked, LastCheck

    return [
        (_view(blocked=Blocked(7, "a line longer than max_line_bytes")), "blocked", "a line"),
        (_view(missing_streak=2), "missing", "2 of 3"),
        (_view(status=LastCheck("inconclusive", "node n1 down")), "inconclusive", "n1"),
        (_view(drift=Drift(unknown_types={"hologram": 1})), "drifting", "hologram"),
        (_view(drift=Drift(newer=True, version="9.9")), "drifting", "9.9"),
        (_view(foreign=True), "foreign", "does not read"),
        (_view(status=LastCheck("activity", None)), "healthy", ""),
    ]


def test_a_link_reads_as_one_state_with_its_reason() -> None:
    from monitor.web.page_state import shown_state

    for view, state, reason in _views():
        found, why = shown_state(view, 3)  # type: ignore[arg-type]
        assert state == found, view
        assert reason in why


async def test_two_sidecars_on_one_host_have_their_own_cookies() -> None:
    """Cookies ignore ports: each instance names its own."""
    import asyncio
    from types import SimpleNamespace

    from monitor.config import ApiConfig, Config
    from monitor.web.status_page import StatusPage

    states = [
        SimpleNamespace(db=db, config=Config(api=ApiConfig(listen=listen)))
        for db, listen in (("/a/state.db", "127.0.0.1:8765"), ("/b/state.db", "127.0.0.1:8799"))
    ]
    pages = [StatusPage(s, "t", asyncio.Event()) for s in states]  # type: ignore[arg-type]
    assert pages[0].cookie != pages[1].cookie
    assert all(p.cookie.startswith("sessionwatch_ui_") for p in pages)


async def test_titles_come_at_once_for_a_new_thread_and_every_five_minutes_else() -> None:
    """A thread the last catalog read was not asked for gets its title at once, not within
    five minutes; the titles read are said on the bus, with the titles."""
    from contextlib import AsyncExitStack

    from monitor.kernel.bus import Bus, TitlesRead
    from monitor.web.titles import TITLES_TTL_S, TitleReader

    now = [0.0]
    catalog = {"t-old": "an old one"}

    async def read() -> dict[str, str]:
        return dict(catalog)

    bus = Bus()
    heard: list[TitlesRead] = []
    bus.subscribe(TitlesRead, heard.append)
    titles = TitleReader(read, clock=lambda: now[0])
    async with AsyncExitStack() as stack:
        await titles.start(stack, bus)
        titles.want({"t-old"})
        await titles.settled()
        titles.want({"t-old"})  # nothing new: within the five minutes, no read
        await titles.settled()
        assert 1 == titles.reads
        catalog["t-new"] = "fix the billing tests"
        titles.want({"t-old", "t-new"})  # just adopted
        await titles.settled()
        assert (2, "fix the billing tests") == (titles.reads, heard[-1].titles["t-new"])
        now[0] += TITLES_TTL_S
        titles.want({"t-old", "t-new"})
        await titles.settled()
        assert 3 == titles.reads == len(heard)


WIDTHS = (320, 390, 768, 1024, 1280, 1440, 1920, 2560)


def _axe() -> Path | None:
    """axe-core's browser build, installed beside the interop packages (install.sh)."""
    from tests.interop import MODULES

    path = MODULES / "axe-core" / "axe.min.js"
    return path if path.exists() else None


def test_the_page_holds_at_every_width_and_passes_axe(serve: Serve) -> None:
    """Rows with the gateway catalog's long keys and a long title, at every width from a
    small phone to a wide screen: no sideways scroll, the state word whole on one line, the
    kind unbroken; and axe-core finds no violation of WCAG 2 A and AA on the page."""
    skip_without_browser()
    axe = _axe()
    if axe is None:
        if os.environ.get("SESSIONWATCH_REQUIRE_BROWSER"):
            pytest.fail("axe-core is required here: run tests/interop/install.sh")
        pytest.skip("axe-core is not installed: run tests/interop/install.sh")
    from playwright.sync_api import sync_playwright

    serve.start()
    ARTEFACTS.mkdir(exist_ok=True)
    head = "agent:main:plugin:anthropic:catalog-adopt:claude:"
    title = "rework the billing pipeline so that " * 12
    for i, digit in enumerate("abc"):
        key = head + digit * 56 + f"{i:08x}"
        path = transcript(serve, f"w{i}", title)
        api(serve, "POST", "/v1/links", {"kind": "claude", "path": str(path), "sessionKey": key})
        api(serve, "POST", "/v1/watches", {"watcher": "agent:main:main", "target": key})
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        for width in WIDTHS:
            # the page's own CSP refuses any script but its own: axe is let in by the test
            context = browser.new_context(viewport={"width": width, "height": 900}, bypass_csp=True)
            page = context.new_page()
            page.goto(serve.cli("open", "--url", serve.base).strip())
            page.locator("tr.link").first.wait_for()
            scroll = page.evaluate("document.documentElement.scrollWidth")
            assert scroll <= width, (width, scroll)
            lines = page.evaluate(
                "Array.from(document.querySelectorAll('tr.link .state'))"
                ".map(s => s.getClientRects().length)"
            )
            assert lines and all(n == 1 for n in lines), (width, lines)  # whole, on one line
            words = page.evaluate(
                "Array.from(document.querySelectorAll('tr.link .state'))"
                ".map(s => s.scrollWidth <= s.getBoundingClientRect().width + 1)"
            )
            assert all(words), width
            if width in (320, 1440, 2560):
                page.screenshot(path=str(ARTEFACTS / f"page-{width}px.png"), full_page=True)
            if width in (390, 1440):
                page.add_script_tag(path=str(axe))
                found = page.evaluate(
                    "axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa']}})"
                    ".then(r => r.violations.map(v => [v.id, v.nodes.length, v.help]))"
                )
                assert found == [], (width, found)
            context.close()
        browser.close()
