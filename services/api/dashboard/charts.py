"""Server-side SVG charts for the dashboard: pure functions from numbers to accessible markup.

The chart is an ``<svg role="img">`` with a ``<title>`` and ``<desc>`` naming what it shows;
every bar segment carries its own ``<title>`` (a tooltip and a name for assistive technology).
The numbers are always also on the page as a data table: the SVG is never the only copy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from html import escape

from markupsafe import Markup


@dataclass(frozen=True, slots=True)
class Series:
    """One stacked quantity: its key in each day's counts, a label and a fill colour."""

    key: str
    label: str
    color: str


@dataclass(frozen=True, slots=True)
class Geometry:
    width: int = 720
    height: int = 260
    left: int = 52
    right: int = 12
    top: int = 14
    bottom: int = 34

    @property
    def plot_width(self) -> int:
        return self.width - self.left - self.right

    @property
    def plot_height(self) -> int:
        return self.height - self.top - self.bottom


def nice_scale(maximum: int, *, ticks: int = 4) -> tuple[int, int]:
    """An axis top and step (1, 2 or 5 times a power of ten) covering ``maximum`` in ~``ticks``.

    An empty chart (``maximum`` 0) still gets a 0-``ticks`` axis so the grid is drawn.
    """
    if maximum <= 0:
        return ticks, 1
    raw = maximum / ticks
    power = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    step = max(int(step), 1)
    return math.ceil(maximum / step) * step, step


def day_label(day: date) -> str:
    """Short axis label, e.g. ``Mon 3``."""
    return f"{day.strftime('%a')} {day.day}"


def _attrs(**values: object) -> str:
    return " ".join(
        f'{k.rstrip("_").replace("_", "-")}="{escape(str(v))}"' for k, v in values.items()
    )


def stacked_bars(
    days: Sequence[date],
    counts: Sequence[Mapping[str, int]],
    series: Sequence[Series],
    *,
    title: str,
    desc: str,
    id_prefix: str = "chart",
    geometry: Geometry | None = None,
) -> Markup:
    """A stacked bar per day (first series at the bottom), with a labelled y axis and grid."""
    if len(days) != len(counts):
        raise ValueError("one counts mapping per day is required")
    g = geometry or Geometry()
    totals = [sum(max(int(c.get(s.key, 0)), 0) for s in series) for c in counts]
    top, step = nice_scale(max(totals, default=0))
    scale = g.plot_height / top
    baseline = g.top + g.plot_height
    parts = [
        f"<svg {_attrs(xmlns='http://www.w3.org/2000/svg', viewBox=f'0 0 {g.width} {g.height}')}"
        f' role="img" aria-labelledby="{escape(id_prefix)}-title {escape(id_prefix)}-desc"'
        ' class="chart" preserveAspectRatio="xMidYMid meet">',
        f'<title id="{escape(id_prefix)}-title">{escape(title)}</title>',
        f'<desc id="{escape(id_prefix)}-desc">{escape(desc)}</desc>',
        '<g class="chart-grid" aria-hidden="true">',
    ]
    for value in range(0, top + 1, step):
        y = baseline - value * scale
        parts.append(
            f"<line {_attrs(x1=g.left, x2=g.width - g.right, y1=f'{y:.1f}', y2=f'{y:.1f}')}/>"
            f"<text {_attrs(x=g.left - 8, y=f'{y + 4:.1f}', text_anchor='end')}>{value:,}</text>"
        )
    parts.append("</g>")
    band = g.plot_width / max(len(days), 1)
    bar = min(band * 0.6, 64.0)
    for i, (day, day_counts) in enumerate(zip(days, counts, strict=True)):
        x = g.left + band * i + (band - bar) / 2
        y = baseline
        label = day_label(day)
        parts.append(f'<g class="chart-day" data-day="{day.isoformat()}">')
        for s in series:
            value = max(int(day_counts.get(s.key, 0)), 0)
            if value == 0:
                continue
            h = value * scale
            y -= h
            parts.append(
                f"<rect {_attrs(x=f'{x:.1f}', y=f'{y:.1f}', width=f'{bar:.1f}', height=f'{h:.1f}')}"
                f' fill="{escape(s.color)}">'
                f"<title>{escape(f'{label}: {value:,} {s.label.lower()}')}</title></rect>"
            )
        parts.append(
            f"<text {_attrs(x=f'{x + bar / 2:.1f}', y=baseline + 20, text_anchor='middle')}"
            f' class="chart-axis">{escape(label)}</text></g>'
        )
    parts.append(
        f'<line class="chart-baseline" {_attrs(x1=g.left, x2=g.width - g.right)}'
        f' y1="{baseline}" y2="{baseline}" aria-hidden="true"/>'
    )
    if not any(totals):
        cx, cy = g.left + g.plot_width / 2, g.top + g.plot_height / 2
        parts.append(
            f"<rect {_attrs(x=f'{cx - 90:.1f}', y=f'{cy - 14:.1f}', width=180, height=24)}"
            ' rx="4" class="chart-empty-bg"/>'
            f"<text {_attrs(x=f'{cx:.1f}', y=f'{cy + 3:.1f}')}"
            ' text-anchor="middle" class="chart-empty">No mail in this period</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 - every interpolated value is escaped above
