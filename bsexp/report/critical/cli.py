"""The command line of `python -m bsexp.report.critical BRANCH_SWEEP [MORE ...]` (see the package's
docstring): load the branches, analyse them, render critical.md, critical.csv and critical.png."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from bsexp.report.critical.analysis import EPSILON, SEEDS, Stage, add_b_crit, add_trunk, best_lrs, stages
from bsexp.report.critical.load import latest_branches, trunk_records
from bsexp.report.critical.render import figure, markdown, write_csv
from bsexp.report.load import load_points

METRICS = ("val_acc", "val_loss", "val_bpb")


def report(
    sweep: Path | Sequence[Path],
    fixed: Path | None = None,
    epsilon: float | str = EPSILON,
    out: Path | None = None,
    metric: str | None = None,
    window: float = 0.0,
    best_lr: bool = False,
) -> list[Stage]:
    """The report of the branches in `sweep` (one directory, or several: a point run again in a
    later one replaces the earlier's). `epsilon`: a relative tolerance, or "seeds" (each branch point's
    own, from the trunk seeds' spread). `window`: each branch's loss the median of its evaluations
    over that last fraction of its length (0: its loss at its end). `metric`: B_crit's target, read
    off the trunks (None: val_loss for a language model's branches, else val_acc). `best_lr`: a batch
    branched at several LRs from a point (sweeps given together) takes the LR whose branches end
    lowest (`best_lrs`)."""
    sweeps = [sweep] if isinstance(sweep, Path) else list(sweep)
    branches = latest_branches(sweeps, by_lr=best_lr)
    if not branches:
        raise ValueError(f"{', '.join(map(str, sweeps))} holds no branch runs (summary.json with a `branch` entry)")
    chosen = None
    if best_lr:
        branches, chosen = best_lrs(branches, window)
    found = stages(branches, epsilon, window)
    context = next((b.context for b in branches if b.context), None)
    add_trunk(found, trunk_records(branches), metric or ("val_loss" if context else "val_acc"))
    if fixed is not None:
        add_b_crit(found, load_points(fixed))
    out = out or sweeps[0]
    out.mkdir(parents=True, exist_ok=True)
    seeds = len({b.seed for b in branches})
    (out / "critical.md").write_text(markdown(found, epsilon, seeds, fixed is not None, context, window, chosen))
    write_csv(found, out / "critical.csv")
    figure(found, epsilon, out / "critical.png")
    return found


def main(argv: Sequence[str] | None = None) -> None:
    from bsexp.report.critical import __doc__ as doc

    parser = argparse.ArgumentParser(prog="python -m bsexp.report.critical", description=doc.split("\n\n")[0])
    parser.add_argument("sweep", type=Path, nargs="+", help="the branch sweep's directory (or several)")
    parser.add_argument("--sweep", dest="fixed", type=Path, default=None, help="a fixed-batch sweep, for B_crit")
    parser.add_argument(
        "--epsilon",
        default=str(EPSILON),
        help="relative loss tolerance (default 0.05), or 'seeds': at each branch point the relative standard "
        "deviation over the trunk seeds of the smallest batch's branch loss",
    )
    parser.add_argument(
        "--window",
        type=float,
        default=0.0,
        help="each branch's loss: the median of its evaluations over this last fraction of its length "
        "(default 0: its loss at its end)",
    )
    parser.add_argument(
        "--best-lr",
        action="store_true",
        help="a batch branched at several LRs from a point (their sweeps given together) takes the LR whose "
        "branches end with the lowest mean loss over the seeds",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--metric",
        default=None,
        help="B_crit's target, the trunks' value at each branch's end (default: val_loss for a language model, "
        "else val_acc)",
    )
    args = parser.parse_args(argv)
    for name, path in (*(("sweep", p) for p in args.sweep), ("--sweep", args.fixed)):
        if path is not None and not path.is_dir():
            parser.exit(2, f"error: {name}={path}: no such directory; valid: a sweep directory\n")
    if args.metric is not None and args.metric not in METRICS:
        parser.exit(2, f"error: --metric={args.metric}: valid: {', '.join(METRICS)}\n")
    if args.epsilon != SEEDS:
        try:
            args.epsilon = float(args.epsilon)
        except ValueError:
            pass
        if not isinstance(args.epsilon, float) or not args.epsilon > 0:
            valid = "a positive relative tolerance (e.g. 0.05), or seeds"
            parser.exit(2, f"error: --epsilon={args.epsilon}: valid: {valid}\n")
    if not 0 <= args.window <= 1:
        parser.exit(2, f"error: --window={args.window}: valid: a fraction of the branch's length, 0 to 1\n")
    try:
        report(args.sweep, args.fixed, args.epsilon, args.out, args.metric, args.window, args.best_lr)
    except ValueError as exc:
        parser.exit(2, f"error: sweep={args.sweep[0]}: {exc}; valid: the directory of a branch sweep\n")
    print(((args.out or args.sweep[0]) / "critical.md").read_text())
