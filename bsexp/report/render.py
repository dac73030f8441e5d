"""An `Analysis` as people read it: report.md, report.csv, figures (PNG) and a W&B `report` run.

Nothing here decides what the sweep found; it only shows it. Accuracies and the gap are in %
in report.md, report.csv and the figures alike.
"""

from __future__ import annotations

import csv
import math
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bsexp.report.analysis import (
    TOLERANCE_SE,
    TRAINED_ABOVE,
    Analysis,
    Breaking,
    Labels,
    Reach,
    Row,
    StepsCritical,
    grid,
)

# ----------------------------------------------------------------------------- the table


def _pct(value: float | None) -> float | None:
    return None if value is None else 100 * value


def _plan(row: Row) -> str | None:
    if not row.done:
        return None
    s = row.done[0].summary
    return f"{s['micro_size']} x {s['accum_steps']} x {s['world_size']}"


def _final_batch(row: Row) -> str | None:
    """Where a batch that changed during training ended (batch=adaptive, scheduled): the range
    over the seeds; None where it stayed."""
    finals = [int(b) for b in row.values("final_batch_size")]
    if not finals or all(b == row.batch for b in finals):
        return None
    return f"{min(finals)}" if min(finals) == max(finals) else f"{min(finals)}-{max(finals)}"


def _peak(row: Row) -> float | None:
    peak = row.values("peak_memory_mb")
    return max(peak) if peak else None


# report.csv's columns, in its units; report.md shows the same values.
COLUMNS: dict[str, Callable[[Row], Any]] = {
    "configuration": lambda r: r.configuration,
    "batch": lambda r: r.batch,
    "final_batch": _final_batch,
    "micro x accum x world": _plan,
    "lr": lambda r: r.first("lr"),
    "weight_decay": lambda r: r.first("weight_decay"),
    "val_acc_pct": lambda r: _pct(r.mean("val_acc")),
    "val_acc_std_pct": lambda r: _pct(r.std("val_acc")),
    "test_acc_pct": lambda r: _pct(r.mean("test_acc")),
    "test_acc_std_pct": lambda r: _pct(r.std("test_acc")),
    "train_acc_pct": lambda r: _pct(r.mean("train_acc")),
    "gen_gap_pct": lambda r: _pct(r.mean("gen_gap")),
    "gen_gap_std_pct": lambda r: _pct(r.std("gen_gap")),
    "steps": lambda r: r.mean("steps"),
    "wall_time_s": lambda r: r.mean("wall_time_s"),
    "wall_time_std_s": lambda r: r.std("wall_time_s"),
    "samples_per_s": lambda r: r.mean("samples_per_s"),
    "samples_per_s_std": lambda r: r.std("samples_per_s"),
    "peak_memory_mb": _peak,
    "seeds": lambda r: f"{len(r.done)}/{len(r.points)}",
    "status": lambda r: r.status,
}
EXTRA = ("did_not_train", "steps_to_target", "samples_to_target")


def table(analysis: Analysis) -> list[dict[str, Any]]:
    """One dict per row: report.csv's columns (and the W&B table's)."""
    reached = _reached(analysis)
    out = []
    for row in analysis.rows:
        values = {name: get(row) for name, get in COLUMNS.items()}
        got = reached.get(id(row))
        values.update(
            did_not_train=row.did_not_train(analysis.metric),
            steps_to_target=got.steps if got else None,
            samples_to_target=got.samples if got else None,
        )
        out.append(values)
    return out


def _reached(analysis: Analysis) -> dict[int, Reach]:
    return {id(row): got for critical in analysis.critical for row, got in critical.reached}


def write_csv(analysis: Analysis, path: Path) -> None:
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=[*COLUMNS, *EXTRA])
        writer.writeheader()
        for values in table(analysis):
            writer.writerow({k: ("" if v is None else v) for k, v in values.items()})


# ----------------------------------------------------------------------------- report.md


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _spread(mean: float | None, std: float | None, fmt: str) -> str:
    return _num(mean, fmt) + (f" ± {format(std, fmt)}" if std is not None else "")


def _mean_std(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.2f} ± {std:.2f}" if std is not None else f"{mean:.2f}"


def title(labels: Labels) -> str:
    """The data, the model, the epochs and the seeds, as every figure's title names them."""
    if not labels.data and not labels.seeds:
        return "no completed point"
    epochs = "/".join(f"{e:g}" for e in labels.epochs) or "?"
    seeds = labels.seeds
    named = ", ".join(map(str, seeds)) if len(seeds) <= 5 else f"{seeds[0]}-{seeds[-1]}"
    return (
        f"{'/'.join(labels.data) or '?'}, {'/'.join(labels.model) or '?'}, {epochs} epochs, "
        f"seed{'s' if len(seeds) != 1 else ''} {named or '?'}"
    )


def _seeds(labels: Labels) -> str:
    lo, hi = labels.seeds_per_row
    return f"{lo} seed{'s' if hi != 1 else ''}" if lo == hi else f"{lo}-{hi} seeds"


def _family(family: tuple[str, ...], analysis: Analysis) -> str:
    """' (configuration)' where the sweep has several families, else nothing."""
    return f" ({','.join(family)})" if family and len({r.family for r in analysis.rows}) > 1 else ""


def markdown(analysis: Analysis, dirs: list[Path], figures: list[str]) -> str:
    metric, rows = analysis.metric, analysis.rows
    experiments = analysis.experiments
    lines = [
        f"# Batch-size sweep: {', '.join(str(d) for d in dirs)}",
        "",
        f"{title(analysis.labels)}. "
        + (f"Experiment: {', '.join(experiments)} (conf/experiment/). " if experiments else "")
        + f"Every point: {', '.join(f'`{o}`' for o in analysis.common) or 'no other overrides'}. "
        f"Accuracies and the gap in %, mean ± std over the seeds of a row ({_seeds(analysis.labels)}); "
        f"best by mean {metric} marked ★.",
        "",
    ]
    show_config = analysis.varies_configuration
    headers = [
        "",
        *(["configuration"] if show_config else []),
        "batch",
        "micro x accum x world",
        "lr",
        "wd",
        "val acc (%)",
        "test acc (%)",
        "train acc (%)",
        "gap (%)",
        "steps",
        "wall (s)",
        "samples/s",
        "peak (MB)",
        "seeds",
        "status",
    ]
    lines += ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    values = table(analysis)
    for row, v in zip(rows, values):
        status = v["status"] + (", **did not train**" if v["did_not_train"] else "")
        cells = [
            "★" if row is analysis.best else "",
            *([v["configuration"] or "-"] if show_config else []),
            _num(v["batch"], "d") + (f" → {v['final_batch']}" if v["final_batch"] else ""),
            v["micro x accum x world"] or "-",
            _num(v["lr"], ".4g"),
            _num(v["weight_decay"], ".3g"),
            _mean_std(v["val_acc_pct"], v["val_acc_std_pct"]),
            _mean_std(v["test_acc_pct"], v["test_acc_std_pct"]),
            _num(v["train_acc_pct"], ".2f"),
            _mean_std(v["gen_gap_pct"], v["gen_gap_std_pct"]),
            _num(v["steps"], ".0f"),
            _spread(v["wall_time_s"], v["wall_time_std_s"], ".1f"),
            _spread(v["samples_per_s"], v["samples_per_s_std"], ",.0f"),
            _num(v["peak_memory_mb"], ",.0f"),
            v["seeds"],
            status,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if any(v["final_batch"] for v in values):
        lines += [
            (
                "Batch a → b: the batch changed in training, from a to b (over the seeds); micro-batch, lr and "
                "wd are the first batch's."
            ),
            "",
        ]
    if all(len(r.values("wall_time_s")) <= 1 for r in rows):
        lines += [
            "Wall time and samples/s: one measurement a point (one seed each), with no spread to tell a real "
            "difference from the machine's load; sweep seed=0,1,2 for one.",
            "",
        ]
    else:
        lines += ["Wall time and samples/s: mean ± std over the seeds of a row.", ""]
    untrained = [r for r in rows if r.did_not_train(metric)]
    if untrained:
        chance = untrained[0].chance
        lines.append(
            f"**Did not train**: {', '.join(_row_name(r) for r in untrained)}: mean {metric} below "
            f"{100 * (chance + TRAINED_ABOVE * (1 - chance)):.2f} % (chance, {100 * chance:.2f} %, plus "
            f"{TRAINED_ABOVE:g} of the way from chance to 100 %)."
        )
    for _, members in _by_family(analysis):
        low = [r for r in members if not r.did_not_train(metric) and r.under_trained(members)]
        top = max(members, key=lambda r: r.mean("train_acc") if r.mean("train_acc") is not None else -1.0)
        for row in low:
            lines.append(
                f"**Under-trained**: {_row_name(row)}, train acc {_pct(row.mean('train_acc')):.2f} %, "
                f"{100 * (top.mean('train_acc') - row.mean('train_acc')):.1f} points below "
                f"{_row_name(top)}'s: its gap is small because it did not fit the training set, not "
                f"because it generalises better (train longer, or raise its LR)."
            )
    best = analysis.best
    if best is not None:
        n = len(best.values(metric))
        lines.append(
            f"**Best**: {_row_name(best)}, {metric} "
            f"{_mean_std(_pct(best.mean(metric)), _pct(best.std(metric)))} % ({n} seed{'s' if n != 1 else ''})."
        )
    for breaking in analysis.breaking:
        lines.append(_breaking_line(breaking, analysis))
    if analysis.critical:
        for critical in analysis.critical:
            lines += _critical_lines(critical, analysis)
        lines.append(_noise_line(analysis))
    elif analysis.noise.b_simple is not None:
        lines.append(_noise_line(analysis))
    failed = [p for r in rows for p in r.points if p.status != "completed"]
    if failed:
        lines += ["", "## Points that did not complete", ""]
        lines += [f"- `{p.name}`: {p.status}" + (f" ({p.error})" if p.error else "") for p in failed]
    if figures:
        lines += ["", "## Figures", ""] + [f"![{name}]({name})" for name in figures]
    return "\n".join(lines) + "\n"


def _row_name(row: Row) -> str:
    return f"batch {row.batch}" + (f" ({row.configuration})" if row.configuration else "")


def _tolerance(breaking: Breaking) -> str:
    how = "--tolerance" if breaking.given else f"{TOLERANCE_SE:g} standard errors of the difference of the two means"
    return f"{100 * breaking.tolerance:.2f} points: {how}"


def _breaking_line(b: Breaking, analysis: Analysis) -> str:
    metric, head = analysis.metric, f"**Breaking point**{_family(b.family, analysis)}"
    if b.refused:
        return f"{head}: not judged: {b.refused}."
    best = f"the best, batch {b.best.batch}, at {_pct(b.best.mean(metric)):.2f} %"
    if b.row is None:
        if b.best is b.members[-1]:
            return f"{head}: none within the swept range: {best}, is the largest batch swept."
        return (
            f"{head}: none within the swept range: every batch up to {b.members[-1].batch} stayed within the "
            f"tolerance ({_tolerance(b)}) of {best}."
        )
    held = f"; up to batch {b.held.batch} it held" if b.held is not b.best else ""
    line = (
        f"{head}: batch {b.row.batch}, the first batch above {best}, whose {metric} "
        f"({_pct(b.row.mean(metric)):.2f} %) falls more than the tolerance ({_tolerance(b)}) below it{held}."
    )
    if b.best_is_smallest:
        line += " The best is the smallest batch swept: accuracy may be flat only below it."
    return line


def _critical_lines(c: StepsCritical, analysis: Analysis) -> list[str]:
    metric, head = analysis.metric, f"**Critical batch**{_family(c.family, analysis)}"
    left = f" Left out: {'; '.join(c.left_out)}." if c.left_out else ""
    doubt = f" Caution: {c.target.doubt}." if c.target.doubt else ""
    if c.refused:
        return [f"{head}: not fitted: {c.refused}.{left}{doubt}"]
    fit, target = c.fit, c.target
    low, high = min(c.batches), max(c.batches)
    where = (
        ""
        if low <= fit.b_crit <= high
        else f" It lies outside the batches that reached the target ({low}-{high}): an extrapolation."
    )
    lines = [
        f"{head}: B_crit = E_min / S_min = {fit.b_crit:,.0f} (S_min = {fit.s_min:,.1f} steps, E_min = "
        f"{fit.e_min:,.0f} samples), the fit of (S/S_min - 1)(E/E_min - 1) = 1 (McCandlish et al. 2018) to the "
        f"steps S and samples E each batch took to reach {metric} >= {100 * target.value:.2f} % ({target.rule}), "
        f"read from the metrics records and interpolated between evaluations; relative residual "
        f"{100 * fit.rms:.1f} %.{where}{left}{doubt}",
        "",
        "| batch | samples per step | steps to target | samples to target | steps fitted |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row, got in c.reached:  # first-evaluation bounds are left out (analysis.steps_critical_batch)
        lines.append(
            f"| {row.batch} | {got.batch:,.1f} | {got.steps:,.1f} | {got.samples:,.0f} | "
            f"{fit.s_min + fit.e_min / got.batch:,.1f} |"
        )
    lines.append("")
    return lines


def _noise_line(analysis: Analysis) -> str:
    noise = analysis.noise
    if noise.b_simple is not None:
        spread = f"; from {min(noise.values):,.0f} to {max(noise.values):,.0f}" if len(noise.values) > 1 else ""
        return (
            f"**Gradient noise scale**: B_simple = {noise.b_simple:,.0f} (each run's mean over training, "
            f"averaged over {len(noise.values)} point{'s' if len(noise.values) != 1 else ''}{spread}); "
            f"noise_scale.png draws it over training."
        )
    return (
        f"**Gradient noise scale**: not measured: {noise.absent}. To get B_simple beside B_crit, rerun with "
        f"`trainer.noise_scale=always`, which measures it on the side without changing training; "
        f"accumulation (`batch=accumulation`) and DDP measure it for free."
    )


# ----------------------------------------------------------------------------- figures


def figures(analysis: Analysis, out_dir: Path) -> list[str]:
    """The PNGs a person would rather look at than read; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    if not any(r.done for r in analysis.rows):
        return []
    written = [
        _save(accuracy_figure(analysis), out_dir, "accuracy.png"),
        _save(val_loss_figure(analysis), out_dir, "val_loss.png"),
        _save(throughput_memory_figure(analysis), out_dir, "throughput_memory.png"),
    ]
    for name, make in (("noise_scale.png", noise_figure), ("grid.png", grid_figure)):
        fig = make(analysis)
        if fig is not None:
            written.append(_save(fig, out_dir, name))
    return written


def _by_family(analysis: Analysis) -> list[tuple[tuple[str, ...], list[Row]]]:
    fams: dict[tuple[str, ...], list[Row]] = {}
    for row in analysis.rows:
        if row.batch and row.done:
            fams.setdefault(row.family, []).append(row)
    return sorted(fams.items())


def _label(base: str, family: tuple[str, ...], analysis: Analysis) -> str:
    return base + (f", {','.join(family)}" if family and len({r.family for r in analysis.rows}) > 1 else "")


def accuracy_figure(analysis: Analysis):
    """Accuracy and generalisation gap against batch: mean ± std over seeds, the best batch starred,
    each family's breaking point a dashed line, chance level dotted."""
    import matplotlib.pyplot as plt

    if not _varies_batch(analysis):
        return _by_configuration_figure(analysis)
    metric = analysis.metric
    other = next(m for m in ("val_acc", "test_acc") if m != metric)
    fig, (acc_ax, gap_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, (fam, members) in enumerate(_by_family(analysis)):
        color = f"C{i}"
        xs = [r.batch for r in members]
        for key, style, alpha in ((metric, "-o", 1.0), (other, "--s", 0.6)):
            if all(r.mean(key) is not None for r in members):
                acc_ax.errorbar(
                    xs,
                    [100 * r.mean(key) for r in members],
                    yerr=[100 * (r.std(key) or 0) for r in members],
                    fmt=style,
                    color=color,
                    alpha=alpha,
                    capsize=3,
                    label=_label(key, fam, analysis),
                )
        if all(r.mean("gen_gap") is not None for r in members):
            gap_ax.errorbar(
                xs,
                [100 * r.mean("gen_gap") for r in members],
                yerr=[100 * (r.std("gen_gap") or 0) for r in members],
                fmt="-o",
                color=color,
                capsize=3,
                label=_label("train_acc - val_acc", fam, analysis),
            )
            low = [r for r in members if r.under_trained(members) and not r.did_not_train(metric)]
            if low:  # a small gap there is a training set not fitted, not better generalisation
                gap_ax.plot(
                    [r.batch for r in low],
                    [100 * r.mean("gen_gap") for r in low],
                    "o",
                    markersize=13,
                    markerfacecolor="none",
                    markeredgecolor="red",
                    zorder=4,
                    label=_label("under-trained (train acc far below the best)", fam, analysis),
                )
                for r in low:
                    gap_ax.annotate(
                        f"train acc {100 * r.mean('train_acc'):.0f} %",
                        (r.batch, 100 * r.mean("gen_gap")),
                        textcoords="offset points",
                        xytext=(0, -16),
                        ha="center",
                        fontsize=7,
                        color="red",
                    )
    best = analysis.best
    if best is not None:  # an outline around the point, which stays visible inside it
        acc_ax.plot(
            [best.batch],
            [100 * best.mean(metric)],
            marker="*",
            markersize=22,
            markerfacecolor="none",
            markeredgecolor="goldenrod",
            markeredgewidth=1.5,
            linestyle="none",
            zorder=5,
            label=f"best: batch {best.batch}",
        )
    colors = {fam: f"C{i}" for i, (fam, _) in enumerate(_by_family(analysis))}
    for breaking in analysis.breaking:
        if breaking.row is not None:  # red where the sweep has one family, else the family's colour
            color = "red" if len(colors) == 1 else colors.get(breaking.family, "red")
            acc_ax.axvline(
                breaking.row.batch,
                color=color,
                linestyle="--",
                alpha=0.7,
                label=_label(f"breaking point: batch {breaking.row.batch}", breaking.family, analysis),
            )
        elif not breaking.refused:
            acc_ax.plot(
                [], [], " ", label=_label("breaking point: none within the swept range", breaking.family, analysis)
            )
    low, high = _accuracy_range(analysis, (metric, other))
    acc_ax.set_ylim(low, high)  # the trained rows' range: their differences of a point or less stay visible
    for row in analysis.rows:
        if row.batch and row.did_not_train(metric):  # below the axis: marked at its foot
            acc_ax.annotate(
                f"did not train ({100 * row.mean(metric):.0f} %)",
                (row.batch, low),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=7,
                color="dimgrey",
                arrowprops={"arrowstyle": "->", "color": "dimgrey"},
            )
    chance = next((r.chance for r in analysis.rows if r.chance is not None), None)
    if chance is not None and low <= 100 * chance <= high:
        acc_ax.axhline(100 * chance, color="grey", linestyle=":", label=f"chance ({100 * chance:.0f} %)")
    bars = f"mean ± std over {_seeds(analysis.labels)}"
    _style(acc_ax, title=f"accuracy (%), {bars}", ylabel="accuracy (%)")
    _style(gap_ax, title=f"generalisation gap, train - val (%), {bars}", ylabel="points of accuracy")
    fig.suptitle(f"Accuracy against batch size: {title(analysis.labels)}", fontsize=10)
    return fig


def _accuracy_range(analysis: Analysis, keys: tuple[str, ...]) -> tuple[float, float]:
    """The accuracy axis (in %) over the rows that trained, each mean ± std, with a margin; the
    whole 0-100 only where no row trained."""
    values = [
        100 * (r.mean(k) + sign * (r.std(k) or 0))
        for r in analysis.rows
        if r.batch and r.done and not r.did_not_train(analysis.metric)
        for k in keys
        if r.mean(k) is not None
        for sign in (-1, 1)
    ]
    if not values:
        return 0.0, 100.0
    low, high = min(values), max(values)
    margin = max(0.5, 0.15 * (high - low))
    return max(0.0, low - margin), min(100.0, high + margin)


def _varies_batch(analysis: Analysis) -> bool:
    return any(len(members) > 1 for _, members in _by_family(analysis))


def _by_configuration_figure(analysis: Analysis, throughput: bool = False):
    """Where no configuration was run at more than one batch (a grid at one batch), a bar per row:
    accuracy and gap (mean ± std over seeds), or throughput and peak memory."""
    import matplotlib.pyplot as plt

    rows = [r for r in analysis.rows if r.done]
    names = [_row_name(r) if not r.configuration else f"{r.configuration} (batch {r.batch})" for r in rows]
    metric = analysis.metric
    fig, axes = plt.subplots(1, 2, figsize=(13, 1.6 + 0.35 * len(rows)), sharey=True)
    ys = list(range(len(rows)))
    if throughput:
        panels = (
            (axes[0], [r.mean("samples_per_s") for r in rows], None, "training throughput (samples/s)"),
            (axes[1], [_peak(r) for r in rows], None, "peak memory (MB), largest over seeds"),
        )
    else:
        bars = f"mean ± std over {_seeds(analysis.labels)}"
        panels = (
            (
                axes[0],
                [_pct(r.mean(metric)) for r in rows],
                [_pct(r.std(metric)) for r in rows],
                f"{metric} (%), {bars}",
            ),
            (
                axes[1],
                [_pct(r.mean("gen_gap")) for r in rows],
                [_pct(r.std("gen_gap")) for r in rows],
                f"generalisation gap, train - val (%), {bars}",
            ),
        )
    for ax, values, errors, name in panels:
        ax.barh(
            ys,
            [v if v is not None else math.nan for v in values],
            color="C0",
            alpha=0.8,
            xerr=None if errors is None else [e or 0 for e in errors],
            capsize=3,
        )
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3, axis="x")
        ax.set_xlim(left=0)
    axes[0].set_yticks(ys, names, fontsize=7)
    axes[0].invert_yaxis()
    if not throughput:
        best = analysis.best
        if best is not None and best in rows:
            axes[0].plot(
                [_pct(best.mean(metric))],
                [rows.index(best)],
                marker="*",
                markersize=16,
                color="gold",
                markeredgecolor="black",
                linestyle="none",
                label="best",
            )
        chance = next((r.chance for r in rows if r.chance is not None), None)
        if chance is not None:
            axes[0].axvline(100 * chance, color="grey", linestyle=":", label=f"chance ({100 * chance:.0f} %)")
        axes[0].legend(fontsize=7, loc="best")
    what = "Throughput and memory" if throughput else "Accuracy"
    fig.suptitle(f"{what} by configuration: {title(analysis.labels)}", fontsize=10)
    return fig


def val_loss_figure(analysis: Analysis):
    """Validation loss against samples seen, mean over seeds, one line per row; a marker at every
    evaluation, so that a point evaluated once still shows."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for row in analysis.rows:
        curves = [p.records for p in row.done if p.records]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        xs = [curves[0][i]["samples_seen"] for i in range(n)]
        ys = [statistics.fmean(c[i]["val_loss"] for c in curves) for i in range(n)]
        ax.plot(xs, ys, marker="o", markersize=4 if n <= 40 else 2, markevery=max(1, n // 40), label=_row_name(row))
    _style(ax, xlabel="samples seen", ylabel=f"validation loss, mean over {_seeds(analysis.labels)}", batch_axis=False)
    _log_y(ax)
    fig.suptitle(f"Validation loss: {title(analysis.labels)}", fontsize=10)
    return fig


def throughput_memory_figure(analysis: Analysis):
    import matplotlib.pyplot as plt

    if not _varies_batch(analysis):
        return _by_configuration_figure(analysis, throughput=True)
    fig, (rate_ax, mem_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (fam, members) in enumerate(_by_family(analysis)):
        members = [r for r in members if r.mean("samples_per_s") is not None]
        if members:
            xs = [r.batch for r in members]
            one = all(len(r.values("samples_per_s")) == 1 for r in members)
            rate_ax.errorbar(
                xs,
                [r.mean("samples_per_s") for r in members],
                yerr=[r.std("samples_per_s") or 0 for r in members],
                fmt="-o",
                color=f"C{i}",
                capsize=3,
                label=_label(
                    "samples/s, one measurement a point" if one else "samples/s, mean ± std over seeds", fam, analysis
                ),
            )
            mem_ax.plot(
                xs,
                [_peak(r) or math.nan for r in members],
                "-o",
                color=f"C{i}",
                label=_label("peak MB, largest over seeds", fam, analysis),
            )
    _style(rate_ax, title="training throughput (samples/s)", ylabel="samples/s")
    _style(mem_ax, title="peak memory (MB)", ylabel="MB")
    for ax, rows in ((rate_ax, "samples_per_s"), (mem_ax, None)):  # from zero, room above the highest point
        tops = [y for line in ax.get_lines() for y in line.get_ydata() if math.isfinite(y)]
        if rows:
            tops += [
                r.mean(rows) + (r.std(rows) or 0)
                for _, ms in _by_family(analysis)
                for r in ms
                if r.mean(rows) is not None
            ]
        ax.set_ylim(0, 1.15 * max(tops, default=1.0))
    fig.suptitle(f"Throughput and memory: {title(analysis.labels)}", fontsize=10)
    return fig


def noise_figure(analysis: Analysis):
    """B_simple over training beside the best batch and the fitted B_crit; None where not measured."""
    import matplotlib.pyplot as plt

    noisy = [
        r for r in analysis.rows if any(rec.get("noise/b_simple") is not None for p in r.done for rec in p.records)
    ]
    if not noisy:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for row in noisy:
        marks = [
            (rec["samples_seen"], rec["noise/b_simple"])
            for rec in row.done[0].records
            if rec.get("noise/b_simple") is not None
        ]
        ax.plot(
            [m[0] for m in marks],
            [m[1] for m in marks],
            marker="o",
            markersize=3,
            markevery=max(1, len(marks) // 40),
            label=f"{_row_name(row)}, seed {row.done[0].summary.get('seed')}",
        )
    if analysis.best is not None and analysis.best.batch:
        ax.axhline(analysis.best.batch, color="black", linestyle="--", label=f"best batch ({analysis.best.batch})")
    for critical in analysis.critical:
        if critical.b_crit is not None:
            ax.axhline(
                critical.b_crit,
                color="red",
                linestyle=":",
                label=_label(f"B_crit, steps-to-target fit ({critical.b_crit:,.0f})", critical.family, analysis),
            )
    _style(ax, xlabel="samples seen", ylabel="gradient noise scale B_simple (samples)", batch_axis=False)
    _log_y(ax)
    fig.suptitle(f"Gradient noise scale over training: {title(analysis.labels)}", fontsize=10)
    return fig


def grid_figure(analysis: Analysis):
    import matplotlib.pyplot as plt

    found = grid(analysis.rows, analysis.metric)
    if found is None:
        return None
    (key_a, values_a), (key_b, values_b), cells = found
    fig, ax = plt.subplots(figsize=(2.6 + 1.4 * len(values_b), 1.8 + 0.6 * len(values_a)))
    data = [[cells.get((a, b), math.nan) for b in values_b] for a in values_a]
    image = ax.imshow([[100 * v for v in line] for line in data], cmap="viridis", aspect="auto")
    for i, line in enumerate(data):
        for j, value in enumerate(line):
            ax.text(
                j,
                i,
                "-" if math.isnan(value) else f"{100 * value:.2f}",
                ha="center",
                va="center",
                color="white",
                fontsize=8,
            )
    ax.set_xticks(range(len(values_b)), values_b)
    ax.set_yticks(range(len(values_a)), values_a)
    ax.set_xlabel(key_b)
    ax.set_ylabel(key_a)
    ax.set_title(f"{analysis.metric} (%), mean over {_seeds(analysis.labels)}", fontsize=9)
    fig.colorbar(image, ax=ax)
    fig.suptitle(title(analysis.labels), fontsize=8)
    return fig


def _style(
    ax, title: str | None = None, xlabel: str = "batch size", ylabel: str | None = None, batch_axis: bool = True
) -> None:
    """Axes against the batch (log-2 axis labelled 32, 64, ...) or, with batch_axis False, samples."""
    if batch_axis:
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(LogLocator(base=2))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=7)


def _log_y(ax) -> None:
    """A log y axis labelled 1.2, 1.4, ... rather than 1.2 x 10^0; minor labels only within a decade."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    low, high = ax.get_ylim()
    span = high / max(low, 1e-300)
    if 10 <= span < 1000:  # a few decades: 1, 2, 5, 10, 20, 50, ...
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain if span < 10 else NullFormatter())


def batch_figure(records: list[dict[str, Any]], out_dir: Path, name: str = "batch.png") -> str | None:
    """An adaptive run's global batch over training, against the controller's target (c x B_simple,
    c x b0^(1-power) x B_simple^power, or goodput's pick: `adaptive/target`) and the B_simple it
    measured."""
    points = [r for r in records if r.get("batch_size")]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    seen = [r["samples_seen"] for r in points]
    ax.step(seen, [r["batch_size"] for r in points], where="post", marker="o", ms=3, label="global batch")
    for key, style, label in (
        ("adaptive/target", "--", "the controller's target"),
        ("noise/b_simple", ":", "B_simple (measured)"),
    ):
        line = [(r["samples_seen"], r[key]) for r in points if r.get(key)]
        if line:
            ax.plot(*zip(*line), style, marker="x", ms=4, label=label)
    ax.set_ylim(bottom=0)
    _style(
        ax,
        "adaptive batch: the batch over training against the noise scale",
        xlabel="samples seen",
        ylabel="samples",
        batch_axis=False,
    )
    return _save(fig, out_dir, name)


def _save(fig, out_dir: Path, name: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    return name


# ----------------------------------------------------------------------------- W&B


def _logs_to_wandb(logger: dict) -> bool:
    """logger.wandb.enabled (logger=wandb, or a list with it); logger.kind in sweeps made before #46."""
    return bool((logger.get("wandb") or {}).get("enabled")) or logger.get("kind") == "wandb"


def to_wandb(analysis: Analysis, out_dir: Path, names: list[str], group: str) -> str | None:
    """The table and figures as a `report` run in the sweep's W&B group, when the sweep logged to W&B."""
    configs = [p.config for p in analysis.points if p.config]
    node = next((c["logger"] for c in configs if _logs_to_wandb(c.get("logger") or {})), None)
    if node is None:
        return None
    import wandb

    wb = node.get("wandb") or {}
    mode = wb.get("mode") or os.environ.get("WANDB_MODE", "offline")
    run = wandb.init(
        project=wb.get("project", "bsexp"),
        entity=wb.get("entity"),
        group=wb.get("group") or group,
        name="report",
        job_type="report",
        mode=mode,
        dir=str(out_dir),
        settings=wandb.Settings(silent=True),
    )
    rows = table(analysis)
    columns = [*COLUMNS, *EXTRA]
    run.log(
        {
            "report/table": wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows]),
            **{f"report/{Path(n).stem}": wandb.Image(str(out_dir / n)) for n in names},
        }
    )
    run.finish()
    return mode
