"""The critical batch four ways on one axis (issue 58, part 2): for each set-up, against the
validation accuracy reached —

- the tuned curve's B_crit at each rung (scripts/noise_by_rung.py's CSV of the tuned reruns),
- B_simple measured on those runs up to each rung (the same CSV, the batches' median),
- the rule-scaled sweep's B_crit at each rung (noise_by_rung.py's CSV of the rule sweep),
- the critical batch from branches at each batch's tuned LR (bsexp.report.critical's critical.csv),
  placed at the accuracy the trunks had at the branches' end (a hollow triangle: a bound, the
  smallest batch branched being the answer's upper end, or the largest its lower),

each with its 95 % interval:

    python scripts/four_ways.py OUT.png --setup "with BatchNorm" TUNED.csv RULE.csv CRITICAL.csv \\
        [--setup "without BatchNorm" TUNED.csv RULE.csv CRITICAL.csv]

One panel per set-up, the batch on a log scale."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _series(rows: list[dict[str, str]], x: str, y: str, low: str, high: str) -> list[tuple[float, ...]]:
    """(x, y, low, high) where y is known; a missing bound is y itself."""
    out = []
    for r in rows:
        if r.get(y) not in (None, ""):
            value = float(r[y])
            bounds = [float(r[b]) if r.get(b) not in (None, "") else value for b in (low, high)]
            out.append((float(r[x]), value, *bounds))
    return out


def panel(ax, title: str, tuned: Path, rule: Path, critical: Path) -> None:
    tuned_rows, rule_rows, branch_rows = _rows(tuned), _rows(rule), _rows(critical)
    target = next(k for k in branch_rows[0] if k.startswith("target_"))
    branches = _series(branch_rows, target, "critical_batch", "critical_low", "critical_high")
    for points, label, style, color in (
        (
            _series(tuned_rows, "rung", "B_crit_fit", "B_crit_fit_low", "B_crit_fit_high"),
            "B_crit, tuned curve",
            "o-",
            "black",
        ),
        (
            _series(tuned_rows, "rung", "all", "all_low", "all_high"),
            "B_simple on the tuned runs (median)",
            "s--",
            "tab:blue",
        ),
        (
            _series(rule_rows, "rung", "B_crit_fit", "B_crit_fit_low", "B_crit_fit_high"),
            "B_crit, rule-scaled sweep",
            "^:",
            "tab:red",
        ),
        (branches, "critical batch, branches at tuned LRs", "D-.", "tab:green"),
    ):
        if not points:
            continue
        points.sort()
        xs, ys, lows, highs = zip(*points)
        xs = [100 * x for x in xs]
        ax.plot(xs, ys, style, color=color, label=label)
        ax.vlines(xs, lows, highs, color=color, alpha=0.35, linewidth=3)
    target_rows = [r for r in branch_rows if r.get("critical_batch")]
    for bound, marker in (("<=", "v"), (">=", "^")):
        bounded = [(100 * float(r[target]), float(r["critical_batch"])) for r in target_rows if r["bound"] == bound]
        if bounded:
            xs, ys = zip(*bounded)
            word = "at most" if bound == "<=" else "at least"
            ax.plot(xs, ys, marker, color="tab:green", markersize=10, fillstyle="none", label=f"branches: {word}")
    ax.set_yscale("log", base=2)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("validation accuracy reached (%): the rung; branches: the trunks' at their end")
    ax.grid(True, which="both", alpha=0.3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--setup", nargs=4, action="append", required=True, metavar=("TITLE", "TUNED", "RULE", "CRITICAL")
    )
    args = parser.parse_args()
    for title, *paths in args.setup:
        for path in paths:
            if not Path(path).is_file():
                parser.exit(
                    2,
                    f"error: --setup {title}: {path}: no such file; valid: a CSV of noise_by_rung.py or "
                    "report.critical\n",
                )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.setup), figsize=(6.5 * len(args.setup), 4.4), sharey=True, squeeze=False)
    for ax, (title, tuned, rule, critical) in zip(axes[0], args.setup):
        panel(ax, title, Path(tuned), Path(rule), Path(critical))
    axes[0][0].set_ylabel("batch size (samples)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
