"""The 24-hour chart of a link's turns, drawn on the server: a template filter."""

from __future__ import annotations

from markupsafe import Markup

CHART_W, CHART_H = 96, 18  # 24 bars of 3 px, 1 px apart


SPANS = ("working", "waiting", "asking")  # the states drawn under the bars, each its class


def turn_chart(hours: tuple[int, ...], doing: tuple[str | None, ...] = ()) -> Markup:
    """A person's turns over the last 24 hours, an hour a bar (oldest on the left), scaled
    to the busiest hour, and under them what the session did most of each hour (working,
    waiting for a person, asking: a band of its own colour, ``doing``): inline SVG drawn
    here, a path each, no script."""
    total, peak = sum(hours), max(hours, default=0)
    label = f"{total} turn{'' if total == 1 else 's'} typed in the last 24 hours"
    if peak:
        label += f", at most {peak} in one hour"
    held = {s: sum(1 for d in doing if d == s) for s in SPANS}
    said = [f"{state} {n} h" for state, n in held.items() if n]
    if said:
        label += "; " + ", ".join(said)
    bars = "".join(
        f"M{i * 4 + 1.5:g} {CHART_H - 3}V{CHART_H - 3 - max(round(n / peak * (CHART_H - 5)), 1)}"
        for i, n in enumerate(hours)
        if n
    )
    drawn = f'<path class="bars" d="{bars}"/>' if bars else ""
    for state in SPANS:  # a 2 px band under each hour, as the bars are spaced
        band = "".join(f"M{i * 4:g} {CHART_H - 1}h4" for i, d in enumerate(doing) if d == state)
        drawn += f'<path class="span-{state}" d="{band}"/>' if band else ""
    return Markup(
        f'<svg class="turns" viewBox="0 0 {CHART_W} {CHART_H}" width="{CHART_W}"'
        f' height="{CHART_H}" role="img" aria-label="{label}"><title>{label}</title>'
        f'<path class="base" d="M0 {CHART_H - 3.5}H{CHART_W}"/>{drawn}</svg>'
    )
