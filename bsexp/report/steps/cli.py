"""The command line of `python -m bsexp.report.steps TUNE_DIR` (see the package's docstring)."""

from __future__ import annotations

import argparse
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

        sweep = analyse_sweep(load_points(rule_sweep), target=result.target)  # the tuning's target: one question
        critical = sweep.critical[0] if sweep.critical else None
        value = "-" if critical is None or critical.b_crit is None else f"{critical.b_crit:,.0f}"
        rows.append(
            (
                "a sweep with the LR scaled by a rule",
                value,
                critical.refused or f"the same fit, to the same target (val_acc >= {result.target:g})"
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
    rows.append(_branched(branched))
    return rows


def _branched(branched: Path | None) -> tuple[str, str, str]:
    how = "branched runs (Merrill et al. 2025), at the last branch point"
    if branched is None:
        return how, "-", "not given: --branched DIR (experiment=critical_batch)"
    from bsexp.report.critical.analysis import stages
    from bsexp.report.critical.load import latest_branches

    found = stages(latest_branches([branched]))
    if not found or found[-1].critical.batch is None:
        return how, "-", "no stage with a critical batch"
    last = found[-1].critical
    return (
        how,
        f"{last.bound} {last.batch:,}".replace("= ", ""),
        f"the largest batch within epsilon at {found[-1].at:,}",
    )


def report(
    tune_dir: Path, rule_sweep: Path | None = None, branched: Path | None = None, reference: int = 128
) -> StepsToResult:
    trials, reruns, target = load_tuning(tune_dir)
    result = analyse(trials, reruns, target, reference)
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
