"""The sweep's figures: accuracy and gap, validation loss, throughput and memory against the batch
(or a bar per configuration, where no configuration ran at more than one batch), the noise scale
over training, and the grid of a sweep of two settings. Accuracies and the gap in %. Where a loss
picks the best row (`--metric val_loss`), the first figure draws that loss against the batch, as
measured, beside the gap: `<metric>_by_batch.png` in place of `accuracy.png`."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from bsexp.report.analysis import Analysis, Row, grid
from bsexp.report.render.axes import log_y, save_figure, style_axes
from bsexp.report.render.names import best_label, by_family, family_label, row_name, seed_count, title
from bsexp.report.render.table import in_units, pct, peak


def figures(analysis: Analysis, out_dir: Path) -> list[str]:
    """The PNGs a person would rather look at than read; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    if not any(r.done for r in analysis.rows):
        return []
    first = "accuracy.png" if analysis.higher else f"{analysis.metric}_by_batch.png"
    written = [
        save_figure(accuracy_figure(analysis), out_dir, first),
        save_figure(val_loss_figure(analysis), out_dir, "val_loss.png"),
        save_figure(throughput_memory_figure(analysis), out_dir, "throughput_memory.png"),
    ]
    for name, make in (("noise_scale.png", noise_figure), ("grid.png", grid_figure)):
        fig = make(analysis)
        if fig is not None:
            written.append(save_figure(fig, out_dir, name))
    return written


def accuracy_figure(analysis: Analysis):
    """Accuracy (or the loss that picks the best row) and generalisation gap against batch: mean ±
    std over seeds, the best batch starred, each family's breaking point a dashed line, chance level
    dotted (an accuracy's)."""
    import matplotlib.pyplot as plt

    if not varies_batch(analysis):
        return _by_configuration_figure(analysis)
    fig, (acc_ax, gap_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, (fam, members) in enumerate(by_family(analysis)):
        _accuracy_lines(acc_ax, f"C{i}", fam, members, analysis)
        _gap_lines(gap_ax, f"C{i}", fam, members, analysis)
    _best_and_breaking(acc_ax, analysis)
    _accuracy_axis(acc_ax, analysis)
    bars = f"mean ± std over {seed_count(analysis.labels)}"
    if analysis.higher:
        style_axes(acc_ax, title=f"accuracy (%), {bars}", ylabel="accuracy (%)")
    else:
        style_axes(acc_ax, title=f"{analysis.metric} (lower is better), {bars}", ylabel=analysis.metric)
    style_axes(gap_ax, title=f"generalisation gap, train - val (%), {bars}", ylabel="points of accuracy")
    head = "Accuracy" if analysis.higher else analysis.metric
    fig.suptitle(f"{head} against batch size: {title(analysis.labels)}", fontsize=10)
    return fig


# The metric drawn beside the one that picks the best: test beside val, val beside test.
_OTHER = {"val_acc": "test_acc", "test_acc": "val_acc", "val_loss": "test_loss", "test_loss": "val_loss"}


def _accuracy_lines(acc_ax, color: str, fam: tuple[str, ...], members: list[Row], analysis: Analysis) -> None:
    """One family's accuracies (or losses) against its batches: the metric solid, the other dashed."""
    xs = [r.batch for r in members]
    scale = 100 if analysis.higher else 1  # an accuracy in %, a loss as measured
    for key, fmt, alpha in ((analysis.metric, "-o", 1.0), (_OTHER.get(analysis.metric), "--s", 0.6)):
        if key is not None and all(r.mean(key) is not None for r in members):
            acc_ax.errorbar(
                xs,
                [scale * r.mean(key) for r in members],
                yerr=[scale * (r.std(key) or 0) for r in members],
                fmt=fmt,
                color=color,
                alpha=alpha,
                capsize=3,
                label=family_label(key, fam, analysis),
            )


def _gap_lines(gap_ax, color: str, fam: tuple[str, ...], members: list[Row], analysis: Analysis) -> None:
    """One family's generalisation gap against its batches, its under-trained rows circled in red."""
    if not all(r.mean("gen_gap") is not None for r in members):
        return
    gap_ax.errorbar(
        [r.batch for r in members],
        [100 * r.mean("gen_gap") for r in members],
        yerr=[100 * (r.std("gen_gap") or 0) for r in members],
        fmt="-o",
        color=color,
        capsize=3,
        label=family_label("train_acc - val_acc", fam, analysis),
    )
    low = [r for r in members if r.under_trained(members) and not r.did_not_train(analysis.metric, analysis.higher)]
    if low:  # a small gap there is a training set not fitted, not better generalisation
        gap_ax.plot(
            [r.batch for r in low],
            [100 * r.mean("gen_gap") for r in low],
            "o",
            markersize=13,
            markerfacecolor="none",
            markeredgecolor="red",
            zorder=4,
            label=family_label("under-trained (train acc far below the best)", fam, analysis),
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


def _best_and_breaking(acc_ax, analysis: Analysis) -> None:
    """The best batch starred (ringed grey where its seeds do not tell it apart from the others); each
    family's breaking point a dashed line (or, in the legend, none)."""
    best = analysis.best
    if best is not None:  # an outline around the point, which stays visible inside it
        acc_ax.plot(
            [best.batch],
            [in_units(analysis, best.mean(analysis.metric))],
            marker="*" if analysis.starred else "o",
            markersize=22 if analysis.starred else 14,
            markerfacecolor="none",
            markeredgecolor="goldenrod" if analysis.starred else "grey",
            markeredgewidth=1.5,
            linestyle="none",
            zorder=5,
            label=best_label(analysis),
        )
    colors = {fam: f"C{i}" for i, (fam, _) in enumerate(by_family(analysis))}
    for breaking in analysis.breaking:
        if breaking.row is not None:  # red where the sweep has one family, else the family's colour
            color = "red" if len(colors) == 1 else colors.get(breaking.family, "red")
            acc_ax.axvline(
                breaking.row.batch,
                color=color,
                linestyle="--",
                alpha=0.7,
                label=family_label(f"breaking point: batch {breaking.row.batch}", breaking.family, analysis),
            )
        elif not breaking.refused:
            acc_ax.plot(
                [],
                [],
                " ",
                label=family_label("breaking point: none within the swept range", breaking.family, analysis),
            )


def _accuracy_axis(acc_ax, analysis: Analysis) -> None:
    """The accuracy axis over the rows that trained; those that did not, marked at its foot; chance
    dotted. A loss's axis: over its rows, as measured."""
    metric = analysis.metric
    if not analysis.higher:
        acc_ax.set_ylim(*_loss_range(analysis, tuple(k for k in (metric, _OTHER.get(metric)) if k)))
        return
    low, high = _accuracy_range(analysis, (metric, _OTHER[metric]))
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


def _accuracy_range(analysis: Analysis, keys: tuple[str, ...]) -> tuple[float, float]:
    """The accuracy axis (in %) over the rows that trained, each mean ± std, with a margin; the
    whole 0-100 only where no row trained."""
    trained = [r for r in analysis.rows if r.batch and r.done and not r.did_not_train(analysis.metric)]
    values = [100 * v for v in _spread(trained, keys)]
    if not values:
        return 0.0, 100.0
    low, high = min(values), max(values)
    margin = max(0.5, 0.15 * (high - low))
    return max(0.0, low - margin), min(100.0, high + margin)


def _loss_range(analysis: Analysis, keys: tuple[str, ...]) -> tuple[float, float]:
    """A loss's axis over the rows, each mean ± std, with a margin (from 0 where it would go below)."""
    values = _spread([r for r in analysis.rows if r.batch and r.done], keys)
    if not values:
        return 0.0, 1.0
    low, high = min(values), max(values)
    margin = max(0.15 * (high - low), 0.01 * high, 1e-3)
    return max(0.0, low - margin), high + margin


def _spread(rows, keys: tuple[str, ...]) -> list[float]:
    """Each row's mean ± std of each of `keys` it has: the ends an axis must show."""
    return [r.mean(k) + sign * (r.std(k) or 0) for r in rows for k in keys if r.mean(k) is not None for sign in (-1, 1)]


def varies_batch(analysis: Analysis) -> bool:
    return any(len(members) > 1 for _, members in by_family(analysis))


def _by_configuration_figure(analysis: Analysis, throughput: bool = False):
    """Where no configuration was run at more than one batch (a grid at one batch), a bar per row:
    accuracy and gap (mean ± std over seeds), or throughput and peak memory."""
    import matplotlib.pyplot as plt

    rows = [r for r in analysis.rows if r.done]
    names = [row_name(r) if not r.configuration else f"{r.configuration} (batch {r.batch})" for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(13, 1.6 + 0.35 * len(rows)), sharey=True)
    ys = list(range(len(rows)))
    for ax, values, errors, name in _configuration_panels(axes, rows, analysis, throughput):
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
        _best_and_chance_bars(axes[0], rows, analysis)
    what = "Throughput and memory" if throughput else "Accuracy"
    fig.suptitle(f"{what} by configuration: {title(analysis.labels)}", fontsize=10)
    return fig


def _configuration_panels(axes, rows: list[Row], analysis: Analysis, throughput: bool):
    """(axes, values, error bars or None, title) of the two panels: throughput and peak memory, or
    the metric and the gap (in %)."""
    if throughput:
        return (
            (axes[0], [r.mean("samples_per_s") for r in rows], None, "training throughput (samples/s)"),
            (axes[1], [peak(r) for r in rows], None, "peak memory (MB), largest over seeds"),
        )
    metric, bars = analysis.metric, f"mean ± std over {seed_count(analysis.labels)}"
    unit = "(%)" if analysis.higher else "(lower is better)"
    return (
        (
            axes[0],
            [in_units(analysis, r.mean(metric)) for r in rows],
            [in_units(analysis, r.std(metric)) for r in rows],
            f"{metric} {unit}, {bars}",
        ),
        (
            axes[1],
            [pct(r.mean("gen_gap")) for r in rows],
            [pct(r.std("gen_gap")) for r in rows],
            f"generalisation gap, train - val (%), {bars}",
        ),
    )


def _best_and_chance_bars(ax, rows: list[Row], analysis: Analysis) -> None:
    """The best row starred on its bar (ringed where its seeds do not tell it apart), chance level dotted."""
    best = analysis.best
    if best is not None and best in rows:
        ax.plot(
            [in_units(analysis, best.mean(analysis.metric))],
            [rows.index(best)],
            marker="*" if analysis.starred else "o",
            markersize=16 if analysis.starred else 10,
            color="gold" if analysis.starred else "none",
            markeredgecolor="black",
            linestyle="none",
            label=best_label(analysis),
        )
    chance = next((r.chance for r in rows if r.chance is not None), None) if analysis.higher else None
    if chance is not None:
        ax.axvline(100 * chance, color="grey", linestyle=":", label=f"chance ({100 * chance:.0f} %)")
    ax.legend(fontsize=7, loc="best")


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
        ax.plot(xs, ys, marker="o", markersize=4 if n <= 40 else 2, markevery=max(1, n // 40), label=row_name(row))
    style_axes(
        ax, xlabel="samples seen", ylabel=f"validation loss, mean over {seed_count(analysis.labels)}", batch_axis=False
    )
    log_y(ax)
    fig.suptitle(f"Validation loss: {title(analysis.labels)}", fontsize=10)
    return fig


def throughput_memory_figure(analysis: Analysis):
    import matplotlib.pyplot as plt

    if not varies_batch(analysis):
        return _by_configuration_figure(analysis, throughput=True)
    fig, (rate_ax, mem_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (fam, members) in enumerate(by_family(analysis)):
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
                label=family_label(
                    "samples/s, one measurement a point" if one else "samples/s, mean ± std over seeds", fam, analysis
                ),
            )
            mem_ax.plot(
                xs,
                [peak(r) or math.nan for r in members],
                "-o",
                color=f"C{i}",
                label=family_label("peak MB, largest over seeds", fam, analysis),
            )
    style_axes(rate_ax, title="training throughput (samples/s)", ylabel="samples/s")
    style_axes(mem_ax, title="peak memory (MB)", ylabel="MB")
    for ax, rows in ((rate_ax, "samples_per_s"), (mem_ax, None)):  # from zero, room above the highest point
        tops = [y for line in ax.get_lines() for y in line.get_ydata() if math.isfinite(y)]
        if rows:
            tops += [
                r.mean(rows) + (r.std(rows) or 0)
                for _, ms in by_family(analysis)
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
            label=f"{row_name(row)}, seed {row.done[0].summary.get('seed')}",
        )
    if analysis.best is not None and analysis.best.batch:
        what = "best batch" if analysis.starred else f"batch of the {'highest' if analysis.higher else 'lowest'} mean"
        ax.axhline(analysis.best.batch, color="black", linestyle="--", label=f"{what} ({analysis.best.batch})")
    for critical in analysis.critical:
        if critical.b_crit is not None:
            ax.axhline(
                critical.b_crit,
                color="red",
                linestyle=":",
                label=family_label(f"B_crit, steps-to-target fit ({critical.b_crit:,.0f})", critical.family, analysis),
            )
    style_axes(ax, xlabel="samples seen", ylabel="gradient noise scale B_simple (samples)", batch_axis=False)
    log_y(ax)
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
    scale, fmt = (100, ".2f") if analysis.higher else (1, ".4f")  # an accuracy in %, a loss as measured
    image = ax.imshow([[scale * v for v in line] for line in data], cmap="viridis", aspect="auto")
    for i, line in enumerate(data):
        for j, value in enumerate(line):
            ax.text(
                j,
                i,
                "-" if math.isnan(value) else f"{scale * value:{fmt}}",
                ha="center",
                va="center",
                color="white",
                fontsize=8,
            )
    ax.set_xticks(range(len(values_b)), values_b)
    ax.set_yticks(range(len(values_a)), values_a)
    ax.set_xlabel(key_b)
    ax.set_ylabel(key_a)
    unit = "(%)" if analysis.higher else "(lower is better)"
    ax.set_title(f"{analysis.metric} {unit}, mean over {seed_count(analysis.labels)}", fontsize=9)
    fig.colorbar(image, ax=ax)
    fig.suptitle(title(analysis.labels), fontsize=8)
    return fig
