"""The page's two plots as inline SVG (no script, nothing fetched): bench figures over time against
reference lines, and an image's bytes layer by layer. Each has a <title> and <desc> (its text
alternative) named by aria-labelledby, and keeps its numbers in data- attributes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

# Colour-blind-safe (Okabe-Ito); a mode is told by its legend entry and marker title too.
MODE_COLOURS = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9")
OTHER_COLOUR = "#777777"
WIDTH = 720


def human_bytes(count: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.2f} {unit}" if unit == "GB" else f"{count / size:.1f} {unit}"
    return f"{count} B"


def _a(value) -> str:
    return escape(str(value), quote=True)


def mode_colour(modes: list[str], mode: str) -> str:
    return MODE_COLOURS[modes.index(mode) % len(MODE_COLOURS)] if mode in modes else OTHER_COLOUR


def _nice_step(top: float, ticks: int = 5) -> float:
    raw = top / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(step * power for step in (1, 2, 2.5, 5, 10) if step * power >= raw)


@dataclass(frozen=True)
class Point:
    mode: str
    tok_s: float
    verdict: str | None
    slot: int  # which measurement time (x position)
    label: str  # what the marker's title says


@dataclass(frozen=True)
class Line:
    key: str  # "R1"
    stack: str
    mode: str
    tok_s: float
    pinned: bool
    label: str  # the full text: row, mode, figure, note


def bench_plot(plot_id: str, title: str, desc: str, modes: list[str], slots: list[str],
               points: list[Point], lines: list[Line]) -> str:
    width, height, left, labels, top, bottom = 900, 300, 52, 250, 14, 46  # labels: the reference labels' column
    right = width - labels  # where the plot area ends
    inner_w, inner_h = right - left, height - top - bottom
    highest = max([p.tok_s for p in points] + [line.tok_s for line in lines] + [1.0])
    step = _nice_step(highest * 1.1)
    y_max = step * math.ceil(highest * 1.1 / step)
    y = lambda value: top + inner_h * (1 - value / y_max)
    count = max(len(slots), 1)
    x = lambda slot: left + inner_w * (slot + 0.5) / count
    out = [f'<svg class="plot bench-plot" role="img" aria-labelledby="{plot_id}-title {plot_id}-desc" '
           f'viewBox="0 0 {width} {height}" preserveAspectRatio="xMidYMid meet">',
           f'<title id="{plot_id}-title">{escape(title)}</title>', f'<desc id="{plot_id}-desc">{escape(desc)}</desc>',
           f'<g class="axis y-axis" aria-hidden="true">']
    tick = 0.0
    while tick <= y_max + 1e-9:
        out.append(f'<line class="grid" x1="{left}" x2="{right}" y1="{y(tick):.1f}" y2="{y(tick):.1f}"/>'
                   f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:g}</text>')
        tick += step
    out.append(f'<text class="axis-title" x="14" y="{top + inner_h / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 14 {top + inner_h / 2:.1f})">tok/s</text></g>')
    out.append('<g class="axis x-axis" aria-hidden="true">')
    every = max(1, math.ceil(count / 8))  # at most eight labels fit the width
    for slot, label in enumerate(slots):
        if slot % every == 0:
            first, _, second = label.partition(" ")
            out.append(f'<text x="{x(slot):.1f}" y="{top + inner_h + 18}" text-anchor="middle">{escape(first)}'
                       f'<tspan x="{x(slot):.1f}" dy="13">{escape(second)}</tspan></text>')
    if not slots:
        out.append(f'<text class="empty" x="{left + inner_w / 2:.1f}" y="{top + inner_h - 12:.1f}" '
                   'text-anchor="middle">no bench figure measured yet</text>')
    out.append('</g>')
    label_at: list[float] = []  # the labels' baselines, top down: each at its line, or just below the last
    for line in sorted(lines, key=lambda item: -item.tok_s):
        colour, line_y = mode_colour(modes, line.mode), y(line.tok_s)
        label_at.append(max(line_y + 4, label_at[-1] + 14) if label_at else line_y + 4)
        out.append(
            f'<g class="reference" data-key="{_a(line.key)}" data-stack="{_a(line.stack)}" data-mode="{_a(line.mode)}" '
            f'data-tok-s="{line.tok_s:g}" data-pinned="{str(line.pinned).lower()}"><title>{escape(line.label)}</title>'
            f'<line x1="{left}" x2="{right}" y1="{line_y:.1f}" y2="{line_y:.1f}" stroke="{colour}" '
            f'class="{"pinned" if line.pinned else "unpinned"}"/>'
            f'<polyline class="leader" points="{right},{line_y:.1f} {right + 6},{label_at[-1] - 4:.1f}" '
            f'fill="none" stroke="{colour}"/>'
            f'<text x="{right + 9}" y="{label_at[-1]:.1f}" fill="{colour}">'
            f'{escape(line.key)} {escape(line.stack)} {escape(line.mode)} {line.tok_s:g}</text></g>')
    for mode in modes:
        mine = sorted((p for p in points if p.mode == mode), key=lambda p: p.slot)
        if not mine:
            continue
        colour = mode_colour(modes, mode)
        out.append(f'<g class="series" data-mode="{_a(mode)}">')
        if len(mine) > 1:
            joined = " ".join(f"{x(p.slot):.1f},{y(p.tok_s):.1f}" for p in mine)
            out.append(f'<polyline points="{joined}" fill="none" stroke="{colour}"/>')
        for p in mine:
            ring = (f'<circle class="regression-ring" cx="{x(p.slot):.1f}" cy="{y(p.tok_s):.1f}" r="9"/>'
                    if p.verdict == "regression" else "")
            out.append(f'<g class="point" data-mode="{_a(mode)}" data-tok-s="{p.tok_s:g}" '
                       f'data-verdict="{_a(p.verdict or "")}" data-slot="{p.slot}"><title>{escape(p.label)}</title>'
                       f'{ring}<circle cx="{x(p.slot):.1f}" cy="{y(p.tok_s):.1f}" r="5" fill="{colour}"/></g>')
        out.append('</g>')
    out.append('</svg>')
    return "".join(out)


@dataclass(frozen=True)
class Bar:
    label: str  # short, drawn
    step: str  # full, in the bar's title
    bytes: int


def layer_bars(plot_id: str, title: str, desc: str, bars: list[Bar]) -> str:
    row, top, label_w, value_w = 24, 6, 290, 130
    height = top * 2 + row * max(len(bars), 1)
    bar_max = WIDTH - label_w - value_w
    total = sum(b.bytes for b in bars) or 1
    largest = max([b.bytes for b in bars] + [1])
    out = [f'<svg class="plot layer-plot" role="img" aria-labelledby="{plot_id}-title {plot_id}-desc" '
           f'viewBox="0 0 {WIDTH} {height}" preserveAspectRatio="xMidYMid meet">',
           f'<title id="{plot_id}-title">{escape(title)}</title>', f'<desc id="{plot_id}-desc">{escape(desc)}</desc>']
    for number, bar in enumerate(bars):
        middle = top + row * number + row / 2
        width = max(1.0, bar_max * bar.bytes / largest)
        share = 100 * bar.bytes / total
        out.append(
            f'<g class="layer" data-index="{number}" data-bytes="{bar.bytes}">'
            f'<title>{escape(bar.step)}: {human_bytes(bar.bytes)} ({share:.1f}% of the image)</title>'
            f'<text x="{label_w - 8}" y="{middle + 4:.1f}" text-anchor="end">{escape(bar.label)}</text>'
            f'<rect x="{label_w}" y="{middle - 8:.1f}" width="{width:.1f}" height="16"/>'
            f'<text class="value" x="{label_w + width + 6:.1f}" y="{middle + 4:.1f}">'
            f'{human_bytes(bar.bytes)} · {share:.1f}%</text></g>')
    out.append('</svg>')
    return "".join(out)
