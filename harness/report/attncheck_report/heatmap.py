"""Per op family heatmaps: which two axes to plot, which to split into panels, what each cell shows.

Axis choice (plan_heatmap) is standard library only; drawing (render_heatmap) needs numpy and
matplotlib. A cell is the worst error/budget ratio of the cases that share its axis values (the
other axes are folded in); failing cells are hatched and marked with a cross so they read without
colour.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass, field
from typing import Optional

# Per family: candidate axis names for rows, columns and panels, best first. Names vary between
# op slices, so several spellings are tried; where none is present the generic rule takes over.
FAMILY_AXES = (
    # rope first: indexer_qk_rope is a RoPE op.
    (r"rope", ["style", "rope_style"], ["contract", "path", "inplace", "in_place"],
     ["view", "dtype", "positions"]),
    (r"^(mla_decode|sparse_mla)", ["heads", "num_heads", "nhead"],
     ["block_size", "kernel_block_size", "page_size"], ["qlen", "q_len", "dtype", "kv_dtype"]),
    # The indexer's cache layout follows from the block size (1: NORMAL, 16k: SHUFFLE); panels per
    # fp8 format. Rows: a layout axis where an op has one, else the generic rule.
    (r"^indexer", ["layout", "cache_layout"], ["block_size", "page_size"],
     ["fp8", "fp8_format", "format"]),
    (r"^decode_attention", ["lk_lv", "head_dims", "dims"], ["page_size", "block_size"],
     ["kv_dtype", "dtype", "q_dtype"]),
    # kv: the cache dtype (fp8 formats dequantize); strides: contiguous / hybrid / padded.
    (r"^kv_gather", ["layout", "cache_layout"], ["kv", "dtype", "kv_dtype", "cache_dtype"],
     ["strides", "dtype", "fp8_format"]),
)
# Axes computed from two others when an op spells them separately.
DERIVED_AXES = {"lk_lv": ("lk", "lv")}
# Never plotted unless nothing else varies.
LOW_PRIORITY_AXES = ("seed",)
MAX_PANEL_VALUES = 8

# Cell states, worst first. Letters make each state readable without colour.
STATES = ("fail", "known_bug", "unexpected_pass", "passed", "refused", "skipped")
STATE_MARK = {"fail": "✗", "known_bug": "K", "unexpected_pass": "!", "refused": "R",
              "skipped": "–", "passed": ""}
# The state of a case that is not failing (failing is the record's word, not the verdict's).
# unsupported reads like skipped: the kernel declined, nothing was compared.
VERDICT_STATE = {"known_bug": "known_bug", "unexpected_pass": "unexpected_pass",
                 "passed": "passed", "refused_as_expected": "refused", "unsupported": "skipped",
                 "skipped": "skipped"}

RATIO_MIN, RATIO_MAX = 1e-3, 1e3  # colour scale, log, centred on 1 (the budget)


def case_state(case) -> str:
    if case.failing:
        return "fail"
    # A verdict without a state of its own (failed or error that attncheck does not mark
    # failing) claims nothing: shown as not checked.
    return VERDICT_STATE.get(case.verdict, "skipped")


def axis_value(case, axis: str):
    if axis in case.params:
        return case.params[axis]
    if axis in DERIVED_AXES:
        a, b = DERIVED_AXES[axis]
        return f"{case.params.get(a)}/{case.params.get(b)}"
    return None


def value_label(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def sorted_values(values) -> list:
    def key(v):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return (0, float(v), "")
        text = value_label(v)
        parts = re.split(r"(\d+)", text)  # natural order: lk 64/64 before 576/512
        return (1, 0.0, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts))

    unique = []
    for v in values:
        if v not in unique:
            unique.append(v)
    return sorted(unique, key=key)


@dataclass
class HeatmapPlan:
    op: str
    rows: str
    cols: Optional[str]
    panels: Optional[str]
    arches: list
    folded: list = field(default_factory=list)  # axes folded into cells (worst over them)
    generic: list = field(default_factory=list)  # axes chosen by the generic rule


def available_axes(cases) -> dict:
    """{axis: distinct values} over the cases, derived axes included."""
    axes = {}
    for c in cases:
        for k, v in c.params.items():
            axes.setdefault(k, [])
            if v not in axes[k]:
                axes[k].append(v)
    for name, (a, b) in DERIVED_AXES.items():
        if name not in axes and a in axes and b in axes:
            axes[name] = sorted_values(axis_value(c, name) for c in cases)
    return axes


def _generic_order(axes: dict, used: set) -> list:
    names = [a for a in axes if a not in used]
    return sorted(names, key=lambda a: (a in LOW_PRIORITY_AXES, -len(axes[a]), list(axes).index(a)))


def _pick(candidates, axes: dict, used: set, need_variety: bool) -> Optional[str]:
    present = [a for a in candidates if a in axes and a not in used]
    for a in present:
        if len(axes[a]) > 1:
            return a
    if present and not need_variety:
        return present[0]
    return None


def plan_heatmap(op: str, cases) -> HeatmapPlan:
    axes = available_axes(cases)
    arches = sorted({c.arch for c in cases})
    family = next((f for f in FAMILY_AXES if re.search(f[0], op)), None)
    used: set = set()
    generic: list = []
    rows = cols = panels = None
    if family:
        rows = _pick(family[1], axes, used, need_variety=False)
        used |= {rows} if rows else set()
        cols = _pick(family[2], axes, used, need_variety=False)
        used |= {cols} if cols else set()
        panels = _pick(family[3], axes, used, need_variety=True)
        used |= {panels} if panels else set()
    # Generic rule (and filling gaps): the axes with the most distinct values.
    def take_generic() -> Optional[str]:
        order = _generic_order(axes, used)
        varied = [a for a in order if len(axes[a]) > 1]
        choice = (varied or order or [None])[0]
        if choice:
            used.add(choice)
            generic.append(choice)
        return choice

    if rows is None:
        rows = take_generic()
    if cols is None:
        cols = take_generic()
    if rows is None:  # an op without axes: one cell
        rows = "op"
    if panels and len(axes.get(panels, [])) > MAX_PANEL_VALUES:
        panels = None
    shown = {rows, cols, panels} - {None}
    # The parts of a derived axis are shown through it.
    for name, parts in DERIVED_AXES.items():
        if name in shown:
            shown |= set(parts)
    folded = [a for a in axes if a not in shown and len(axes[a]) > 1]
    return HeatmapPlan(op, rows, cols, panels, arches, folded, generic)


@dataclass
class Cell:
    cases: list = field(default_factory=list)

    @property
    def ratio(self) -> Optional[float]:
        ratios = [c.ratio for c in self.cases if c.ratio is not None]
        return max(ratios) if ratios else None

    @property
    def state(self) -> str:
        states = {case_state(c) for c in self.cases}
        return next(s for s in STATES if s in states)


def grid(plan: HeatmapPlan, cases):
    """[(arch, panel value, row values, col values, {(row, col): Cell})] in display order.
    Every panel has the same rows and columns (the op's values), so panels line up by eye; a
    combination a panel lacks stays blank."""

    def val(c, axis):
        return "" if axis in (None, "op") else axis_value(c, axis)

    panel_values = sorted_values(val(c, plan.panels) for c in cases) if plan.panels else [""]
    rows = sorted_values(val(c, plan.rows) for c in cases)
    cols = sorted_values(val(c, plan.cols) for c in cases) if plan.cols else [""]
    out = []
    for arch in plan.arches:
        for pv in panel_values:
            sel = [c for c in cases
                   if c.arch == arch and (not plan.panels or val(c, plan.panels) == pv)]
            if not sel:
                continue
            cells = {}
            for c in sel:
                cells.setdefault((val(c, plan.rows), val(c, plan.cols) if plan.cols else ""),
                                 Cell()).cases.append(c)
            out.append((arch, pv, rows, cols, cells))
    return out


def ratio_label(r: Optional[float]) -> str:
    if r is None:
        return ""
    if math.isinf(r):
        return "∞"
    if r == 0:
        return "0"
    if r >= 100:
        return f"{r:.0f}"
    if r >= 0.001:
        return f"{r:.2g}"
    return f"{r:.0e}".replace("e-0", "e-")


CHAR_IN = 0.07  # width of one 8 pt tick-label character, inches (DejaVu Sans)


def render_heatmap(plan: HeatmapPlan, cases) -> bytes:
    """PNG bytes of the op's panels, one shared log colour scale.

    Laid out by hand in inches (cells of fixed size, margins from the label lengths): matplotlib's
    constrained layout gives the same picture at several times the cost.
    """
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle
    import matplotlib

    panels = grid(plan, cases)
    ncols = min(len(panels), 4 if not plan.panels else max(1, min(4, len({p[1] for p in panels}))))
    nrows = math.ceil(len(panels) / ncols)
    max_r = max(len(p[2]) for p in panels)
    max_c = max(len(p[3]) for p in panels)
    col_labels = [value_label(v) for p in panels for v in p[3]]
    row_labels = [value_label(v) for p in panels for v in p[2]]
    rotate = max(len(t) for t in col_labels) > 5
    # Cells shrink when a family has many columns, so the figure stays within a screen's width;
    # below half an inch the ratios no longer fit and only the marks are written.
    cell_w = max(0.3, min(0.62, 15.0 / (ncols * max_c)))
    cell_h = 0.42 if cell_w >= 0.5 else 0.3
    plot_w, plot_h = max(1.3, cell_w * max_c), max(0.6, cell_h * max_r)
    left = 0.45 + CHAR_IN * max(len(t) for t in row_labels)
    bottom = 0.45 + (0.7 * CHAR_IN * max(len(t) for t in col_labels) if rotate else 0.2)
    top, gap, bar_area = 0.35, 0.25, 1.25
    panel_w, panel_h = left + plot_w + gap, top + plot_h + bottom
    fig_w = ncols * panel_w + bar_area
    fig_h = max(nrows * panel_h, 2.4)
    fig = Figure(figsize=(fig_w, fig_h))
    FigureCanvasAgg(fig)

    cmap = matplotlib.colormaps["RdBu_r"].copy()
    cmap.set_bad("white")  # a combination the tier does not have: blank
    norm = LogNorm(vmin=RATIO_MIN, vmax=RATIO_MAX)
    small = max_r * max_c > 160 or cell_w < 0.5
    for k, (arch, pv, rows, cols, cells) in enumerate(panels):
        r_k, c_k = divmod(k, ncols)
        x0 = c_k * panel_w + left
        y0 = fig_h - (r_k * panel_h + top + plot_h)
        w, h = plot_w * len(cols) / max_c, plot_h * len(rows) / max_r
        ax = fig.add_axes((x0 / fig_w, (y0 + plot_h - h) / fig_h, max(w, 0.4) / fig_w, h / fig_h))
        data = np.full((len(rows), len(cols)), np.nan)
        for (rv, cv), cell in cells.items():
            if cell.ratio is not None:
                data[rows.index(rv), cols.index(cv)] = min(max(cell.ratio, RATIO_MIN), RATIO_MAX)
        ax.imshow(np.ma.masked_invalid(data), cmap=cmap, norm=norm, aspect="auto",
                  interpolation="nearest")
        ax.vlines(np.arange(0.5, len(cols) - 1), -0.5, len(rows) - 0.5, colors="white", lw=1.5)
        ax.hlines(np.arange(0.5, len(rows) - 1), -0.5, len(cols) - 0.5, colors="white", lw=1.5)
        for (rv, cv), cell in cells.items():
            i, j = rows.index(rv), cols.index(cv)
            state, ratio = cell.state, cell.ratio
            dark = False
            if ratio is not None:
                rgba = cmap(norm(min(max(ratio, RATIO_MIN), RATIO_MAX)))
                dark = (0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2]) < 0.5
            else:  # cases without an error metric (refused, skipped, crashed): grey
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="#dcdcdc",
                                       edgecolor="none"))
            if state == "fail":  # hatch in a colour that stands out from the cell's
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="////",
                                       edgecolor="white" if dark else "black", linewidth=0))
                ax.add_patch(Rectangle((j - 0.48, i - 0.48), 0.96, 0.96, fill=False,
                                       edgecolor="black", linewidth=1.5))
            text = STATE_MARK[state]
            if not small and ratio is not None:
                text = (text + " " if text else "") + ratio_label(ratio)
            if not text:
                continue
            boxed = state == "fail"
            ax.text(j, i, text, ha="center", va="center", fontsize=7 if small else 8,
                    color="white" if dark and not boxed else "black",
                    fontweight="bold" if boxed else "normal",
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="black", lw=0.6)
                    if boxed else None)
        ax.set_xticks(range(len(cols)))
        ax.set_xticklabels([value_label(v) for v in cols], fontsize=8, rotation=45 if rotate else 0,
                           ha="right" if rotate else "center", rotation_mode="anchor")
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([value_label(v) for v in rows], fontsize=8)
        ax.tick_params(length=2, pad=2)
        ax.set_xlabel(plan.cols or "", fontsize=8, labelpad=2)
        ax.set_ylabel(plan.rows if plan.rows != "op" else "", fontsize=8, labelpad=2)
        title = arch if len(plan.arches) > 1 or not plan.panels else ""
        if plan.panels:
            title = (title + " · " if title else "") + f"{plan.panels}={value_label(pv)}"
        ax.set_title(title or arch, fontsize=9, pad=4)

    bar_h = min(3.2, fig_h - 0.6)
    cax = fig.add_axes(((fig_w - bar_area + 0.15) / fig_w, (fig_h - bar_h) / 2 / fig_h,
                        0.15 / fig_w, bar_h / fig_h))
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=cax)
    bar.set_label("worst error / budget (log)", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    bar.ax.axhline(1.0, color="black", linewidth=1.5)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    return buf.getvalue()
