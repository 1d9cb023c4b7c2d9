"""The 24-hour chart of a link's turns, drawn on the server: a template filter."""

from __future__ import annotations

from markupsafe import Markup

CHART_W, CHART_H = 96, 18  # 24 bars of 3 px, 1 px apart


def turn_chart(hours: tuple[int, ...]) -> Markup:
    """A person's turns over the last 24 hours, an hour a bar (oldest on the left), scaled
    to the busiest hour: inline SVG drawn here, one path, no script."""
    total, peak = sum(hours), max(hours, default=0)
    label = f"{total} turn{'' if total == 1 else 's'} typed in the last 24 hours"
    if peak:
        label += f", at most {peak} in one hour"
    bars = "".join(
        f"M{i * 4 + 1.5:g} {CHART_H}V{CHART_H - max(round(n / peak * (CHART_H - 2)), 1)}"
        for i, n in enumerate(hours)
        if n
    )
    drawn = f'<path class="bars" d="{bars}"/>' if bars else ""
    return Markup(
        f'<svg class="turns" viewBox="0 0 {CHART_W} {CHART_H}" width="{CHART_W}"'
        f' height="{CHART_H}" role="img" aria-label="{label}"><title>{label}</title>'
        f'<path class="base" d="M0 {CHART_H - 0.5}H{CHART_W}"/>{drawn}</svg>'
    )
