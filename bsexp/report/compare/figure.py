"""compare_frontier.png: at each rung, the tuned fixed batches' steps against their samples on the
held-out seeds (log-log), the fitted frontier (S/S_min - 1)(E/E_min - 1) = 1 through them, and
every other arm placed on it: below and left of the curve is better than any fixed batch."""

from __future__ import annotations

import math
from pathlib import Path

from bsexp.report.compare.analysis import Comparison, Frontier
from bsexp.report.compare.render import rung_text
from bsexp.report.render.axes import save_figure

MARKERS = "sD^v<>ph*X"


def figure(result: Comparison, out_dir: Path, name: str = "compare_frontier.png") -> str | None:
    """One panel a rung; None where no rung has a point to draw."""
    if not any(f.points for f in result.frontiers):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    count = len(result.frontiers)
    cols = min(count, 3)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 4.0 * rows), squeeze=False)
    for ax, found in zip(axes.flat, result.frontiers):
        _panel(ax, result, found)
    for ax in list(axes.flat)[count:]:
        ax.set_visible(False)
    seeds = result.plan.held_out_seeds
    fig.suptitle(
        f"{result.plan.name}: steps against samples to each rung, mean over the held-out seeds "
        f"({len(seeds)}); grey: the tuned fixed batches and their fitted frontier",
        fontsize=9,
    )
    return save_figure(fig, out_dir, name)


def _log_axes(ax) -> None:
    """Log axes over at least a factor 4 each way, labelled 200, 500, 1,000 (not 2 x 10^2)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis, limits, setter in ((ax.xaxis, ax.get_xlim(), ax.set_xlim), (ax.yaxis, ax.get_ylim(), ax.set_ylim)):
        low, high = max(limits[0], 1e-9), max(limits[1], 1e-9)
        middle, span = math.sqrt(low * high), max(high / low, 4.0)
        setter(middle / math.sqrt(span) / 1.2, middle * math.sqrt(span) * 1.2)
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(NullFormatter())


def _panel(ax, result: Comparison, found: Frontier) -> None:
    plan = result.plan
    if found.points:
        xs, ys = [p[3] for p in found.points], [p[2] for p in found.points]
        ax.plot(xs, ys, "o-", color="0.55", ms=4, lw=1, label="fixed batches (tuned)")
        for _, batch, steps, samples, _ in found.points:
            ax.annotate(
                str(batch), (samples, steps), fontsize=6, color="0.4", xytext=(3, 3), textcoords="offset pixels"
            )
    fit = found.fit
    if fit is not None and not fit.refused:
        low = fit.e_min * 1.02
        high = max([p[3] for p in found.points] + [low * 10])
        grid = [low * (high / low) ** (i / 100) for i in range(101)]
        ax.plot(grid, [fit.s_min * e / (e - fit.e_min) for e in grid], "--", color="0.3", lw=1, label="fit S(E)")
    others, missing = [a for a in plan.arms if a not in plan.baselines], []
    for i, arm in enumerate(others):
        row = next((v for v in result.versus if v.arm == arm and v.rung == found.rung), None)
        if row is None or row.steps is None:
            missing.append(arm)
            continue
        ax.plot([row.samples], [row.steps], MARKERS[i % len(MARKERS)], ms=7, label=f"{arm} ({row.reached} seeds)")
    if missing:
        ax.text(0.02, 0.02, f"not reached: {', '.join(missing)}", transform=ax.transAxes, fontsize=6, color="0.3")
    _log_axes(ax)
    ax.set_xlabel("samples to the rung")
    ax.set_ylabel("steps to the rung")
    ax.set_title(rung_text(plan, found.rung), fontsize=9)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=6)
