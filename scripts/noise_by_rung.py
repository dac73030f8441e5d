"""The critical batch from fixed-batch runs, by rung: B_simple on the runs themselves, and the fit of
their steps and samples (issue 58, part 2):

    python scripts/noise_by_rung.py outputs/noise/tuned [--weight progress|steps] [--name NAME]
        [--against outputs/noise/rule] [--out CSV]

SWEEP_DIR is a multirun of fixed batches over seeds, each run with `trainer.noise_scale=always` and
a `trainer.ladder` (the comparison's reruns at its tuned values, or a sweep with the LR scaled by a
rule). Two estimates per rung of the ladder, each with a 95 % interval from a bootstrap over the
seeds:

- **B_simple up to the rung**, per batch: each run's noise-scale estimates (`noise/trace_sigma_raw`
  and `noise/grad_sq_raw`, the raw estimates since the record before) over its records up to the
  step at which it reached the rung, averaged apart with weights and divided: B = sum w tr(Sigma) /
  sum w |G|^2. `--weight progress` (the default) weighs each record by the fall of the training loss
  since the one before (McCandlish et al.'s B_crit is a path average of B_noise over training, each
  stretch counted by the progress it made); `steps` by its steps. Then the mean over the seeds that
  reached the rung with a positive weighted |G|^2 (its estimate is unbiased, so a short stretch can
  sum below 0; the CSV's `<batch>_seeds` counts them), and the median of the batches' (`all`).
- **B_crit of the fit**: McCandlish et al.'s (S/S_min - 1)(E/E_min - 1) = 1 through the batches'
  mean steps and samples to the rung, with the comparison report's own analysis
  (`bsexp.report.compare.analysis.frontier`: a batch enters where it reached the rung on 8 of 10
  seeds).
- **Their ratio**, the batches' median B_simple over the fit's B_crit, both from the same resampled
  seeds, with its interval: the two `agree` only where it covers 1.

- With `--against OTHER_SWEEP` (the same seeds, the same ladder): **the ratio of this sweep's fitted
  B_crit to the other's**, both fits from the same resampled seeds (paired: a seed's runs in both
  sweeps drawn together), with its interval; `fit_agree` says "agree" only where it covers 1. Each
  fit takes the batches that reached the rung in its own sweep (`batches`, `against_batches`), and
  the interval is over the resamples where both fits hold (`fit_refused`: the share where either
  was refused).

Printed as markdown tables; the same rows go to SWEEP_DIR/noise_by_rung.csv (or `--out`)."""

from __future__ import annotations

import argparse
import csv
import math
import sys
import warnings
from functools import partial
from pathlib import Path

import numpy as np

from bsexp.report.compare.analysis import fit_of_seeds, frontier, reaches_at
from bsexp.report.compare.intervals import over_seeds
from bsexp.report.compare.load import read_run
from bsexp.report.compare.plan import HELD_OUT, Plan
from bsexp.report.load import load_points

TRACE, GRAD = "noise/trace_sigma_raw", "noise/grad_sq_raw"
START_LOSS = math.log(10)  # a 10-class model's loss before it learns: where the first record's progress starts


def plan_of(points, seeds: list[int], name: str) -> Plan:
    """The sweep as a comparison's plan: each batch a baseline arm, the seeds held out."""
    config = points[0].config
    trainer = config["trainer"]
    arms = {
        f"fixed_{b}": {"overrides": [f"batch.size={b}"], "baseline": True} for b in sorted({p.batch for p in points})
    }
    return Plan(
        name=name,
        comparison={"arms": arms, "min_reached": 0.8, "tuning_seeds": [min(seeds) - 1], "held_out": len(seeds)},
        ladder_rungs=tuple(float(r) for r in trainer["ladder"]),
        ladder_metric=str(trainer["ladder_metric"]),
        ladder_stop=bool(trainer["ladder_stop"]),
        epochs=float(config["epochs"]),
    )


def b_simple_until(records, step: float, weight: str) -> float | None:
    """B_simple over a run's records up to `step`: weighted sums of tr(Sigma) and |G|^2, divided."""
    trace = grad = 0.0
    before = START_LOSS
    last_step = 0
    for record in records:
        if record.get("step", 0) > math.ceil(step - 1e-9):
            break
        loss, t, g = record.get("train_loss"), record.get(TRACE), record.get(GRAD)
        if None not in (loss, t, g) and all(map(math.isfinite, (loss, t, g))):
            w = max(before - loss, 0.0) if weight == "progress" else record["step"] - last_step
            trace, grad = trace + w * t, grad + w * g
        if loss is not None:
            before = loss
        last_step = record.get("step", last_step)
    return trace / grad if grad > 0 else None


def load(sweep_dir: Path, name: str):
    """The sweep's completed runs as a plan, its seeds, its runs by arm and its points by (arm, seed)."""
    points = [p for p in load_points(sweep_dir) if p.done]
    if not points:
        raise ValueError("no completed run")
    seeds = sorted({p.seed for p in points})
    plan = plan_of(points, seeds, name)
    if seeds != plan.held_out_seeds:  # the fit's bootstrap draws the plan's seeds, B_simple's these
        raise ValueError(f"the seeds must follow each other (found {seeds})")
    runs = {arm: [] for arm in plan.arms}
    by_run = {}
    for point in points:
        run = read_run(point, plan, f"fixed_{point.batch}", HELD_OUT)
        runs[run.arm].append(run)
        by_run[(run.arm, run.seed)] = point
    return plan, seeds, runs, by_run


def analyse(loaded, weight: str):
    """B_simple up to each rung and the fit's B_crit, per rung, of a sweep as `load` read it."""
    plan, seeds, runs, by_run = loaded
    rows = []
    for rung in plan.rungs:
        # (arms, seeds) of B_simple up to the rung: NaN where the run did not reach it
        table = np.full((len(plan.arms), len(seeds)), np.nan)
        for i, arm in enumerate(plan.arms):
            for run in runs[arm]:
                if rung in run.reaches:
                    value = b_simple_until(by_run[(arm, run.seed)].records, run.reaches[rung]["step"], weight)
                    table[i, seeds.index(run.seed)] = np.nan if value is None else value
        found = frontier(plan, rung, runs)
        fit = found.fit if found.fit is not None and not found.fit.refused else None
        b_crit = found.intervals.get("B_crit")
        row = {"rung": rung, "B_crit_fit": fit.b_crit if fit else None}
        row["B_crit_fit_low"], row["B_crit_fit_high"] = (b_crit.low, b_crit.high) if b_crit else (None, None)
        ratio, _ = over_seeds(len(seeds), partial(_ratio, table, reaches_at(plan, rung, runs)[1]), ["ratio"])
        row["ratio"], row["ratio_low"], row["ratio_high"] = (
            (ratio["ratio"].estimate, ratio["ratio"].low, ratio["ratio"].high) if ratio["ratio"] else (None,) * 3
        )
        row["agree"] = "" if not ratio["ratio"] else agreement(ratio["ratio"].low, ratio["ratio"].high)
        for i, arm in enumerate([*plan.arms, "all"]):
            statistic = partial(_mean_over, table, None if arm == "all" else i)
            interval, _ = over_seeds(len(seeds), statistic, ["B"])
            reached = int(np.sum(~np.isnan(table[i] if arm != "all" else table)))
            value = statistic(np.arange(len(seeds)))[0]
            row[arm] = value if math.isfinite(value) else None
            row[f"{arm}_low"], row[f"{arm}_high"] = (
                (interval["B"].low, interval["B"].high) if interval["B"] else (None, None)
            )
            row[f"{arm}_seeds"] = reached
        rows.append(row)
    return plan, rows


def against(loaded, other_dir: Path) -> dict[str, dict]:
    """Per rung, the ratio of the fitted B_crit of a sweep as `load` read it to `other_dir`'s, both
    fits from the same drawn seeds, with its interval: {rung: {"against_B_crit", "fit_ratio",
    "fit_ratio_low", "fit_ratio_high", "fit_agree", "fit_refused", "batches", "against_batches"}}."""
    plan, seeds, runs, _ = loaded
    try:
        other_plan, other_seeds, other_runs, _ = load(other_dir, other_dir.name)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"--against {other_dir}: {exc}") from None
    if other_seeds != seeds:
        raise ValueError(
            f"--against: {other_dir} has seeds {other_seeds}, this sweep {seeds}: a paired ratio needs both"
        )
    if (other_plan.ladder_metric, other_plan.rungs) != (plan.ladder_metric, plan.rungs):
        raise ValueError(
            f"--against: {other_dir}'s ladder ({other_plan.ladder_metric} {other_plan.rungs}) is not this "
            f"sweep's ({plan.ladder_metric} {plan.rungs})"
        )
    out = {}
    for rung in plan.rungs:
        (points, this), (other_points, other) = reaches_at(plan, rung, runs), reaches_at(other_plan, rung, other_runs)
        other_fit = fit_of_seeds(other, np.arange(len(seeds)))
        ratio, refused = over_seeds(len(seeds), partial(fit_ratio, this, other), ["ratio"])
        found = ratio["ratio"]
        out[rung] = {
            "against_B_crit": other_fit.b_crit if other_fit else None,
            "fit_ratio": found.estimate if found else None,
            "fit_ratio_low": found.low if found else None,
            "fit_ratio_high": found.high if found else None,
            "fit_agree": "" if not found else agreement(found.low, found.high, "higher", "lower"),
            "fit_refused": refused,
            "batches": " ".join(str(p[1]) for p in points),
            "against_batches": " ".join(str(p[1]) for p in other_points),
        }
    return out


def fit_ratio(this: np.ndarray, other: np.ndarray, drawn) -> list[float]:
    """B_crit of this sweep's fit over the other's, both through the same drawn seeds (`reaches_at`'s
    tables); NaN where either fit is refused."""
    a, b = fit_of_seeds(this, drawn), fit_of_seeds(other, drawn)
    return [math.nan] if a is None or b is None else [a.b_crit / b.b_crit]


def _mean_over(table: np.ndarray, arm: int | None, drawn) -> list[float]:
    """The mean over the drawn seeds (columns) of one batch's row of `table` (None: the median of
    the batches' means, which one batch's noisy estimates do not carry away); NaN where no drawn
    seed reached the rung."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        per_arm = np.nanmean(table[:, np.asarray(drawn, dtype=int)], axis=1)
        return [float(np.nanmedian(per_arm) if arm is None else per_arm[arm])]


def _ratio(table: np.ndarray, reach: np.ndarray, drawn) -> list[float]:
    """B_simple (the batches' median) over the fit's B_crit, both from the same drawn seeds."""
    fit = fit_of_seeds(reach, drawn)
    return [math.nan] if fit is None else [_mean_over(table, None, drawn)[0] / fit.b_crit]


def agreement(low: float, high: float, higher: str = "B_simple higher", lower: str = "B_simple lower") -> str:
    """Two estimates agree only where the interval of their ratio covers 1."""
    if low <= 1 <= high:
        return "agree"
    return lower if high < 1 else higher


def text(value, low, high) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" + (f" [{low:.0f}, {high:.0f}]" if low is not None else "")


def ratio_text(value, low, high, verdict: str) -> str:
    if value is None:
        return "-"
    shown = f"{value:.2f} [{low:.2f}, {high:.2f}]"
    return f"{shown}: {verdict}" if verdict else shown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--weight", choices=("progress", "steps"), default="progress")
    parser.add_argument("--name", default=None, help="what the tables call the sweep (default: its folder)")
    parser.add_argument(
        "--against", type=Path, default=None, help="another sweep on the same seeds: the paired ratio of the fits"
    )
    parser.add_argument("--out", type=Path, default=None, help="the CSV (default: SWEEP_DIR/noise_by_rung.csv)")
    args = parser.parse_args()
    try:
        loaded = load(args.sweep_dir, args.name or args.sweep_dir.name)
        ratios = against(loaded, args.against) if args.against else None
        plan, rows = analyse(loaded, args.weight)
        out = args.out or args.sweep_dir / "noise_by_rung.csv"
        if out.is_dir() or not out.parent.is_dir():
            raise ValueError(f"--out {out}: not a file in an existing folder")
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {args.sweep_dir}: {exc}", file=sys.stderr)
        return 2
    arms = [*plan.arms, "all"]
    print(f"B_simple up to each rung ({args.weight}-weighted), mean over the seeds that reached it [95 % bootstrap]:")
    print(
        "| rung | B_crit (fit) | "
        + " | ".join(a.replace("fixed_", "") for a in arms[:-1])
        + " | median of the batches | median / B_crit |"
    )
    print("|" + " --- |" * (len(arms) + 3))
    for row in rows:
        cells = [text(row["B_crit_fit"], row["B_crit_fit_low"], row["B_crit_fit_high"])]
        cells += [text(row[a], row[f"{a}_low"], row[f"{a}_high"]) for a in arms]
        cells.append(ratio_text(row["ratio"], row["ratio_low"], row["ratio_high"], row["agree"]))
        print(f"| {row['rung']} | " + " | ".join(cells) + " |")
    if ratios:
        print(f"\nB_crit of the fit against {args.against}'s, both from the same resampled seeds [95 % bootstrap]:")
        print("| rung | B_crit (fit) | B_crit (against) | ratio |")
        print("| --- | --- | --- | --- |")
        for row in rows:
            found = ratios[row["rung"]]
            row.update(found)
            cells = [text(row["B_crit_fit"], row["B_crit_fit_low"], row["B_crit_fit_high"])]
            cells.append(text(found["against_B_crit"], None, None))
            cells.append(
                ratio_text(found["fit_ratio"], found["fit_ratio_low"], found["fit_ratio_high"], found["fit_agree"])
                + (f" ({found['fit_refused']:.1%} of resamples refused)" if found["fit_refused"] else "")
            )
            print(f"| {row['rung']} | " + " | ".join(cells) + " |")
    with open(out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"\n{out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
