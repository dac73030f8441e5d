"""The command line of `python -m bsexp.report.pareto SWEEP_DIR [SWEEP_DIR ...]` (see the package's
docstring): load the sweeps' points, analyse the arms, render pareto.md, pareto.csv and pareto.png."""

from __future__ import annotations

import argparse
from pathlib import Path

from bsexp.report.load import load_points
from bsexp.report.pareto.analysis import NoBaseline, analyse
from bsexp.report.pareto.render import figure, markdown, write_csv


def main(argv: list[str] | None = None) -> int:
    from bsexp.report.pareto import __doc__ as doc

    parser = argparse.ArgumentParser(prog="python -m bsexp.report.pareto", description=doc.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    for d in args.dirs:
        if not d.is_dir():
            raise SystemExit(f"error: {d}: no such sweep directory")
    points = [p for d in args.dirs for p in load_points(d)]
    try:
        result = analyse(points)
    except NoBaseline as exc:
        raise SystemExit(f"error: {exc}") from None
    out = args.out or args.dirs[0]
    out.mkdir(parents=True, exist_ok=True)
    (out / "pareto.md").write_text(markdown(result, args.dirs))
    write_csv(result, out / "pareto.csv")
    figure(result, out)
    print((out / "pareto.md").read_text())
    return 0
