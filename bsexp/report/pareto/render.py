"""Arms against tuned fixed batches as people read them: pareto.md (the arms' table, each verdict
against the baseline, the schedule bound), pareto.csv (the table) and pareto.png (steps to the
target against final accuracy)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from bsexp.report.pareto.analysis import GOAL_STEPS, RESAMPLES


def _fmt(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def markdown(result: dict[str, Any], dirs: list[Path]) -> str:
    lines = [*_table(result, dirs), *_verdicts(result), *_bounds(result)]
    return "\n".join(lines) + "\n"


def _table(result: dict[str, Any], dirs: list[Path]) -> list[str]:
    """The target, and each arm's final accuracy and steps, samples and seconds to it."""
    lines = [
        f"# Arms against tuned fixed batches ({', '.join(str(d) for d in dirs)})",
        "",
        f"Target: the best tuned fixed batch ({result['best']}: {100 * result['best_mean']:.2f} % ± "
        f"{100 * result['best_std']:.2f} % final validation accuracy, std over seeds) less one std = "
        f"**{100 * result['target']:.2f} %**. Steps, samples and training seconds to the target: the first "
        f"evaluation at or above it, mean over the seeds that reach it.",
        "",
        "| arm | LR | final val acc % | steps to target | samples to target | seconds to target | reached |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['arm']} | {_fmt(r['lr'], 'g')} | {_fmt(r['final_val_acc'] and 100 * r['final_val_acc'], '.2f')}"
            f" ± {100 * r['std']:.2f} | {_fmt(r['to_target_steps'], '.0f')} | "
            f"{_fmt(r['to_target_samples'], ',.0f')} | {_fmt(r['to_target_seconds'], '.1f')} | {r['reached']} |"
        )
    return lines


def _verdicts(result: dict[str, Any]) -> list[str]:
    """The baseline, and each other arm's verdict against it with how far it moves with the seeds."""
    fastest = result["fastest"]
    lines = [
        "",
        f"Fewest steps among the fixed batches that reach the target on every seed: "
        f"{fastest['arm'] if fastest else 'none does'}"
        + (
            f" ({fastest['to_target_steps']:.0f} steps, {fastest['to_target_samples']:,.0f} samples)."
            if fastest
            else "."
        ),
        "",
    ]
    for arm, steps, samples, met, spread in result["verdicts"]:
        if steps is None:
            lines.append(f"- {arm}: did not reach the target.")
            continue
        lines.append(
            f"- {arm}: {steps:.2f} x its steps, {samples:.2f} x its samples -> goal (<= {GOAL_STEPS:g} x "
            f"steps, <= 1 x samples, final accuracy in the band) {'met' if met else 'not met'}."
        )
        lines.append(
            f"  - with the seeds drawn again ({RESAMPLES:,} draws with replacement, the arm's and the "
            f"baseline's; central 90 %): {spread['steps'][0]:.2f}-{spread['steps'][1]:.2f} x the steps, "
            f"{spread['samples'][0]:.2f}-{spread['samples'][1]:.2f} x the samples; steps and samples within "
            f"the goal's in {100 * spread['efficient']:.0f} % of the draws, the whole goal in "
            f"{100 * spread['held']:.0f} %."
        )
    return lines


def _bounds(result: dict[str, Any]) -> list[str]:
    """What any batch schedule could gain, per rung spacing (nothing where no fit held)."""
    if not result["bounds"]:
        return []
    lines = [
        "",
        (
            "What any batch schedule could gain at the baseline's samples, by McCandlish et al.'s model "
            "fitted to the fixed batches that reach the target on every seed, at targets up to this one "
            "(`bsexp.report.analysis.schedule_bound`): the fewest steps a schedule needs against a fixed "
            "batch's, both in the model. r: the best schedule's steps above S_min over a fixed batch's; a "
            "batch that follows c x B_noise has r = 1. An estimate, not a bound: coarse rungs overstate r, "
            "fine ones take in the fits' noise."
        ),
        "",
        "| rungs every (accuracy) | S_min | E_min | r | fixed batch (model) | best schedule | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for spacing, (found, fixed, best) in result["bounds"].items():
        lines.append(
            f"| {100 * spacing:g} % | {found.s_min:.0f} | {found.e_min:,.0f} | {found.ratio:.2f} | "
            f"{fixed:.0f} | {best:.0f} | {best / fixed:.2f} x |"
        )
    return lines


def write_csv(result: dict[str, Any], path: Path) -> None:
    """The arms' table, one row per arm, in the analysis's own units (accuracies as fractions)."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(result["rows"][0]))
        writer.writeheader()
        writer.writerows(result["rows"])


def figure(result: dict[str, Any], out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for r in result["rows"]:
        if r["to_target_steps"] is None or r["final_val_acc"] is None:
            continue
        fixed = r["arm"].startswith("fixed")
        ax.errorbar(
            r["to_target_steps"],
            100 * r["final_val_acc"],
            yerr=100 * r["std"],
            fmt="o" if fixed else "s",
            color="grey" if fixed else None,
            capsize=3,
        )
        ax.annotate(
            r["arm"].replace("fixed ", ""),
            (r["to_target_steps"], 100 * r["final_val_acc"]),
            fontsize=7,
            xytext=(4, 3),
            textcoords="offset points",
        )
    ax.axhline(100 * result["target"], ls=":", color="k", lw=1, label=f"target {100 * result['target']:.2f} %")
    ax.set_xscale("log")
    ax.set_xlabel("optimizer steps to the target (mean over seeds)")
    ax.set_ylabel("final validation accuracy (%), ± std")
    ax.set_title("steps to the target against final accuracy (grey: tuned fixed batches)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "pareto.png", dpi=110)
    plt.close(fig)
    return "pareto.png"


def _only(seeds: tuple[int, int]) -> str:
    """Where no batch of the tuning reached its target on every seed: how many the reference did."""
    reached, run = seeds
    return "" if reached == run else f"; it reached the target on {reached} of {run} seeds, as no batch did on all"


def _passed_over(batches: list[tuple[int, int, int]]) -> list[str]:
    if not batches:
        return []
    which = ", ".join(f"{batch} ({reached} of {seeds} seeds)" for batch, reached, seeds in batches)
    return ["", f"Faster on average but passed over, their best reaching the target on some seeds only: {which}."]


def tuned_section(baseline, tune_dir: Path) -> list[str]:
    """Each arm against the tuned curve's fastest batch (bsexp.report.pareto.tuned), for pareto.md."""
    head = ["", f"## Against the tuned curve ({tune_dir})", ""]
    if baseline is None:
        return [*head, "No batch size of the tuning reached its target: nothing to hold the arms against."]
    s = baseline.steps
    lines = [
        *head,
        f"The fixed batch whose LR, tuned for it (`python -m bsexp.tune`), reaches {baseline.target_text} "
        f"in the fewest steps: batch {baseline.batch} at LR {baseline.lr:.4g}, "
        f"**{s.mean:.0f} ± {s.half:.0f} steps** (95 % interval over {s.n} seeds{_only(baseline.seeds)}). "
        f"Each arm's steps to the same "
        f"target, interpolated between its evaluations, with its seeds' 95 % interval:",
        "",
        "| arm | steps to the tuning's target | x the tuned batch's | reached | verdict |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in baseline.rows:
        steps = "-" if r.steps is None else f"{r.steps.mean:.0f} ± {r.steps.half:.0f}"
        lines.append(f"| {r.arm} | {steps} | {_fmt(r.ratio, '.2f')} | {r.reached}/{r.seeds} | {r.verdict} |")
    return [*lines, *_passed_over(baseline.passed_over)]
