"""The command line of `python -m bsexp.report DIR [DIR ...]` (see the package's docstring)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from bsexp.report.analysis import METRICS, TOLERANCE_SE, analyse, target_rule
from bsexp.runs.ladder import Ladder
from bsexp.runs.sweep import INDEX, sweep_name

# --metric's choices in words: "val_acc, test_acc, ... or val_bpb".
METRIC_CHOICES = f"{', '.join(METRICS[:-1])} or {METRICS[-1]}"


def _number(holds):
    """A parser of a number `holds` accepts (else argparse's error, which `_checked` turns to None)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError("not a number") from None
        if not holds(value):  # nan holds nothing
            raise argparse.ArgumentTypeError("out of range")
        return value

    return parse


def _value_checks(metric: str, higher: bool, target: str | None, tolerance: str | None):
    """(flag, given, parse, what is valid) of --target and --tolerance: an accuracy's fractions, or
    a loss's values in its own units: a target above 0 (which no cross-entropy reaches), reached at
    or below it, and a tolerance of 0 or more; both finite."""
    if higher:
        return [
            ("--target", target, _number(lambda v: 0 < v <= 1), "an accuracy fraction in (0, 1]"),
            ("--tolerance", tolerance, _number(lambda v: 0 <= v < 1), "an accuracy fraction in [0, 1)"),
        ]
    above, at_least = _number(lambda v: 0 < v < math.inf), _number(lambda v: 0 <= v < math.inf)
    return [
        ("--target", target, above, f"a {metric} above 0 (a loss, reached at or below it)"),
        ("--tolerance", tolerance, at_least, f"a difference of {metric} of 0 or more (in its own units)"),
    ]


def main(argv: list[str] | None = None) -> int:
    from bsexp.report import __doc__ as doc
    from bsexp.report import render
    from bsexp.report.load import load_points

    args = _parser(doc).parse_args(argv)
    if args.metric not in METRICS:
        return _refuse(f"--metric={args.metric}: valid: {METRIC_CHOICES}")
    higher = Ladder(args.metric).higher  # an accuracy better higher, a loss (schema.LOWER_IS_BETTER) lower
    for flag, given, parse, valid in _value_checks(args.metric, higher, args.target, args.tolerance):
        if given is not None and _checked(parse)(given) is None:
            return _refuse(f"{flag}={given}: valid: {valid}")
    target = None if args.target is None else float(args.target)
    tolerance = None if args.tolerance is None else float(args.tolerance)
    points, seen = [], set()
    for d in args.dirs:
        if not d.is_dir():
            what = "no such directory" if not d.exists() else "not a directory"
            return _refuse(f"{d}: {what}; valid: a multirun directory holding job directories")
        if d.resolve() in seen:  # its points would count twice
            return _refuse(f"{d}: given twice; valid: each sweep directory once")
        seen.add(d.resolve())
        found = load_points(d)
        if not found:
            return _refuse(f"{d}: {_what_else(d)}")
        points += found
    out_dir = args.dirs[0]
    analysis = analyse(points, args.metric, tolerance, target, higher)
    names = render.figures(analysis, out_dir)
    (out_dir / "report.md").write_text(render.markdown(analysis, args.dirs, names))
    render.write_csv(analysis, out_dir / "report.csv")
    mode = None if args.no_wandb else render.to_wandb(analysis, out_dir, names, sweep_name(args.dirs[0]))
    print((out_dir / "report.md").read_text())
    print(
        f"report: {out_dir / 'report.md'}, report.csv and {len(names)} figures in {out_dir}"
        + (f"; W&B report run ({mode})" if mode else "")
    )
    return 0


def _parser(doc: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bsexp.report", description=doc.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="multirun directories (outputs/multirun/<date>/<time>)")
    parser.add_argument(
        "--metric",
        default="val_acc",
        help=f"what picks the best row: {METRIC_CHOICES} (an accuracy: the highest mean; a loss, "
        f"nats per sample or token, or val_bpb, bits per byte: the lowest)",
    )
    parser.add_argument(
        "--tolerance",
        default=None,
        help=f"accuracy (a fraction in [0, 1)), or with a loss metric a loss difference (0 or more), within "
        f"which a larger batch still counts as good as the best; default: {TOLERANCE_SE:g} standard errors "
        f"of the difference of the two rows' means",
    )
    parser.add_argument(
        "--target",
        default=None,
        help=f"accuracy (a fraction in (0, 1], reached at or above it), or with a loss metric a loss (above "
        f"0, reached at or below it), for the steps-to-target fit of the critical batch; default: "
        f"{target_rule('accuracy')}; for a loss, {target_rule('loss', higher=False)}",
    )
    parser.add_argument("--no-wandb", action="store_true", help="do not log the report to W&B")
    return parser


def _what_else(d: Path) -> str:
    """Why a directory without sweep points is none, and the command that reads what it holds."""
    from bsexp.report.steps.load import TRIALS

    if (d / TRIALS).is_dir():  # bsexp.tune's: trials/, best.json, seeds/
        return (
            f"a tuning run (python -m bsexp.tune), not a sweep; its report: python -m bsexp.report.steps {d} "
            f"(one of its sweeps: python -m bsexp.report {d / TRIALS})"
        )
    if (d / ".hydra").is_dir() or (d / "summary.json").is_file():
        return f"one run, not a sweep; compare it with another run: python -m bsexp.diff {d} <another run's directory>"
    return f"no sweep points (job directories with .hydra/ or {INDEX} entries)"


def _checked(parse):
    def check(text):
        try:
            return parse(text)
        except argparse.ArgumentTypeError:
            return None

    return check


def _refuse(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
