"""The command line of `python -m bsexp.report.pareto SWEEP_DIR [SWEEP_DIR ...]` (see the package's
docstring): load the sweeps' points, analyse the arms, render pareto.md, pareto.csv and pareto.png."""

from __future__ import annotations

import argparse
from pathlib import Path

from bsexp.report.load import load_points
from bsexp.report.pareto.analysis import NoBaseline, analyse, arms
from bsexp.report.pareto.render import figure, markdown, tuned_section, write_csv
from bsexp.report.pareto.tuned import against_tuned


def main(argv: list[str] | None = None) -> int:
    from bsexp.report.pareto import __doc__ as doc

    parser = argparse.ArgumentParser(prog="python -m bsexp.report.pareto", description=doc.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--tuned", type=Path, default=None, help="a tuning run (python -m bsexp.tune) to hold the arms against"
    )
    args = parser.parse_args(argv)
    for d in [*args.dirs, *([args.tuned] if args.tuned else [])]:
        if not d.is_dir():
            raise SystemExit(f"error: {d}: no such directory")
    points = [p for d in args.dirs for p in load_points(d)]
    try:
        result = analyse(points)
    except NoBaseline as exc:
        raise SystemExit(f"error: {exc}") from None
    out = args.out or args.dirs[0]
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(result, args.dirs)
    if args.tuned is not None:
        text += "\n".join(tuned_section(_against_tuned(points, args.tuned), args.tuned)) + "\n"
    (out / "pareto.md").write_text(text)
    write_csv(result, out / "pareto.csv")
    figure(result, out)
    print((out / "pareto.md").read_text())
    return 0


def _against_tuned(points, tune_dir: Path):
    from bsexp.report.steps.analysis import analyse as analyse_steps
    from bsexp.report.steps.load import load_tuning

    try:
        trials, reruns, target, metric = load_tuning(tune_dir)
    except ValueError as exc:
        raise SystemExit(f"error: --tuned {exc}") from None
    fixed, others = arms(points)
    return against_tuned([*fixed, *others], analyse_steps(trials, reruns, target, metric=metric))
