"""The command line of `python -m bsexp.report.steps TUNE_DIR` (see the package's docstring)."""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from bsexp.report.load import load_points
from bsexp.report.steps.analysis import StepsToResult, analyse
from bsexp.report.steps.load import load_tuning
from bsexp.report.steps.render import figures, markdown, write_csv


def estimates(result: StepsToResult, trials, rule_sweep: Path | None, branched: Path | None) -> list[tuple[str, ...]]:
    """The critical batch as bsexp estimates it four ways, on the same data and model."""
    fit = result.fit
    tuned = (
        "this curve: the LR tuned at each batch",
        "-" if fit is None or fit.refused else f"{fit.b_crit:,.0f}",
        fit.refused if fit is not None and fit.refused else "E_min / S_min of S = S_min (1 + B_crit / B)",
    )
    rows, noise = (
        [tuned],
        [
            p.summary["noise_b_simple_mean"]
            for p in trials
            if p.done and isinstance(p.summary.get("noise_b_simple_mean"), float)
        ],
    )
    if rule_sweep is not None:
        from bsexp.report.analysis import analyse as analyse_sweep

        # the tuning's target and metric: one question
        sweep = analyse_sweep(load_points(rule_sweep), target=result.target, metric=result.metric)
        critical = sweep.critical[0] if sweep.critical else None
        value = "-" if critical is None or critical.b_crit is None else f"{critical.b_crit:,.0f}"
        rows.append(
            (
                "a sweep with the LR scaled by a rule",
                value,
                critical.refused or f"the same fit, to the same target ({result.target_text})"
                if critical
                else "no family",
            )
        )
        if not noise and sweep.noise.b_simple is not None:
            noise = list(sweep.noise.values)
    else:
        rows.append(
            (
                "a sweep with the LR scaled by a rule",
                "-",
                "not given: --rule-sweep DIR (python -m bsexp.train "
                "-m batch.size=... seed=... trainer.eval_growth=0.04)",
            )
        )
    rows.append(
        (
            "B_simple, the gradient noise scale",
            f"{statistics.fmean(noise):,.0f}" if noise else "-",
            "each run's mean over training (McCandlish et al. 2018)"
            if noise
            else "not measured: trainer.noise_scale=always in the runs, or a rule sweep that measured it",
        )
    )
    rows.append(_branched(branched, result))
    return rows


def nearest_stage(found: Sequence, samples: float | None):
    """The branch stage to set beside the tuned curve: of those with a critical batch, the one whose
    samples seen are nearest (in ratio) `samples`, or the last where there is nothing to be near."""
    with_batch = [s for s in found if s.critical.batch is not None]
    if not with_batch:
        return None
    if samples is None:
        return with_batch[-1]
    return min(with_batch, key=lambda s: abs(math.log(max(s.at, 1) / samples)))


def _branched(branched: Path | None, result: StepsToResult) -> tuple[str, str, str]:
    how = "branched runs (Merrill et al. 2025)"
    if branched is None:
        return how, "-", "not given: --branched DIR (experiment=critical_batch)"
    from bsexp.report.critical.analysis import stages
    from bsexp.report.critical.load import latest_branches

    found = stages(latest_branches([branched]))
    # The tuned curve's batch B_crit reaches the target after 2 E_min samples: the stage nearest.
    fit = result.fit
    samples = 2 * fit.e_min if fit is not None and not fit.refused else None
    stage = nearest_stage(found, samples)
    if stage is None:
        return how, "-", "no stage with a critical batch"
    where = f"nearest 2 E_min = {samples:,.0f} samples" if samples else "the last with one"
    over = ", ".join(f"{s.critical} at {s.at:,}" for s in found)
    return how, str(stage.critical), f"at {stage.at:,} samples seen ({where}); over training: {over}"


def report(
    tune_dir: Path, rule_sweep: Path | None = None, branched: Path | None = None, reference: int = 128
) -> StepsToResult:
    trials, reruns, target, metric = load_tuning(tune_dir)
    result = analyse(trials, reruns, target, reference, metric)
    (tune_dir / "steps_to_result.md").write_text(markdown(result, estimates(result, trials, rule_sweep, branched)))
    write_csv(result, tune_dir / "steps_to_result.csv")
    figures(result, tune_dir)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    from bsexp.report.steps import __doc__ as doc

    parser = argparse.ArgumentParser(prog="python -m bsexp.report.steps", description=doc.split("\n\n")[0])
    parser.add_argument("tune_dir", type=Path, help="the directory of python -m bsexp.tune")
    parser.add_argument("--rule-sweep", type=Path, help="a sweep of the same set-up with the LR scaled by a rule")
    parser.add_argument("--branched", type=Path, help="the branches of experiment=critical_batch")
    parser.add_argument("--reference", type=int, default=128, help="the batch the rules are scaled from (128)")
    args = parser.parse_args(argv)
    try:
        result = report(args.tune_dir, args.rule_sweep, args.branched, args.reference)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    print(
        f"steps to result: {len(result.batches)} batch sizes, {len(result.not_reached)} not reached; "
        f"report: {args.tune_dir / 'steps_to_result.md'}"
    )
