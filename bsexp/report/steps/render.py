"""Steps to result as people read it: steps_to_result.md, steps_to_result.csv and its figures."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from bsexp.report.steps.analysis import REGION, StepsToResult


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def rows(result: StepsToResult) -> list[dict]:
    """One row per batch size: report.csv's columns."""
    out = []
    for b in result.batches:
        best, seeds, ratios = b.best, b.steps_over_seeds(), result.rule_ratios(b)
        samples = statistics.fmean(b.samples_over_seeds()) if seeds else None
        out.append(
            {
                "batch": b.batch,
                "trials": len(b.trials),
                "reached": len(b.reached),
                "best_lr": best.lr if best else None,
                "best_momentum": best.momentum if best else None,
                "best_warmup": best.warmup if best and best.warmup_shape not in (None, "none") else None,
                "lr_at_edge": b.at_edge or "",
                "best_steps": best.steps if best else None,
                "steps_mean": statistics.fmean(seeds) if seeds else None,
                "steps_std": statistics.stdev(seeds) if len(seeds) > 1 else None,
                "seeds": len(seeds),
                "runs": 1 + len(b.reruns) if best else 0,  # the best and its reruns, reached or not
                "samples_mean": samples,
                "tokens_mean": samples * result.context if samples is not None and result.context else None,
                "linear_rule_over_tuned": ratios["linear"] if ratios else None,
                "sqrt_rule_over_tuned": ratios["sqrt"] if ratios else None,
                "region": result.region(b.batch) or "",
            }
        )
    return out


def write_csv(result: StepsToResult, path: Path) -> None:
    table = rows(result)
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(table[0]) if table else ["batch"])
        writer.writeheader()
        for row in table:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})


def markdown(result: StepsToResult, estimates: list[tuple[str, str, str]]) -> str:
    """The report: the table per batch, the fit and its regions, the rules, the four estimates
    of the critical batch (`estimates`: (how, value, note))."""
    lines = [
        f"# Steps to result: {result.target_text}",
        "",
        "The learning rate tuned at each batch size (quasi-random search, Shallue et al. 2019); a trial's "
        "steps are interpolated between the evaluations around the target, which lie a few percent of the "
        "steps apart (trainer.eval_growth). Steps: the best trial and its reruns over seeds, mean ± std.",
        "",
        *(
            [f"A sample is a sequence of {result.context:,} tokens: `tokens` = samples × {result.context:,}.", ""]
            if result.context
            else []
        ),
        "| batch | trials reaching | best LR | steps (best) | steps, mean ± std (seeds) | samples | "
        + ("tokens | " if result.context else "")
        + "linear rule / tuned | sqrt rule / tuned | region |",
        "|" + " --- |" * (10 if result.context else 9),
    ]
    table = rows(result)
    lines += [_table_row(row, tokens=bool(result.context)) for row in table]
    lines.append("")
    lines += _fit_lines(result)
    lines += _cautions(result, table)
    lines += ["", "## The critical batch, four ways", "", "| estimate | B_crit | how |", "| --- | --- | --- |"]
    lines += [f"| {how} | {value} | {note} |" for how, value, note in estimates]
    lines += [
        "",
        "## Figures",
        "",
        "![steps](steps_to_result.png)",
        "![lr](tuned_lr.png)",
        "![samples](samples_steps.png)",
        "",
    ]
    return "\n".join(lines)


def _table_row(row: dict, tokens: bool = False) -> str:
    edge = f" (at the {row['lr_at_edge']} LR tried)" if row["lr_at_edge"] else ""
    if row["best_warmup"] is not None:  # searched too
        edge += f", warmup {row['best_warmup']:.2g}"
    spread = (
        f"{row['steps_mean']:,.1f} ± {row['steps_std']:,.1f} ({row['seeds']})"
        if row["steps_std"] is not None
        else _num(row["steps_mean"], ",.1f")
    )
    if row["seeds"] < row["runs"]:  # seeds that missed the target: the mean is of those that got there
        spread += f" ({row['seeds']} of {row['runs']} seeds reached)"
    return (
        f"| {row['batch']} | {row['reached']}/{row['trials']} | {_num(row['best_lr'], '.3g')}{edge} | "
        f"{_num(row['best_steps'], ',.1f')} | {spread} | {_num(row['samples_mean'], ',.0f')} | "
        + (f"{_num(row['tokens_mean'], ',.0f')} | " if tokens else "")
        + f"{_num(row['linear_rule_over_tuned'], '.2f')} | {_num(row['sqrt_rule_over_tuned'], '.2f')} | "
        f"{row['region'] or '-'} |"
    )


def _cautions(result: StepsToResult, table: list[dict]) -> list[str]:
    lines = []
    edges = [b.batch for b in result.batches if b.at_edge]
    if edges:
        lines.append(
            f"**Caution**: the best LR of batch {', '.join(map(str, edges))} is at the edge of the range "
            f"searched: the best may lie outside it (widen tune.lr_min / tune.lr_max)."
        )
    missed = [f"{r['batch']} ({r['runs'] - r['seeds']} of {r['runs']})" for r in table if r["seeds"] < r["runs"]]
    if missed:
        lines.append(
            f"**Seeds that missed the target**: batch {', '.join(missed)}: their steps are the mean of the "
            f"seeds that reached it, an optimistic reading near the budget's end (more epochs)."
        )
    if result.not_reached:
        lines.append(
            f"**Not reached**: no trial of batch {', '.join(map(str, result.not_reached))} reached the "
            f"target within its budget (more epochs, or more trials)."
        )
    return lines


def _fit_lines(result: StepsToResult) -> list[str]:
    fit = result.fit
    if fit is None or fit.refused:
        return [f"**Fit**: not fitted: {fit.refused if fit else 'no batch reached the target'}.", ""]
    regions = result.regions
    return [
        f"**Fit** S = S_min (1 + B_crit / B): S_min = {fit.s_min:,.1f} steps, B_crit = {fit.b_crit:,.0f} "
        f"(E_min = {fit.e_min:,.0f} samples), relative residual {100 * fit.rms:.1f} %.",
        f"**Regions** (of the fit): perfect scaling up to batch {regions.perfect_up_to:,.0f} (samples within "
        f"{100 * REGION:.0f} % of their least), maximal data parallelism from batch {regions.maximal_from:,.0f} "
        f"(steps within {100 * REGION:.0f} % of their least), diminishing returns between.",
        "",
    ]


def figures(result: StepsToResult, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = result.curve()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    if curve:
        batches = [b for b, _, _ in curve]
        ax.errorbar(
            batches,
            [s for _, s, _ in curve],
            yerr=[
                statistics.stdev(b.steps_over_seeds()) if len(b.steps_over_seeds()) > 1 else 0
                for b in result.batches
                if b.best is not None
            ],
            fmt="o-",
            capsize=3,
            label="best trial, mean ± std over seeds",
        )
        first_b, first_s = batches[0], curve[0][1]
        ax.plot(batches, [first_s * first_b / b for b in batches], ":", color="grey", label="perfect scaling")
        fit = result.fit
        if fit is not None and not fit.refused:
            grid = [batches[0] * (batches[-1] / batches[0]) ** (i / 100) for i in range(101)]
            ax.plot(
                grid,
                [fit.s_min * (1 + fit.b_crit / b) for b in grid],
                "--",
                color="C3",
                label=f"S_min (1 + B_crit / B), B_crit = {fit.b_crit:,.0f}",
            )
            ax.axvspan(batches[0], result.regions.perfect_up_to, color="C2", alpha=0.08)
            ax.axvspan(result.regions.maximal_from, batches[-1], color="C1", alpha=0.08)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    else:
        _nothing_reached(ax, result)
    labels = ("batch size", f"steps to {result.target_text}")
    _save(fig, ax, out / "steps_to_result.png", *labels, "Steps to result, LR tuned at each batch")
    _lr_figure(result, out)
    _samples_figure(result, out)


def _lr_figure(result: StepsToResult, out: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    best = [(b.batch, b.best.lr) for b in result.batches if b.best is not None]
    for b in result.batches:
        ax.scatter([b.batch] * len(b.trials), [t.lr for t in b.trials], s=8, color="lightgrey")
    if best:
        ax.plot([b for b, _ in best], [lr for _, lr in best], "o-", label="tuned (best trial)")
        ref = next(((b.batch, b.best.lr) for b in result.batches if b.batch == result.reference), None)
        if ref is not None:
            grid = [b for b, _ in best]
            ax.plot(grid, [ref[1] * b / ref[0] for b in grid], "--", label=f"linear rule from batch {ref[0]}")
            ax.plot(grid, [ref[1] * math.sqrt(b / ref[0]) for b in grid], ":", label=f"sqrt rule from batch {ref[0]}")
        ax.legend(fontsize=7)
    else:
        _nothing_reached(ax, result)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    title = "The tuned LR against the scaling rules (grey: every trial)"
    _save(fig, ax, out / "tuned_lr.png", "batch size", "learning rate", title)


def _samples_figure(result: StepsToResult, out: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    curve = result.curve()
    if curve:
        ax.plot([s for _, s, _ in curve], [e for _, _, e in curve], "o-")
        for b, s, e in curve:
            ax.annotate(str(b), (s, e), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xscale("log")
        ax.set_yscale("log")
    else:
        _nothing_reached(ax, result)
    title = "Samples against steps: the trade-off (batch sizes marked)"
    _save(fig, ax, out / "samples_steps.png", "steps to result", "samples to result", title)


def _save(fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    """A figure labelled, gridded and written to `path` (PNG at 120 dpi), then closed."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _nothing_reached(ax, result: StepsToResult) -> None:
    """Said on a figure with no curve to draw: no batch size reached the target."""
    ax.text(
        0.5,
        0.5,
        f"no batch size reached {result.target_text} within its budget",
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=9,
    )
