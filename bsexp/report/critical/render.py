"""The critical batch from branches as people read it: critical.md (the critical batch at each
branch point beside B_simple and B_crit, the branches' losses, and how the answer moves with ε and
the branch length), critical.csv and critical.png."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from bsexp.config.schema import LOWER_IS_BETTER
from bsexp.report.critical.analysis import EPSILONS, LENGTHS, SEEDS, Stage, mean_of


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _eps(epsilon: float | str) -> str:
    """ε as the report names it: a number, or each branch point's own from the seeds."""
    return "each point's own, from the trunk seeds' spread" if epsilon == SEEDS else f"{epsilon:g}"


def _interval(stage: Stage) -> str:
    low, high = stage.interval
    return "-" if low is None else f"[{low:,}, {high:,}]"


def markdown(
    found: Sequence[Stage],
    epsilon: float | str,
    seeds: int,
    swept: bool,
    context: int | None = None,
    window: float = 0.0,
    chosen: dict[tuple[int, int], float | None] | None = None,
) -> str:
    """`context`: a language model's tokens per sequence, which its samples and batches count.
    `window`: each branch's loss was the median over that last fraction of it (0: at its end).
    `chosen`: the LR each (branch point, batch) took, the best of those branched
    (bsexp.report.critical.analysis.best_lrs)."""
    length = found[0].length if found else 0
    lines = [*_estimates(found, epsilon, seeds, swept, length), *_losses(found), *_sensitivity(found, epsilon, length)]
    if chosen:
        lines += _chosen_lrs(found, chosen)
    if window:
        lines[1:1] = [
            "",
            f"A branch's loss: the median of its validation losses over its last {window:g} of its length "
            f"({int(window * length):,} samples), not the one evaluation at its end.",
        ]
    if context:
        lines[1:1] = [
            "",
            f"A language model's: samples and batches count sequences of {context} tokens (a branch of "
            f"{length:,} sequences trains {length * context:,} tokens); the loss is in nats per token.",
        ]
    notes = [f"- {s.at:,}: B_simple: {s.b_simple_note}" for s in found if s.b_simple_note]
    notes += [f"- {s.at:,}: B_crit {s.b_crit_note}" for s in found if s.b_crit is None and s.b_crit_note]
    if notes:
        lines += ["", "Where an estimate is missing or partial:", *notes]
    return "\n".join(lines) + "\n"


def _estimates(found: Sequence[Stage], epsilon: float | str, seeds: int, swept: bool, length: int) -> list[str]:
    """What the critical batch is, and its table beside B_simple and B_crit at each branch point."""
    metric = found[0].target_metric if found else "val_acc"
    lines = [
        "# The critical batch, measured by branches",
        "",
        f"Branches of {length:,} samples from trunk checkpoints, {seeds} seed(s); the critical batch is the largest "
        f"batch whose branch's mean validation loss over the seeds ends within ε = {_eps(epsilon)} (relative) of the "
        f"smallest batch's"
        + (
            " (ε: the relative standard deviation over the seeds of the smallest batch's branch loss)"
            if epsilon == SEEDS
            else ""
        )
        + ". 95 % interval: of the critical batch over the trunk seeds drawn with replacement (a draw "
        "without an answer counts as the smallest batch). ≥: every batch branched stayed within ε; ≤: the next "
        "batch up already fell out; "
        "no progress: the smallest batch's branch ended less than ε below its starting loss (too short to tell). "
        "A diverged branch is out of any ε. "
        "B_simple: the trunks' mean over the branch's window. "
        + (
            f"B_crit: E_min / S_min from the fixed-batch sweep, to the {metric} the trunk had at the "
            "branch's end" + (" (reached at or below it)." if metric in LOWER_IS_BETTER else ".")
            if swept
            else "B_crit: no fixed-batch sweep given (--sweep)."
        ),
        "",
        f"| samples seen | critical batch | 95 % interval | ε | per seed | B_simple | B_simple / critical | "
        f"target {metric} | B_crit | B_crit / critical |",
        "| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in found:
        b_simple = _num(s.b_simple) if s.b_simple is not None or not s.b_simple_note else "unresolved"
        lines.append(
            f"| {s.at:,} | {s.critical} | {_interval(s)} | {s.epsilon:.3g} | {', '.join(str(c) for c in s.per_seed)} | "
            f"{b_simple} | "
            f"{s.shown_ratio(s.b_simple)} | {_target(s)} | {_num(s.b_crit)} | "
            f"{s.shown_ratio(s.b_crit)} |"
        )
    return lines


def _stage_table(
    found: Sequence[Stage], caption: str, columns: Sequence[str], cells: Sequence[Callable[[Stage], str]]
) -> list[str]:
    """A table of the branch points (rows) against `columns`, each cell `cells[i](stage)`."""
    lines = ["", caption, "", "| samples seen | " + " | ".join(columns) + " |", "| ---: |" + " ---: |" * len(columns)]
    for s in found:
        lines.append(f"| {s.at:,} | " + " | ".join(cell(s) for cell in cells) + " |")
    return lines


def _mean_loss(values: Sequence[float] | None) -> str:
    mean = mean_of(values) if values else None
    if mean is None:
        return "-"
    return "diverged" if not math.isfinite(mean) else (f"{mean:.4f}" if mean < 1e4 else f"{mean:.3g}")


def _losses(found: Sequence[Stage]) -> list[str]:
    """The seeds' mean validation loss at each branch's end, by branch point and batch."""
    batches = sorted({b for s in found for b in s.losses})
    return _stage_table(
        found,
        "Mean validation loss at the branch's end, by batch (diverged: a seed's branch diverged; "
        "- : not run or failed):",
        [f"B={b:,}" for b in batches],
        [lambda s, b=b: _mean_loss(s.losses.get(b)) for b in batches],
    )


def _chosen_lrs(found: Sequence[Stage], chosen: dict[tuple[int, int], float | None]) -> list[str]:
    """The LR each batch's branches took at each branch point: the best of those it was branched at."""
    batches = sorted({batch for _, batch in chosen})

    def lr(stage: Stage, batch: int) -> str:
        value = chosen.get((stage.at, batch))
        return "-" if value is None else f"{value:.4g}"

    return _stage_table(
        found,
        "The LR each batch's branches took (the one, of those branched, whose branches ended lowest on the seeds' "
        "mean):",
        [f"B={b:,}" for b in batches],
        [lambda s, b=b: lr(s, b) for b in batches],
    )


def _sensitivity(found: Sequence[Stage], epsilon: float | str, length: int) -> list[str]:
    """The critical batch at each ε, and at each branch length."""
    return [
        *_stage_table(
            found,
            "Sensitivity to ε (relative tolerance), full branch length:",
            [f"ε = {e:g}" for e in EPSILONS],
            [lambda s, e=e: str(s.by_epsilon[e]) for e in EPSILONS],
        ),
        *_stage_table(
            found,
            f"Sensitivity to the branch length (ε = {_eps(epsilon)}; the loss at that point of the same branches):",
            [f"Δ = {int(f * length):,}" for f in LENGTHS],
            [lambda s, f=f: str(s.by_length[f]) for f in LENGTHS],
        ),
    ]


def _target(stage: Stage) -> str:
    """B_crit's target as read: an accuracy in %, a loss as measured."""
    if stage.target_metric in LOWER_IS_BETTER:
        return _num(stage.target, 4)
    return _num(stage.target and 100 * stage.target, 2)


def write_csv(found: Sequence[Stage], path: Path) -> None:
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(
            [
                "samples_seen",
                "critical_batch",
                "bound",
                "critical_low",
                "critical_high",
                "epsilon",
                "b_simple",
                "b_simple_ratio",
                f"target_{found[0].target_metric if found else 'val_acc'}",
                "b_crit",
                "b_crit_ratio",
                *(f"critical_eps_{e:g}" for e in EPSILONS),
                *(f"critical_length_{f:g}" for f in LENGTHS),
            ]
        )
        for s in found:
            writer.writerow(
                [
                    s.at,
                    s.critical.batch,
                    s.critical.bound,
                    *s.interval,
                    s.epsilon,
                    s.b_simple,
                    s.ratio(s.b_simple),
                    s.target,
                    s.b_crit,
                    s.ratio(s.b_crit),
                    *(s.by_epsilon[e].batch for e in EPSILONS),
                    *(s.by_length[f].batch for f in LENGTHS),
                ]
            )


def figure(found: Sequence[Stage], epsilon: float | str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    x = [s.at for s in found]
    ax.plot(
        x,
        [s.critical.batch for s in found],
        "o-",
        color="black",
        label=f"critical batch, branches (ε {'from the seeds' if epsilon == SEEDS else f'= {epsilon:g}'}; "
        "bars: 95 % over the seeds)",
    )
    for s in found:
        if s.interval[0] is not None:
            ax.vlines(s.at, *s.interval, color="black", alpha=0.3, linewidth=4)
        if s.critical.bound != "=" and s.critical.batch:
            ax.annotate(
                "≥" if s.critical.bound == ">=" else "≤",
                (s.at, s.critical.batch),
                textcoords="offset points",
                xytext=(4, 4),
            )
    ax.plot(x, [s.b_simple for s in found], "s--", color="tab:blue", label="B_simple (trunk, over the window)")
    if any(s.b_crit for s in found):
        ax.plot(x, [s.b_crit for s in found], "^:", color="tab:red", label="B_crit (steps-to-target fit)")
    ax.set_xscale("symlog", linthresh=max(1, min((v for v in x if v > 0), default=1)))
    ax.set_yscale("log", base=2)
    ax.set_xlabel("samples seen by the trunk at the branch point")
    ax.set_ylabel("batch size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
