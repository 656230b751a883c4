"""Error-vs-shape plots as inline SVG (no plotting library, no network assets).

Per op: each (impl, case)'s worst err/allowed over its numeric checks against the number of
tokens T of the case (``B·L`` where a case has no ``T``), both axes log10. The dashed line is
the tolerance (err = allowed); failing cases are drawn as crosses. Shape fields come from the
case id in the row's repro line; exact checks (no ratio) are not plotted.
"""
from __future__ import annotations

import math
import re
from html import escape

import numpy as np
import pandas as pd

from reports.rows import failing

W, H, PAD_L, PAD_B, PAD_T, PAD_R = 560, 300, 56, 40, 24, 150
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
MAX_POINTS = 3000  # per plot; failing cases are always kept
_CASE = re.compile(r"'[\w]+:([^']*)'")


def tokens(repro: str) -> float:
    m = _CASE.search(repro or "")
    if not m:
        return math.nan
    fields = dict(p.split("=", 1) for p in m.group(1).split(",") if "=" in p)
    try:
        return float(fields["T"]) if "T" in fields else float(fields["B"]) * float(fields["L"])
    except (KeyError, ValueError):
        return math.nan


def points(frame: pd.DataFrame, op: str) -> pd.DataFrame:
    f = frame[(frame["op"] == op) & (frame["allowed"] > 0)]
    f = f.assign(ratio=(f["err"] / f["allowed"]).clip(lower=1e-6), fail=failing(f["status"]),
                 x=f["repro"].map({r: tokens(r) for r in f["repro"].unique()}).astype(float))  # once per (impl, case)
    f = f[np.isfinite(f["ratio"]) & np.isfinite(f["x"])]
    p = f.groupby(["impl", "case"], sort=False).agg(x=("x", "first"), ratio=("ratio", "max"), fail=("fail", "any"))
    p = p.reset_index()
    if len(p) > MAX_POINTS:
        p = pd.concat([p[p["fail"]], p[~p["fail"]].sample(MAX_POINTS, random_state=0)]).head(MAX_POINTS)
    return p


def _decades(lo: float, hi: float) -> tuple[int, int]:
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return a, max(b, a + 1)


def svg(frame: pd.DataFrame, op: str) -> str:
    p = points(frame, op)
    if p.empty:
        return ""
    x0, x1 = _decades(max(p["x"].min(), 1.0), p["x"].max())
    y0, y1 = _decades(min(p["ratio"].min(), 0.1), max(p["ratio"].max(), 2.0))
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    sx = lambda v: PAD_L + (math.log10(max(v, 1.0)) - x0) / (x1 - x0) * pw  # noqa: E731
    sy = lambda v: PAD_T + (y1 - math.log10(v)) / (y1 - y0) * ph  # noqa: E731
    out = [f'<svg class="plot" data-op="{escape(op)}" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" role="img"><title>{escape(op)}: err/allowed vs tokens</title>',
           f'<rect x="{PAD_L}" y="{PAD_T}" width="{pw}" height="{ph}" fill="#fff" stroke="#999"/>']
    for d in range(x0, x1 + 1):
        out.append(f'<line x1="{sx(10**d):.1f}" y1="{PAD_T}" x2="{sx(10**d):.1f}" y2="{PAD_T + ph}" stroke="#eee"/>'
                   f'<text x="{sx(10**d):.1f}" y="{H - PAD_B + 14}" font-size="10" text-anchor="middle">1e{d}</text>')
    for d in range(y0, y1 + 1):
        out.append(f'<line x1="{PAD_L}" y1="{sy(10**d):.1f}" x2="{PAD_L + pw}" y2="{sy(10**d):.1f}" stroke="#eee"/>'
                   f'<text x="{PAD_L - 4}" y="{sy(10**d) + 3:.1f}" font-size="10" text-anchor="end">1e{d}</text>')
    out.append(f'<line x1="{PAD_L}" y1="{sy(1):.1f}" x2="{PAD_L + pw}" y2="{sy(1):.1f}" stroke="#d62728" '
               f'stroke-dasharray="4 3"/><text x="{PAD_L + pw - 2}" y="{sy(1) - 3:.1f}" font-size="10" '
               f'text-anchor="end" fill="#d62728">allowed</text>')
    out.append(f'<text x="{PAD_L + pw / 2}" y="{H - 6}" font-size="11" text-anchor="middle">num_tokens (T)</text>'
               f'<text x="12" y="{PAD_T + ph / 2}" font-size="11" text-anchor="middle" '
               f'transform="rotate(-90 12 {PAD_T + ph / 2})">err / allowed</text>')
    for k, (impl, g) in enumerate(p.groupby("impl", sort=True)):
        c = COLORS[k % len(COLORS)]
        for case, px, ratio, fail in zip(g["case"], g["x"], g["ratio"], g["fail"]):
            x, y = sx(px), sy(ratio)
            tip = f"<title>{escape(str(impl))} {escape(str(case))}: {ratio:.3g}</title>"
            if fail:
                out.append(f'<path class="fail" d="M{x-4:.1f},{y-4:.1f}L{x+4:.1f},{y+4:.1f}M{x-4:.1f},{y+4:.1f}'
                           f'L{x+4:.1f},{y-4:.1f}" stroke="{c}" stroke-width="2">{tip}</path>')
            else:
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{c}" fill-opacity="0.6">{tip}</circle>')
        ly = PAD_T + 12 + 14 * k
        out.append(f'<circle cx="{W - PAD_R + 12}" cy="{ly - 4}" r="4" fill="{c}"/>'
                   f'<text x="{W - PAD_R + 20}" y="{ly}" font-size="10">{escape(str(impl))[:24]}</text>')
    out.append("</svg>")
    return "".join(out)
