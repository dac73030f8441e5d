"""The critical batch measured directly by branches (Merrill et al. 2025), held against the
gradient noise scale B_simple and the steps-to-target B_crit (McCandlish et al. 2018).

    python -m bsexp.report.critical BRANCH_SWEEP [MORE ...] [--sweep FIXED_SWEEP] [--epsilon 0.05] [--out DIR]

BRANCH_SWEEP holds branches (`branch.trunk=...`, see bsexp.branch): for each trunk checkpoint
(samples seen S), seed and batch B, a branch trained Δ = `branch.samples` samples. The rule:
the critical batch at S is the largest B such that every branch batch up to it ends with a
validation loss at most (1 + ε) times the smallest batch's (the trunk's own, its continuation);
on the seeds' mean loss. A critical batch at the largest batch branched is a lower bound ("≥"),
and where no larger batch stays within ε, the smallest batch is an upper bound ("≤").

Beside it, over the same trunk: B_simple over [S, S + Δ] (`window_b_simple`; the trunks run with
trainer.noise_scale=always), averaged over the seeds; and, with --sweep, B_crit =
E_min / S_min fitted to the optimizer steps each fixed batch needed to reach the validation
accuracy the trunk had at S + Δ (for each batch its best LR: the fewest steps over the LRs swept).

Writes critical.md, critical.csv and critical.png into --out (default: BRANCH_SWEEP): the
critical batch over training with B_simple and B_crit, their ratios, and how the answer moves
with ε and with the branch length (the branches' evaluations at Δ/4, Δ/2, Δ).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bsexp.metrics import read_jsonl

EPSILON = 0.05  # relative: within 5 % of the small-batch branch's loss
EPSILONS = (0.01, 0.02, 0.05, 0.1)  # the sensitivity table's
METRIC = "val_loss"


# ----------------------------------------------------------------------------- the rule (pure)


@dataclass(frozen=True)
class Critical:
    """The critical batch from branch losses, and whether it is a bound: `=` (a larger batch
    branched fell out of ε), `>=` (every batch branched stayed within ε), `<=` (the next batch up
    already fell out); `none` where the smallest batch's branch itself did not get ε below the
    loss it started from (too short a branch to tell the batches apart)."""

    batch: int | None
    bound: str = "="

    def __str__(self) -> str:
        if self.bound == "none":
            return "no progress"
        if self.batch is None:
            return "-"
        return f"{'' if self.bound == '=' else ('≥ ' if self.bound == '>=' else '≤ ')}{self.batch:,}"


def critical_batch(
    losses: Mapping[int, float | None], epsilon: float = EPSILON, start: float | None = None
) -> Critical:
    """The largest batch B such that every batch from the smallest up to B has a loss at most
    (1 + epsilon) x the smallest batch's (Merrill et al. 2025's rule, with a relative tolerance).
    A diverged branch has loss inf (out of any tolerance); a batch with no result (None: failed or
    not run) ends the search there, so the answer is a lower bound.
    `start`: the loss at the branch point; if the smallest batch did not get below (1 - epsilon)
    x it, the branches are too short to say anything (Critical(None, "none"))."""
    batches = sorted(losses)
    known = lambda b: losses[b] is not None and not math.isnan(losses[b])  # noqa: E731
    if not batches or not known(batches[0]) or not math.isfinite(losses[batches[0]]):
        return Critical(None)  # no reference: the smallest batch's branch did not finish
    if start is not None and losses[batches[0]] > start * (1 - epsilon):
        return Critical(None, "none")
    limit = losses[batches[0]] * (1 + epsilon)
    found = batches[0]
    for batch in batches[1:]:
        if not known(batch):  # not run or failed: at least what was reached so far
            return Critical(found, ">=")
        if losses[batch] > limit:
            return Critical(found, "<=" if found == batches[0] else "=")
        found = batch
    return Critical(found, ">=" if len(batches) > 1 else "=")


def at_samples(records: Sequence[Mapping[str, Any]], samples: float, metric: str = METRIC) -> float | None:
    """`metric` at `samples` seen, linear between the evaluations around it (exact at one)."""
    points = sorted(
        (r["samples_seen"], r[metric])
        for r in records
        if isinstance(r.get(metric), (int, float)) and r.get("samples_seen") is not None
    )
    for (s0, v0), (s1, v1) in zip(points, points[1:]):
        if s0 <= samples <= s1:
            return v0 if s1 == s0 else v0 + (v1 - v0) * (samples - s0) / (s1 - s0)
    return points[-1][1] if points and points[-1][0] == samples else None


# ----------------------------------------------------------------------------- reading the branches


@dataclass
class Branch:
    seed: int
    at: int  # samples seen where it branched
    batch: int
    length: int  # branch.samples
    trunk: str
    status: str
    records: list[dict[str, Any]] = field(default_factory=list)

    def loss(self, fraction: float = 1.0) -> float | None:
        """The validation loss `fraction` of the way along; inf for a branch that diverged."""
        if self.status == "diverged":
            return math.inf
        return at_samples(self.records, self.at + fraction * self.length) if self.status == "completed" else None

    def start_loss(self) -> float | None:
        return at_samples(self.records, self.at)


def load_branches(sweep: Path) -> list[Branch]:
    found = []
    for job in sorted(p for p in sweep.iterdir() if (p / "summary.json").is_file()):
        summary = json.loads((job / "summary.json").read_text())
        node = summary.get("branch")
        if not node:
            continue
        found.append(
            Branch(
                summary["seed"],
                node["at_samples"],
                node["batch"],
                node["samples"],
                node["trunk"],
                summary["status"],
                read_jsonl(job / "metrics.jsonl"),
            )
        )
    return found


# ----------------------------------------------------------------------------- the table


@dataclass
class Stage:
    """One trunk checkpoint: its branches' critical batch, and the estimates beside it."""

    at: int  # requested mark (branch.at_samples is the checkpoint's samples seen)
    length: int
    losses: dict[int, list[float]]  # batch -> the seeds' final losses
    critical: Critical
    per_seed: list[Critical]
    by_epsilon: dict[float, Critical]
    by_length: dict[float, Critical]
    b_simple: float | None = None
    b_simple_note: str = ""
    target: float | None = None  # val_acc the trunk had at at + length (for B_crit)
    b_crit: float | None = None
    b_crit_note: str = ""

    def ratio(self, value: float | None) -> float | None:
        if value is None or self.critical.batch is None:
            return None
        return value / self.critical.batch

    def shown_ratio(self, value: float | None) -> str:
        """The ratio, a bound where the critical batch is one (over an upper bound: at least)."""
        ratio = self.ratio(value)
        if ratio is None:
            return "-"
        return {"=": "", "<=": "≥ ", ">=": "≤ "}[self.critical.bound] + f"{ratio:,.2f}"


def _mean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def stages(branches: Sequence[Branch], epsilon: float = EPSILON) -> list[Stage]:
    by_at: dict[int, list[Branch]] = defaultdict(list)
    for b in branches:
        by_at[b.at].append(b)
    out = []
    for at in sorted(by_at):
        group = by_at[at]
        length = group[0].length

        def mean_losses(fraction: float, group=group) -> dict[int, float | None]:
            per_batch: dict[int, list[float | None]] = defaultdict(list)
            for b in group:
                per_batch[b.batch].append(b.loss(fraction))
            # a batch counts only where every seed's branch finished
            return {
                batch: (None if any(v is None for v in vs) else statistics.fmean(vs)) for batch, vs in per_batch.items()
            }

        final = mean_losses(1.0)
        seeds = sorted({b.seed for b in group})
        starts = {
            s: next((b.start_loss() for b in group if b.seed == s and b.start_loss() is not None), None) for s in seeds
        }
        start = _mean(list(starts.values()))
        per_seed = [
            critical_batch({b.batch: b.loss() for b in group if b.seed == s}, epsilon, starts[s]) for s in seeds
        ]
        losses: dict[int, list[float]] = defaultdict(list)
        for b in group:
            if b.loss() is not None:
                losses[b.batch].append(b.loss())
        out.append(
            Stage(
                at=at,
                length=length,
                losses=dict(sorted(losses.items())),
                critical=critical_batch(final, epsilon, start),
                per_seed=per_seed,
                by_epsilon={e: critical_batch(final, e, start) for e in EPSILONS},
                by_length={f: critical_batch(mean_losses(f), epsilon, start) for f in (0.25, 0.5, 1.0)},
            )
        )
    return out


def window_b_simple(records: Sequence[Mapping[str, Any]], start: float, stop: float) -> tuple[float | None, str]:
    """B_simple over the records within [start, stop] samples seen: the mean of tr(Σ) over the
    mean of |G|² (each averaged apart, as bsexp's estimator does), from the raw estimates each
    record holds since the one before (`noise/*_raw`; else the moving averages). None, and why,
    where |G|² averages to 0 or below: the gradient's signal is then too small for the trunk's
    batch to resolve against its noise, so B_simple is far above that batch."""
    inside = [r for r in records if start <= r.get("samples_seen", -1) <= stop]
    for grad_key, trace_key in (("noise/grad_sq_raw", "noise/trace_sigma_raw"), ("noise/grad_sq", "noise/trace_sigma")):
        pairs = [
            (r[grad_key], r[trace_key])
            for r in inside
            if isinstance(r.get(grad_key), (int, float)) and isinstance(r.get(trace_key), (int, float))
        ]
        if pairs:
            grad, trace = statistics.fmean(g for g, _ in pairs), statistics.fmean(t for _, t in pairs)
            if grad <= 0:
                return None, f"|G|² averages {grad:.3g} (not positive) over the window: unresolved at this batch"
            return trace / grad, ""
    return None, "no noise measurements in the window (run the trunk with trainer.noise_scale=always)"


def add_trunk(found: list[Stage], branches: Sequence[Branch]) -> None:
    """B_simple over each branch's window on the trunks (mean over the seeds that resolve it), and
    the trunks' val_acc at its end."""
    trunks = {b.seed: Path(b.trunk) for b in branches}
    records = {seed: read_jsonl(path / "metrics.jsonl") for seed, path in trunks.items()}
    for stage in found:
        estimates = [window_b_simple(recs, stage.at, stage.at + stage.length) for recs in records.values()]
        stage.b_simple = _mean([value for value, _ in estimates])
        resolved = sum(value is not None for value, _ in estimates)
        if resolved < len(estimates):
            why = next(note for value, note in estimates if value is None)
            stage.b_simple_note = f"{len(estimates) - resolved} of {len(estimates)} trunk(s): {why}"
        stage.target = _mean([at_samples(recs, stage.at + stage.length, "val_acc") for recs in records.values()])


def add_b_crit(found: list[Stage], points: Sequence) -> None:
    """B_crit for each stage's target from the points of a sweep of fixed batches (report.analysis
    Points; each batch at its best LR)."""
    from bsexp.report.analysis import fit_steps_samples, reach

    points = [p for p in points if p.done and p.batch]
    by_batch: dict[int, dict[Any, list]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        by_batch[p.batch][(p.config.get("optimizer") or {}).get("lr")].append(p)
    for stage in found:
        if stage.target is None:
            stage.b_crit_note = "no trunk accuracy at the branch's end"
            continue
        steps, samples = [], []
        for _batch, by_lr in sorted(by_batch.items()):
            best = None
            for seeds in by_lr.values():
                reached = [reach(p, "val_acc", stage.target) for p in seeds]
                if reached and all(r is not None for r in reached):
                    mean = (statistics.fmean(r.steps for r in reached), statistics.fmean(r.samples for r in reached))
                    best = mean if best is None or mean[0] < best[0] else best
            if best is not None:
                steps.append(best[0])
                samples.append(best[1])
        fit = fit_steps_samples(steps, samples)
        stage.b_crit = fit.b_crit
        stage.b_crit_note = fit.refused or f"{len(steps)} batches reached it"


# ----------------------------------------------------------------------------- output


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown(found: Sequence[Stage], epsilon: float, seeds: int, swept: bool) -> str:
    length = found[0].length if found else 0
    lines = [
        "# The critical batch, measured by branches",
        "",
        f"Branches of {length:,} samples from trunk checkpoints, {seeds} seed(s); the critical batch is the largest "
        f"batch whose branch's mean validation loss over the seeds ends within ε = {epsilon:g} (relative) of the "
        f"smallest batch's. ≥: every batch branched stayed within ε; ≤: the next batch up already fell out; "
        f"no progress: the smallest batch's branch ended less than ε below its starting loss (too short to tell). "
        f"A diverged branch is out of any ε. "
        f"B_simple: the trunks' mean over the branch's window. "
        + (
            "B_crit: E_min / S_min from the fixed-batch sweep, to the validation accuracy the trunk had at the "
            "branch's end."
            if swept
            else "B_crit: no fixed-batch sweep given (--sweep)."
        ),
        "",
        "| samples seen | critical batch | per seed | B_simple | B_simple / critical | target val_acc | B_crit "
        "| B_crit / critical |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in found:
        b_simple = _num(s.b_simple) if s.b_simple is not None or not s.b_simple_note else "unresolved"
        lines.append(
            f"| {s.at:,} | {s.critical} | {', '.join(str(c) for c in s.per_seed)} | {b_simple} | "
            f"{s.shown_ratio(s.b_simple)} | {_num(s.target and 100 * s.target, 2)} | {_num(s.b_crit)} | "
            f"{s.shown_ratio(s.b_crit)} |"
        )
    batches = sorted({b for s in found for b in s.losses})
    lines += [
        "",
        "Mean validation loss at the branch's end, by batch (diverged: a seed's branch diverged; "
        "- : not run or failed):",
        "",
        "| samples seen | " + " | ".join(f"B={b:,}" for b in batches) + " |",
        "| ---: |" + " ---: |" * len(batches),
    ]
    for s in found:
        cells = []
        for b in batches:
            values = s.losses.get(b)
            mean = _mean(values) if values else None
            cells.append(
                "-"
                if mean is None
                else ("diverged" if not math.isfinite(mean) else (f"{mean:.4f}" if mean < 1e4 else f"{mean:.3g}"))
            )
        lines.append(f"| {s.at:,} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Sensitivity to ε (relative tolerance), full branch length:",
        "",
        "| samples seen | " + " | ".join(f"ε = {e:g}" for e in EPSILONS) + " |",
        "| ---: |" + " ---: |" * len(EPSILONS),
    ]
    for s in found:
        lines.append(f"| {s.at:,} | " + " | ".join(str(s.by_epsilon[e]) for e in EPSILONS) + " |")
    lines += [
        "",
        f"Sensitivity to the branch length (ε = {epsilon:g}; the loss at that point of the same branches):",
        "",
        "| samples seen | " + " | ".join(f"Δ = {int(f * length):,}" for f in (0.25, 0.5, 1.0)) + " |",
        "| ---: |" + " ---: |" * 3,
    ]
    for s in found:
        lines.append(f"| {s.at:,} | " + " | ".join(str(s.by_length[f]) for f in (0.25, 0.5, 1.0)) + " |")
    notes = [f"- {s.at:,}: B_simple: {s.b_simple_note}" for s in found if s.b_simple_note]
    notes += [f"- {s.at:,}: B_crit {s.b_crit_note}" for s in found if s.b_crit is None and s.b_crit_note]
    if notes:
        lines += ["", "Where an estimate is missing or partial:", *notes]
    return "\n".join(lines) + "\n"


def write_csv(found: Sequence[Stage], path: Path) -> None:
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(
            [
                "samples_seen",
                "critical_batch",
                "bound",
                "b_simple",
                "b_simple_ratio",
                "target_val_acc",
                "b_crit",
                "b_crit_ratio",
                *(f"critical_eps_{e:g}" for e in EPSILONS),
                *(f"critical_length_{f:g}" for f in (0.25, 0.5, 1.0)),
            ]
        )
        for s in found:
            writer.writerow(
                [
                    s.at,
                    s.critical.batch,
                    s.critical.bound,
                    s.b_simple,
                    s.ratio(s.b_simple),
                    s.target,
                    s.b_crit,
                    s.ratio(s.b_crit),
                    *(s.by_epsilon[e].batch for e in EPSILONS),
                    *(s.by_length[f].batch for f in (0.25, 0.5, 1.0)),
                ]
            )


def figure(found: Sequence[Stage], epsilon: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    x = [s.at for s in found]
    ax.plot(
        x, [s.critical.batch for s in found], "o-", color="black", label=f"critical batch, branches (ε={epsilon:g})"
    )
    for s in found:
        values = [c.batch for c in s.per_seed if c.batch]
        if values:
            ax.vlines(s.at, min(values), max(values), color="black", alpha=0.3, linewidth=4)
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


def report(
    sweep: Path | Sequence[Path], fixed: Path | None = None, epsilon: float = EPSILON, out: Path | None = None
) -> list[Stage]:
    """The report of the branches in `sweep` (one directory, or several: a point run again in a
    later one replaces the earlier's)."""
    sweeps = [sweep] if isinstance(sweep, Path) else list(sweep)
    latest: dict[tuple[int, int, int], Branch] = {}
    for directory in sweeps:
        for b in load_branches(directory):
            if b.status == "completed" or (b.seed, b.at, b.batch) not in latest:
                latest[(b.seed, b.at, b.batch)] = b
    branches = list(latest.values())
    if not branches:
        raise ValueError(f"{', '.join(map(str, sweeps))} holds no branch runs (summary.json with a `branch` entry)")
    sweep = sweeps[0]
    found = stages(branches, epsilon)
    add_trunk(found, branches)
    if fixed is not None:
        from bsexp.report.load import load_points

        add_b_crit(found, load_points(fixed))
    out = out or sweep
    out.mkdir(parents=True, exist_ok=True)
    (out / "critical.md").write_text(markdown(found, epsilon, len({b.seed for b in branches}), fixed is not None))
    write_csv(found, out / "critical.csv")
    figure(found, epsilon, out / "critical.png")
    return found


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bsexp.report.critical", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", type=Path, nargs="+", help="the branch sweep's directory (or several)")
    parser.add_argument("--sweep", dest="fixed", type=Path, default=None, help="a fixed-batch sweep, for B_crit")
    parser.add_argument("--epsilon", type=float, default=EPSILON, help="relative loss tolerance (default 0.05)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    for name, path in (*(("sweep", p) for p in args.sweep), ("--sweep", args.fixed)):
        if path is not None and not path.is_dir():
            parser.exit(2, f"error: {name}={path}: no such directory; valid: a sweep directory\n")
    if not args.epsilon > 0:
        parser.exit(2, f"error: --epsilon={args.epsilon}: must be positive (a relative tolerance, e.g. 0.05)\n")
    try:
        report(args.sweep, args.fixed, args.epsilon, args.out)
    except ValueError as exc:
        parser.exit(2, f"error: sweep={args.sweep[0]}: {exc}; valid: the directory of a branch sweep\n")
    print(((args.out or args.sweep[0]) / "critical.md").read_text())


if __name__ == "__main__":
    main()
