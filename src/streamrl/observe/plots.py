"""A small inline-SVG plotting module for the HTML report: line charts and stacked bar charts.

Dependency-free on purpose: the report must open without network or JavaScript, and a few hundred
points per chart do not need matplotlib. Every chart is one `<svg class="plot" data-plot=NAME>`; a
series is one `<path>` (plus a circle per point when there are few), a bar is one `<rect>`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
DASHES = ["", "6 3", "2 3", "8 3 2 3"]
W, H = 480, 250
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 10, 34


@dataclass
class Series:
    """One line: points with x and y (None / non-finite y leaves a gap); color and dash are indices."""

    name: str
    xs: list[float]
    ys: list[float | None]
    color: int = 0
    dash: int = 0
    points: list[tuple[float, float]] = field(init=False)

    def __post_init__(self) -> None:
        self.points = [
            (float(x), float(y)) for x, y in zip(self.xs, self.ys) if y is not None and math.isfinite(y)
        ]


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round tick values covering [lo, hi] (1, 2 or 5 times a power of ten apart)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 0.5 and len(ticks) < 50:
        ticks.append(round(t, 12))
        t += step
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e4 or abs(v) < 1e-3:
        return f"{v:.0e}"
    return f"{v:.4g}"


def _axes(
    xt: list[float], yt: list[float], sx: Callable[[float], float], sy: Callable[[float], float], x_label: str
) -> list[str]:
    out = [
        f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" class="frame"/>'
    ]
    for y in yt:
        py = sy(y)
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{py:.1f}" y2="{py:.1f}" class="grid"/>')
        out.append(f'<text x="{LEFT - 4}" y="{py + 3:.1f}" text-anchor="end">{_fmt(y)}</text>')
    for x in xt:
        px = sx(x)
        out.append(f'<text x="{px:.1f}" y="{H - BOTTOM + 13}" text-anchor="middle">{_fmt(x)}</text>')
    out.append(
        f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 4}" text-anchor="middle">{escape(x_label)}</text>'
    )
    return out


def _legend(items: list[tuple[str, str, str]], shape: str = "line") -> str:
    """HTML legend (wraps freely, unlike SVG text): (label, color, dash) per entry."""
    spans = []
    for label, color, dash in items:
        if shape == "line":
            mark = (
                f'<svg width="22" height="8" class="key"><line x1="0" x2="22" y1="4" y2="4" stroke="{color}" '
                f'stroke-width="2.5" stroke-dasharray="{dash}"/></svg>'
            )
        else:
            mark = (
                f'<svg width="10" height="10" class="key"><rect width="10" height="10" fill="{color}"/></svg>'
            )
        spans.append(f"<span>{mark} {escape(label)}</span>")
    return f'<div class="legend">{"".join(spans)}</div>'


def _svg(name: str, body: list[str]) -> str:
    return (
        f'<svg class="plot" data-plot="{escape(name)}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
        f'xmlns="http://www.w3.org/2000/svg" role="img">{"".join(body)}</svg>'
    )


def _empty(name: str, title: str, note: str) -> str:
    body = [f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle" class="empty">{escape(note)}</text>']
    caption = f"<figcaption>{escape(title)}</figcaption>"
    return f'<figure class="chart empty-chart">{caption}{_svg(name, body)}</figure>'


def line_chart(
    name: str,
    title: str,
    series: list[Series],
    x_label: str = "step",
    y_range: tuple[float, float] | None = None,
) -> str:
    """A <figure> with one SVG line chart; series without points are left out of the legend."""
    shown = [s for s in series if s.points]
    if not shown:
        return _empty(name, title, "no data in this run")
    xs = [x for s in shown for x, _ in s.points]
    ys = [y for s in shown for _, y in s.points]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    y0, y1 = y_range if y_range else (min(ys), max(ys))
    if not y_range:
        pad = (y1 - y0) * 0.05 or max(abs(y1) * 0.1, 0.05)
        y0, y1 = y0 - pad, y1 + pad
    yt = [t for t in nice_ticks(y0, y1) if y0 <= t <= y1] or [y0]
    xt = [t for t in nice_ticks(x0, x1, 6) if x0 <= t <= x1]

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * (W - LEFT - RIGHT)

    def sy(y: float) -> float:
        return TOP + (1 - (y - y0) / (y1 - y0)) * (H - TOP - BOTTOM)

    body = _axes(xt, yt, sx, sy, x_label)
    for s in shown:
        color, dash = PALETTE[s.color % len(PALETTE)], DASHES[s.dash % len(DASHES)]
        d = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(s.points))
        body.append(
            f'<path d="{d}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}" '
            f'data-series="{escape(s.name)}" data-points="{len(s.points)}"/>'
        )
        if len(s.points) <= 40:  # markers make single points and short runs visible
            body += [
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.6" fill="{color}"/>' for x, y in s.points
            ]
    legend = _legend([(s.name, PALETTE[s.color % len(PALETTE)], DASHES[s.dash % len(DASHES)]) for s in shown])
    return (
        f'<figure class="chart"><figcaption>{escape(title)}</figcaption>{_svg(name, body)}{legend}</figure>'
    )


def stacked_bars(
    name: str, title: str, categories: list[str], stacks: dict[str, list[float]], x_label: str
) -> str:
    """A <figure> with stacked vertical bars: one bar per category, one colored segment per stack. A
    value that is NaN, infinite or not above 0 draws no segment."""
    stacks = {k: [v if math.isfinite(v) and v > 0 else 0.0 for v in vals] for k, vals in stacks.items()}
    totals = [sum(v[i] for v in stacks.values()) for i in range(len(categories))]
    if not categories or not any(t > 0 for t in totals):
        return _empty(name, title, "no data in this run")
    y1 = max(totals) * 1.05
    yt = [t for t in nice_ticks(0, y1) if 0 <= t <= y1]
    n = len(categories)
    slot = (W - LEFT - RIGHT) / n
    bw = max(slot * 0.7, 1.0)

    def sy(y: float) -> float:
        return TOP + (1 - y / y1) * (H - TOP - BOTTOM)

    body = _axes([], yt, lambda x: x, sy, x_label)
    every = max(1, math.ceil(n / 12))  # at most ~12 category labels
    for i, cat in enumerate(categories):
        x = LEFT + i * slot + (slot - bw) / 2
        base = 0.0
        for j, (stack, vals) in enumerate(stacks.items()):
            v = vals[i]
            if v <= 0:
                continue
            body.append(
                f'<rect x="{x:.1f}" y="{sy(base + v):.1f}" width="{bw:.1f}" '
                f'height="{sy(base) - sy(base + v):.2f}" '
                f'fill="{PALETTE[j % len(PALETTE)]}" data-stack="{escape(stack)}"><title>{escape(cat)}: '
                f"{escape(stack)} = {_fmt(v)}</title></rect>"
            )
            base += v
        if i % every == 0:
            body.append(
                f'<text x="{x + bw / 2:.1f}" y="{H - BOTTOM + 13}" text-anchor="middle">{escape(cat)}</text>'
            )
    legend = _legend([(k, PALETTE[j % len(PALETTE)], "") for j, k in enumerate(stacks)], shape="box")
    return (
        f'<figure class="chart"><figcaption>{escape(title)}</figcaption>{_svg(name, body)}{legend}</figure>'
    )
