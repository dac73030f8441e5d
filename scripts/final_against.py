"""A comparison's final values, every arm against each of the arms you name, on the held-out seeds:

    python scripts/final_against.py outputs/regularisers_mnist1d large_384 small_32 [--out DIR]

For each arm: its held-out seeds, the mean final value of the comparison's metric (its ladder's,
at the budget), the mean test accuracy and final training loss from the runs' summaries where they
have them, and its tuned LR (best.json); then, against each named arm, the paired difference of the
final values (the arm's mean less the named arm's, over the seeds both finished, in the direction
of better) with its 95 % paired-bootstrap interval and what the interval says: `better` (entirely
above 0), `worse` (entirely below), `not distinguished` (contains 0), and the non-inferiority
verdict at the comparison's margin (`python -m bsexp.report.compare`'s, against its baseline).
The same figures go to DIR/final_against.csv, and a figure of the differences with their intervals
to DIR/final_against.png (DIR: the comparison's directory unless --out).

bsexp.report.compare holds every arm against the baseline it chooses (the best tuned fixed batch);
this holds them against arms you name — the large batch and the small one, for the regularisers.
It reads with the report's own reader and intervals (bsexp.report.compare)."""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

from bsexp.report.compare.analysis import held_out_runs
from bsexp.report.compare.intervals import mean_difference, non_inferiority
from bsexp.report.compare.load import load_runs, mean
from bsexp.report.compare.plan import Plan


def summary_means(runs) -> dict[str, float | None]:
    """The mean test accuracy and final training loss over the runs' summary.json."""
    found: dict[str, list[float]] = {"test_acc": [], "train_loss": []}
    for run in runs:
        try:
            summary = json.loads((Path(run.dir) / "summary.json").read_text())
        except (OSError, TypeError, ValueError):
            continue
        for key, values in found.items():
            if isinstance(summary.get(key), (int, float)) and math.isfinite(summary[key]):
                values.append(float(summary[key]))
    return {key: mean(values) for key, values in found.items()}


def direction(low: float, high: float) -> str:
    return "better" if low > 0 else "worse" if high < 0 else "not distinguished"


def rows(tune_dir: Path, against: list[str]) -> tuple[Plan, list[dict]]:
    plan = Plan.read(tune_dir)
    unknown = [a for a in against if a not in plan.arms]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: no such arm; the arms: {', '.join(plan.arms)}")
    held = held_out_runs(plan, load_runs(tune_dir, plan))
    best = json.loads((tune_dir / "best.json").read_text()) if (tune_dir / "best.json").is_file() else {}
    sign = 1.0 if plan.ladder.higher else -1.0
    margin = float(plan.comparison["margin"])
    out = []
    for arm in plan.arms:
        finals = {r.seed: r.final for r in held[arm] if r.final is not None}
        row = {
            "arm": arm,
            "seeds": len(finals),
            "final": mean([*finals.values()]),
            **summary_means(held[arm]),
            "lr": ((best.get(arm) or {}).get("values") or {}).get("optimizer.lr"),
        }
        for name in against:
            base = {r.seed: r.final for r in held[name] if r.final is not None}
            pairs = sorted(set(finals) & set(base))
            if name == arm or len(pairs) < 3:
                continue
            diff = mean_difference([sign * finals[s] for s in pairs], [sign * base[s] for s in pairs])
            row[f"vs_{name}"] = diff.estimate
            row[f"vs_{name}_low"], row[f"vs_{name}_high"] = diff.low, diff.high
            row[f"vs_{name}_direction"] = direction(diff.low, diff.high)
            row[f"vs_{name}_non_inferiority"] = non_inferiority(diff, margin)
        out.append(row)
    return plan, out


def table(plan: Plan, found: list[dict], against: list[str]) -> str:
    metric = plan.ladder_metric
    scale, unit = (100.0, " points") if plan.ladder.higher and metric.endswith("acc") else (1.0, "")
    head = ["arm", "seeds", f"final {metric}", "test acc", "train loss", "tuned LR"]
    head += [f"vs {name}{unit}" for name in against]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in found:

        def number(value, fmt):
            return "-" if value is None else fmt.format(value)

        cells = [
            row["arm"],
            str(row["seeds"]),
            number(row["final"] and row["final"] * scale, "{:.2f}"),
            number(row["test_acc"] and row["test_acc"] * 100, "{:.2f}"),
            number(row["train_loss"], "{:.4f}"),
            number(row["lr"], "{:.3g}"),
        ]
        for name in against:
            if f"vs_{name}" not in row:
                cells.append("-")
                continue
            value, low, high = (row[f"vs_{name}{end}"] * scale for end in ("", "_low", "_high"))
            cells.append(
                f"{value:+.2f} [{low:+.2f}, {high:+.2f}] {row[f'vs_{name}_direction']}; "
                f"{row[f'vs_{name}_non_inferiority']}"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(plan: Plan, found: list[dict], against: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = 100.0 if plan.ladder.higher and plan.ladder_metric.endswith("acc") else 1.0
    fig, axes = plt.subplots(1, len(against), figsize=(4.2 * len(against), 0.45 * len(found) + 1.4), squeeze=False)
    for ax, name in zip(axes[0], against, strict=True):
        for y, row in enumerate(found):
            if f"vs_{name}" not in row:
                continue
            value, low, high = (row[f"vs_{name}{end}"] * scale for end in ("", "_low", "_high"))
            colour = {"better": "tab:green", "worse": "tab:red"}.get(row[f"vs_{name}_direction"], "tab:grey")
            ax.errorbar(value, y, xerr=[[value - low], [high - value]], fmt="o", color=colour, capsize=3)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(range(len(found)), [row["arm"] for row in found])
        ax.invert_yaxis()
        ax.set_xlabel(f"final {plan.ladder_metric} against {name}" + (" (points)" if scale == 100 else ""))
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"{plan.name}: paired differences on the held-out seeds, 95 % intervals", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tune_dir", type=Path)
    parser.add_argument("against", nargs="+", help="the arms every arm is held against")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    try:
        plan, found = rows(args.tune_dir, args.against)
    except (OSError, ValueError) as exc:
        print(f"error: {args.tune_dir}: {exc}", file=sys.stderr)
        return 2
    out = args.out or args.tune_dir
    out.mkdir(parents=True, exist_ok=True)
    print(table(plan, found, args.against))
    keys = list(dict.fromkeys(k for row in found for k in row))
    with open(out / "final_against.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(found)
    figure(plan, found, args.against, out / "final_against.png")
    print(f"\n{out / 'final_against.csv'}, {out / 'final_against.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
