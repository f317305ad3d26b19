"""Charts for the status page, rendered here as SVG.

Why server-side SVG and not a JavaScript charting library: the series are already thinned
by the database (`JobRepository.metrics`), a line over a few hundred points is a single
`<polyline>`, and the page then needs no script to draw, no package to vendor and no
build step; the same markup is checked by the API tests (its points are plain numbers)
and drawn by any browser. What is given up: hover read-outs (the value under the pointer);
the chart's title shows the latest value instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape


@dataclass(frozen=True)
class Series:
    """Points (x, y) in x order; `breaks` are x values where a new attempt began,
    `marks` those of events to point at (a bad step the trainer acted on)."""

    points: Sequence[tuple[float, float]]
    breaks: Sequence[float] = ()
    marks: Sequence[float] = ()


def _scale(value: float, low: float, high: float, size: float) -> float:
    return size / 2 if high == low else (value - low) / (high - low) * size


def _polyline(
    points: Sequence[tuple[float, float]], width: float, height: float, pad: float
) -> tuple[str, tuple[float, float, float, float]]:
    xs, ys = [x for x, _ in points], [y for _, y in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    coords = " ".join(
        f"{pad + _scale(x, x0, x1, width - 2 * pad):.1f},"
        f"{height - pad - _scale(y, y0, y1, height - 2 * pad):.1f}"
        for x, y in points
    )
    return coords, (x0, x1, y0, y1)


def _tick(value: float) -> str:
    """A short axis label: 3 significant digits, thousands as k and millions as M."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def sparkline(values: Sequence[float], *, width: int = 120, height: int = 28) -> Markup:
    """A bare line of the values (a job's loss in the jobs table); empty with < 2."""
    if len(values) < 2:
        return Markup("")
    coords, _ = _polyline(list(enumerate(values)), width, height, 2)
    return Markup(
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="trend"><polyline points="{coords}"/></svg>'
    )


def _verticals(
    kind: str,
    xs: Sequence[float],
    *,
    span: tuple[float, float],
    pad: float,
    plot_w: float,
    plot_h: float,
) -> str:
    """A vertical line of class `kind` at each x within the plotted span."""
    x0, x1 = span
    lines = []
    for x in xs:
        if x0 <= x <= x1:
            at = pad + _scale(x, x0, x1, plot_w)
            lines.append(
                f'<line class="{kind}" x1="{at:.1f}" y1="{pad:.0f}" x2="{at:.1f}" '
                f'y2="{pad + plot_h:.0f}"/>'
            )
    return "".join(lines)


def line_chart(series: Series, *, title: str, width: int = 560, height: int = 220) -> Markup:
    """A chart with its range on the axes and a dashed line where each attempt resumed."""
    points = series.points
    if len(points) < 2:
        return Markup(f'<p class="muted">{escape(title)}: not enough points yet</p>')
    pad = 48.0
    coords, (x0, x1, y0, y1) = _polyline(points, width, height, pad)
    plot_w, plot_h = width - 2 * pad, height - 2 * pad
    breaks, marks = (
        _verticals(kind, xs, span=(x0, x1), pad=pad, plot_w=plot_w, plot_h=plot_h)
        for kind, xs in (("break", series.breaks), ("mark", series.marks))
    )
    latest = points[-1][1]
    return Markup(
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{escape(title)}">'
        f'<text class="title" x="{pad}" y="18">{escape(title)} (latest {_tick(latest)})</text>'
        f'<rect class="frame" x="{pad}" y="{pad}" width="{plot_w}" height="{plot_h}"/>'
        f'<text class="tick" x="{pad - 4}" y="{pad + 4}" text-anchor="end">{_tick(y1)}</text>'
        f'<text class="tick" x="{pad - 4}" y="{pad + plot_h}" text-anchor="end">{_tick(y0)}'
        "</text>"
        f'<text class="tick" x="{pad}" y="{height - pad + 14}">{x0:.0f}</text>'
        f'<text class="tick" x="{pad + plot_w}" y="{height - pad + 14}" text-anchor="end">'
        f"{x1:.0f}</text>"
        f'<text class="tick" x="{pad + plot_w / 2}" y="{height - 6}" text-anchor="middle">'
        "step</text>"
        f'{breaks}{marks}<polyline class="line" points="{coords}"/></svg>'
    )


def scatter_chart(
    points: Sequence[tuple[float, float]],
    *,
    title: str,
    x_label: str,
    log_x: bool = False,
    width: int = 360,
    height: int = 220,
) -> Markup:
    """One dot per (x, y): a sweep's objective against a parameter or against time.
    `log_x` spaces x by its logarithm (a learning rate drawn log-uniformly)."""
    shown = [(x, y) for x, y in points if not log_x or x > 0]
    if not shown:
        return Markup(f'<p class="muted">{escape(title)}: no values yet</p>')
    pad = 48.0
    plot_w, plot_h = width - 2 * pad, height - 2 * pad
    xs = [math.log10(x) if log_x else x for x, _ in shown]
    ys = [y for _, y in shown]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    dots = "".join(
        f'<circle class="pt" cx="{pad + _scale(x, x0, x1, plot_w):.1f}" '
        f'cy="{height - pad - _scale(y, y0, y1, plot_h):.1f}" r="3"/>'
        for x, y in zip(xs, ys, strict=True)
    )
    low, high = (10**x0, 10**x1) if log_x else (x0, x1)
    return Markup(
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{escape(title)}">'
        f'<text class="title" x="{pad}" y="18">{escape(title)}</text>'
        f'<rect class="frame" x="{pad}" y="{pad}" width="{plot_w}" height="{plot_h}"/>'
        f'<text class="tick" x="{pad - 4}" y="{pad + 4}" text-anchor="end">{_tick(y1)}</text>'
        f'<text class="tick" x="{pad - 4}" y="{pad + plot_h}" text-anchor="end">{_tick(y0)}'
        "</text>"
        f'<text class="tick" x="{pad}" y="{height - pad + 14}">{_tick(low)}</text>'
        f'<text class="tick" x="{pad + plot_w}" y="{height - pad + 14}" text-anchor="end">'
        f"{_tick(high)}</text>"
        f'<text class="tick" x="{pad + plot_w / 2}" y="{height - 6}" text-anchor="middle">'
        f"{escape(x_label)}</text>{dots}</svg>"
    )
