"""Steps to each rung against the batch, from a comparison's tuned fixed batches (issue 58, part 3):

    python scripts/steps_by_batch.py outputs/compare [--ref 128] [--out DIR]

The comparison's own analysis (bsexp.report.compare: the held-out seeds' mean steps and samples,
McCandlish et al.'s fit S = S_min + E_min / B through them at each rung, and a bootstrap over the
seeds of B_crit and the regions' boundaries) drawn as one figure, steps against batch at every rung
with the fitted curve and B_crit's interval, so that the regions can be seen moving with the target
(DIR/steps_by_batch.png); and two tables on stdout: the regions per rung with their intervals, and
each fixed batch's tuned LR and momentum (best.json) against what the linear and square-root rules
give from the tuned LR of the batch `--ref`, compared both as the LR itself and as the effective LR
lr / (1 - momentum) where the momentum was searched too. DIR: the comparison's directory unless --out."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from bsexp.report.compare.analysis import analyse
from bsexp.report.compare.load import load_runs, read_centres
from bsexp.report.compare.plan import Plan


def regions(result) -> str:
    lines = [
        "| rung | batches fitted | B_crit | perfect scaling up to | maximal data parallelism from | fit rms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for found in result.frontiers:
        if found.fit is None or found.fit.refused:
            lines.append(f"| {found.rung} | {len(found.points)} | fit refused | - | - | - |")
            continue
        cells = []
        for name, value in (
            ("B_crit", found.fit.b_crit),
            ("perfect scaling up to", found.fit.b_crit / 4),
            ("maximal data parallelism from", found.fit.b_crit * 4),
        ):
            interval = found.intervals.get(name)
            cells.append(f"{value:.0f}" + (f" [{interval.low:.0f}, {interval.high:.0f}]" if interval else ""))
        batches = ", ".join(str(p[1]) for p in found.points)
        lines.append(f"| {found.rung} | {batches} | {' | '.join(cells)} | {found.fit.rms:.2f} |")
    return "\n".join(lines)


def tuned_lrs(tune_dir: Path, plan: Plan, ref: int) -> str:
    best = json.loads((tune_dir / "best.json").read_text())
    rows = []
    for name in plan.baselines:
        sizes = [o.split("=", 1)[1] for o in plan.arms[name]["overrides"] if o.startswith("batch.size=")]
        values = (best.get(name) or {}).get("values") or {}
        if sizes and "optimizer.lr" in values:
            momentum = values.get("optimizer.momentum")
            effective = values["optimizer.lr"] / (1 - momentum) if momentum is not None else None
            rows.append((int(sizes[0]), values["optimizer.lr"], momentum, effective))
    base = next((r for r in rows if r[0] == ref), None)
    if base is None:
        sizes = ", ".join(str(r[0]) for r in rows)
        raise ValueError(f"--ref {ref}: no fixed batch of that size with a tuned LR; the batches: {sizes}")
    lines = [
        f"| batch | tuned LR | momentum | lr / (1 - momentum) | linear rule from {ref} / tuned | "
        f"square-root rule / tuned | (effective LR) linear / tuned | (effective LR) square root / tuned |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for batch, lr, momentum, effective in sorted(rows):
        k = batch / ref
        cells = [str(batch), f"{lr:.4g}", "-" if momentum is None else f"{momentum:.3f}"]
        cells.append("-" if effective is None else f"{effective:.3g}")
        cells += [f"{base[1] * k / lr:.2f}", f"{base[1] * math.sqrt(k) / lr:.2f}"]
        if effective is not None and base[3] is not None:
            cells += [f"{base[3] * k / effective:.2f}", f"{base[3] * math.sqrt(k) / effective:.2f}"]
        else:
            cells += ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7.5, 5))
    colours = plt.cm.viridis(np.linspace(0, 0.9, len(result.frontiers)))
    for found, colour in zip(result.frontiers, colours, strict=True):
        if not found.points:
            continue
        batches = [p[1] for p in found.points]
        ax.plot(batches, [p[2] for p in found.points], "o", color=colour, label=found.rung)
        if found.fit is None or found.fit.refused:
            continue
        grid = np.geomspace(min(batches) / 1.5, max(batches) * 1.5, 100)
        ax.plot(grid, found.fit.s_min + found.fit.e_min / grid, "-", color=colour, lw=1)
        interval = found.intervals.get("B_crit")
        if interval is not None:
            ax.axvspan(interval.low, interval.high, color=colour, alpha=0.12)
        ax.axvline(found.fit.b_crit, color=colour, ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch (samples per step)")
    ax.set_ylabel("mean steps to the rung (held-out seeds)")
    ax.set_title(
        f"{result.plan.name}: steps to each rung, fit S = S_min + E_min / B;\n"
        "dotted: B_crit, shaded: its 95 % interval (bootstrap over seeds)",
        fontsize=9,
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tune_dir", type=Path)
    parser.add_argument("--ref", type=int, default=128, help="the batch whose tuned LR the rules scale")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    try:
        plan = Plan.read(args.tune_dir)
        result = analyse(plan, load_runs(args.tune_dir, plan), read_centres(args.tune_dir))
        lrs = tuned_lrs(args.tune_dir, plan, args.ref)
    except (OSError, ValueError) as exc:
        print(f"error: {args.tune_dir}: {exc}", file=sys.stderr)
        return 2
    out = args.out or args.tune_dir
    out.mkdir(parents=True, exist_ok=True)
    print(regions(result), "", lrs, sep="\n")
    figure(result, out / "steps_by_batch.png")
    print(f"\n{out / 'steps_by_batch.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
