"""The catalog's search ranks by meaning, not by accident: a corpus of titles a person would
have, and the session each query should put first, typos and reordered words included."""

from __future__ import annotations

import pytest

from adapters.catalog import CatalogEntry, CatalogListing
from monitor.upstream.session_catalog import select

TITLES = (
    "fix the failing test",
    "new prompt in the fork",
    "billing: refund flow for annual plans",
    "migrate the billing service to postgres",
    "add dark mode to the settings page",
    "investigate flaky login test on CI",
    "write release notes for 2.4",
    "upgrade react to version 19",
    "refactor the payment gateway client",
    "rename the user table columns",
    "speed up the docker build",
    "document the public API",
    "add rate limiting to the webhook endpoint",
    "debug memory leak in the worker",
    "translate the onboarding emails to german",
    "clean up unused feature flags",
    "set up sentry error reporting",
    "paginate the invoices list",
    "fix timezone bug in the scheduler",
    "add csv export to reports",
    "improve search ranking in the catalog",
    "review the pull request from dana",
    "bump dependencies and fix warnings",
    "tune the postgres connection pool",
    "write integration tests for the importer",
    "remove the legacy auth middleware",
    "add retries to the email sender",
    "profile the slow dashboard query",
    "split the monolith config file",
    "draft the quarterly roadmap",
    "a run in the sandbox",
    "it is on in an hour",
)
QUERIES = {
    "billing": "billing: refund flow for annual plans",
    "bilin refund": "billing: refund flow for annual plans",
    "billing postgres migrate": "migrate the billing service to postgres",
    "falling test fix": "fix the failing test",
    "test failing": "fix the failing test",
    "dark mode": "add dark mode to the settings page",
    "mode dark settings": "add dark mode to the settings page",
    "flakey login": "investigate flaky login test on CI",
    "relase notes": "write release notes for 2.4",
    "react upgrade": "upgrade react to version 19",
    "paymnet gateway": "refactor the payment gateway client",
    "dockr build speed": "speed up the docker build",
    "webhook rate limit": "add rate limiting to the webhook endpoint",
    "memory leak worker": "debug memory leak in the worker",
    "german emails": "translate the onboarding emails to german",
    "feature flags cleanup": "clean up unused feature flags",
    "timezone scheduler": "fix timezone bug in the scheduler",
    "csv export": "add csv export to reports",
    "connection pool postgres": "tune the postgres connection pool",
    "importer integration tests": "write integration tests for the importer",
    "slow dashboard": "profile the slow dashboard query",
    "roadmap": "draft the quarterly roadmap",
}


def catalog() -> CatalogListing:
    entries = [
        CatalogEntry(
            catalog_id=f"claude:{i:016x}",
            kind="claude",
            native_id=f"s{i}",
            path=f"/p/s{i}.jsonl",
            cwd=None,
            title=title,
            updated_at=1_000 + i,
            size=1,
        )
        for i, title in enumerate(TITLES)
    ]
    return CatalogListing(entries=entries, skipped=0, errors=[])


@pytest.mark.parametrize(("query", "best"), sorted(QUERIES.items()))
def test_the_best_hit_is_the_meant_session(query: str, best: str) -> None:
    found = select(catalog(), search=query)
    assert found.entries, f"{query!r} found nothing"
    assert best == found.entries[0].title, [(e.title, e.score) for e in found.entries[:3]]


@pytest.mark.parametrize("query", ["billing", "postgres", "refund", "dashboard"])
def test_a_short_word_of_a_title_is_no_match_for_a_longer_query_word(query: str) -> None:
    """ "in", "on", "a", "it" inside a query's word are coincidences, not matches."""
    titles = [e.title for e in select(catalog(), search=query).entries]
    for noise in ("new prompt in the fork", "a run in the sandbox", "it is on in an hour"):
        assert noise not in titles, titles


def test_the_table_shows_a_paired_nodes_kind_whole(capsys: pytest.CaptureFixture[str]) -> None:
    from monitor.cli.table import print_catalog

    entry = CatalogEntry(
        catalog_id="claude-node:0123456789abcdef",
        kind="claude-node",
        native_id="t",
        path="laptop",
        cwd="/home/me/project",
        title="fix the billing tests, and a title long enough to be cut",
        updated_at=0,
        size=10,
        node="laptop",
    )
    print_catalog(CatalogListing(entries=[entry], skipped=0, errors=[]), 1000)
    assert "claude-node@laptop" in capsys.readouterr().out


def test_the_table_escapes_control_characters_and_markup(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A hostile title reaches the terminal as text: ESC[2J would clear the screen, and
    rich markup in it is not read as markup."""
    from monitor.cli.table import print_catalog

    entry = CatalogEntry(
        catalog_id="claude:0123456789abcdef",
        kind="claude",
        native_id="t",
        path="/p/s.jsonl",
        cwd="/home/me/\x1b]0;pwned\x07proj",
        title="\x1b[2Jclear [bold red]me[/bold red] \u009b31m",
        updated_at=0,
        size=10,
    )
    print_catalog(
        CatalogListing(entries=[entry], skipped=0, errors=[{"path": "/x\x1b[2J", "reason": "bad"}]),
        1000,
        width=200,
    )
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
    assert "\\x1b[2Jclear [bold red]me[/bold red] \\x9b31m" in out
    assert "\\x1b]0;pwned\\x07pr" in out  # the directory column is cut to fit
    assert "1 session; 1 source could not be read:\n  /x\\x1b[2J: bad\n" in out
