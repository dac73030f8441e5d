"""The command line of `python -m bsexp.report.compare TUNE_DIR [--out DIR] [--against ARM]` (see the
package's docstring): read the comparison's declaration and runs, analyse, render compare.md,
compare.csv and compare_frontier.png. A directory that holds no comparison, or an --against that
names no arm, is one line, exit 2.

--against ARM reads every arm against ARM at every rung (and in the final value) instead of the
baseline the tuning seeds chose: for a question asked after seeing the held-out runs (the declared
baseline reached the rung on too few of them; which fixed batch reached it on enough), labelled as
such in its report, which goes to TUNE_DIR/against_ARM/ unless --out says otherwise, so the
comparison's own report is never overwritten."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bsexp.report.compare.analysis import Comparison, analyse
from bsexp.report.compare.figure import figure
from bsexp.report.compare.load import load_runs, read_centres
from bsexp.report.compare.plan import Plan
from bsexp.report.compare.render import markdown, write_csv


def report_dir(tune_dir: Path, out: Path | None, against: str | None) -> Path:
    """Where the report goes: `out` if given, else TUNE_DIR (TUNE_DIR/against_ARM with --against)."""
    return out or (tune_dir / f"against_{against}" if against else tune_dir)


def report(tune_dir: Path, out: Path | None = None, against: str | None = None) -> Comparison:
    """Analyse the comparison in `tune_dir` and write its report into `out` (default: the same, or
    TUNE_DIR/against_ARM with `against`)."""
    plan = Plan.read(tune_dir)
    result = analyse(plan, load_runs(tune_dir, plan), read_centres(tune_dir), against=against)
    out = report_dir(tune_dir, out, against)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(markdown(result, tune_dir))
    write_csv(result, out / "compare.csv")
    figure(result, out)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    from bsexp.report.compare import __doc__ as doc

    parser = argparse.ArgumentParser(prog="python -m bsexp.report.compare", description=doc.split("\n\n")[0])
    parser.add_argument("tune_dir", type=Path, help="the directory of python -m bsexp.tune DIR comparison=NAME")
    parser.add_argument("--out", type=Path, default=None, help="where the report goes (default: TUNE_DIR)")
    parser.add_argument(
        "--against",
        metavar="ARM",
        default=None,
        help="every arm against this arm at every rung, chosen after seeing the runs (post hoc); the report goes "
        "to TUNE_DIR/against_ARM unless --out says otherwise",
    )
    args = parser.parse_args(argv)
    out = report_dir(args.tune_dir, args.out, args.against)
    try:
        result = report(args.tune_dir, out, args.against)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    arms, held = len(result.plan.arms), sum(len(r) for r in result.held_out.values())
    print(f"comparison {result.plan.name}: {arms} arms, {held} held-out runs; report: {out / 'compare.md'}")
    return 0
