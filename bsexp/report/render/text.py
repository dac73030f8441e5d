"""report.md: the sweep's table, then what it found in words (rows that did not train, the best
row, each family's breaking point and critical batch, the noise scale), the points that did not
complete and the figures. Accuracies and the gap in %, as in report.csv; where a loss picks the best
row (`--metric val_loss`), the loss as measured, in a column of its own, better lower."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from bsexp.report.analysis import SIGNIFICANCE, TOLERANCE_SE, TRAINED_ABOVE, Analysis, Breaking, Row, StepsCritical
from bsexp.report.render.names import by_family, family_note, row_name, seed_count, title
from bsexp.report.render.table import in_units, pct, table

# report.md's columns, beside report.csv's (render.table.COLUMNS); "configuration" only where a row has one.
HEADERS = (
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
)


def markdown(analysis: Analysis, dirs: list[Path], figures: list[str]) -> str:
    values = table(analysis)
    lines = [
        *_heading(analysis, dirs),
        *_table_lines(analysis, values),
        *_notes(analysis, values),
        *_training_lines(analysis),
        *_finding_lines(analysis),
    ]
    lines += _not_completed_lines(analysis)
    if figures:
        lines += ["", "## Figures", ""] + [f"![{name}]({name})" for name in figures]
    return "\n".join(lines) + "\n"


def _heading(analysis: Analysis, dirs: list[Path]) -> list[str]:
    """The sweep's directories, its data, model, epochs and seeds, and what every point shares."""
    experiments, metric = analysis.experiments, analysis.metric
    done = sum(p.done for p in analysis.points)
    loss = "" if analysis.higher else f", {metric} as measured (lower is better)"
    best = f"the best by mean {metric}" if analysis.higher else f"the best, the lowest mean {metric},"
    return [
        f"# Batch-size sweep: {', '.join(str(d) for d in dirs)}",
        "",
        f"{title(analysis.labels)}. "
        + ("" if analysis.labels.complete else f"{done} of the sweep's {len(analysis.points)} points completed. ")
        + (f"Experiment: {', '.join(experiments)} (conf/experiment/). " if experiments else "")
        + f"Every point: {', '.join(f'`{o}`' for o in analysis.common) or 'no other overrides'}. "
        f"Accuracies and the gap in %{loss}, mean ± std over the seeds of a row ({seed_count(analysis.labels)}); "
        f"{best} marked ★ where its seeds tell it apart from every other row "
        f"(Welch's t-test, two-sided, {100 * SIGNIFICANCE:g} %).",
        "",
    ]


def _table_lines(analysis: Analysis, values: list[dict[str, Any]]) -> list[str]:
    show_config = analysis.varies_configuration
    headers = ["", *(["configuration"] if show_config else []), *_headers(analysis)]
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    for row, v in zip(analysis.rows, values):
        lines.append("| " + " | ".join(_cells(row, v, analysis, show_config)) + " |")
    lines.append("")
    return lines


def _headers(analysis: Analysis) -> tuple[str, ...]:
    """HEADERS, and a loss's own column after the weight decay where a loss picks the best row."""
    if analysis.higher:
        return HEADERS
    at = HEADERS.index("wd") + 1
    return (*HEADERS[:at], analysis.metric.replace("_", " "), *HEADERS[at:])


def _cells(row: Row, v: dict[str, Any], analysis: Analysis, show_config: bool) -> list[str]:
    """One row of the table: `v` is its row of report.csv (`table`)."""
    status = v["status"] + (", **did not train**" if v["did_not_train"] else "")
    metric = analysis.metric
    return [
        "★" if row is analysis.starred else "",
        *([v["configuration"] or "-"] if show_config else []),
        _num(v["batch"], "d")
        + (f" → {v['final_batch']}" if v["final_batch"] else "")
        + (f" ({v['tokens_per_step']:,} tokens)" if v.get("tokens_per_step") else ""),
        v["micro x accum x world"] or "-",
        _num(v["lr"], ".4g"),
        _num(v["weight_decay"], ".3g"),
        *([] if analysis.higher else [_mean_std(v[metric], v[f"{metric}_std"], LOSS)]),
        _mean_std(v["val_acc_pct"], v["val_acc_std_pct"]),
        _mean_std(v["test_acc_pct"], v["test_acc_std_pct"]),
        _num(v["train_acc_pct"], ".2f"),
        _mean_std(v["gen_gap_pct"], v["gen_gap_std_pct"]),
        _num(v["steps"], ".0f"),
        _spread(v["wall_time_s"], v["wall_time_std_s"], ".1f"),
        _spread(v["samples_per_s"], v["samples_per_s_std"], ",.0f")
        + (f" ({v['tokens_per_s']:,.0f} tokens/s)" if v.get("tokens_per_s") else ""),
        _num(v["peak_memory_mb"], ",.0f"),
        v["seeds"] + (f" ({v['seed_list'].replace(' ', ', ')})" if v["seed_list"] else ""),
        status,
    ]


def _notes(analysis: Analysis, values: list[dict[str, Any]]) -> list[str]:
    """What the table's columns mean where it is not plain: a batch that changed, the timings' spread."""
    lines = []
    if any(v["final_batch"] for v in values):
        lines += [
            (
                "Batch a → b: the batch changed in training, from a to b (over the seeds); micro-batch, lr and "
                "wd are the first batch's."
            ),
            "",
        ]
    if all(len(r.values("wall_time_s")) <= 1 for r in analysis.rows):
        one, more = (
            ("one seed each", "sweep seed=0,1,2 for one")
            if analysis.labels.grid_per_row[1] <= 1
            else ("one seed of each row completed", "the sweep's other seeds did not complete (continue it: below)")
        )
        lines += [
            f"Wall time and samples/s: one measurement a point ({one}), with no spread to tell a real difference "
            f"from the machine's load; {more}.",
            "",
        ]
    else:
        lines += ["Wall time and samples/s: mean ± std over the seeds of a row.", ""]
    return lines


def _training_lines(analysis: Analysis) -> list[str]:
    """The rows that did not train, and those that did not fit the training set (under-trained)."""
    metric, lines = analysis.metric, []
    untrained = [r for r in analysis.rows if r.did_not_train(metric, analysis.higher)]
    if untrained:
        chance = untrained[0].chance
        lines.append(
            f"**Did not train**: {', '.join(row_name(r) for r in untrained)}: mean {metric} below "
            f"{100 * (chance + TRAINED_ABOVE * (1 - chance)):.2f} % (chance, {100 * chance:.2f} %, plus "
            f"{TRAINED_ABOVE:g} of the way from chance to 100 %)."
        )
    for _, members in by_family(analysis):
        low = [r for r in members if not r.did_not_train(metric, analysis.higher) and r.under_trained(members)]
        top = max(members, key=lambda r: r.mean("train_acc") if r.mean("train_acc") is not None else -1.0)
        for row in low:
            lines.append(
                f"**Under-trained**: {row_name(row)}, train acc {pct(row.mean('train_acc')):.2f} %, "
                f"{100 * (top.mean('train_acc') - row.mean('train_acc')):.1f} points below "
                f"{row_name(top)}'s: its gap is small because it did not fit the training set, not "
                f"because it generalises better (train longer, or raise its LR)."
            )
    return lines


def _finding_lines(analysis: Analysis) -> list[str]:
    """The best row, each family's breaking point and critical batch, and the noise scale."""
    lines = [_best_line(analysis)] if analysis.best is not None else []
    for breaking in analysis.breaking:
        lines.append(_breaking_line(breaking, analysis))
    if analysis.critical:
        for critical in analysis.critical:
            lines += _critical_lines(critical, analysis)
        lines.append(_noise_line(analysis))
    elif analysis.noise.b_simple is not None:
        lines.append(_noise_line(analysis))
    return lines


def _best_line(analysis: Analysis) -> str:
    """The best row, and whether its seeds tell it apart from the others (else which they cannot)."""
    metric, separation = analysis.metric, analysis.separation
    best = separation.best
    n = len(best.values(metric))
    figure = f"{metric} {_measured(analysis, best.mean(metric), best.std(metric))} ({n} seed{'s' if n != 1 else ''})"
    test = f"Welch's t-test on the seeds, two-sided, {100 * SIGNIFICANCE:g} %"
    if not separation.against:
        return f"**Best**: none starred: {row_name(best)}, {figure}, is the only row with a {metric}."
    if separation.separated:
        worst = max(a.p for a in separation.against)
        return (
            f"**Best**: {row_name(best)}, {figure}: its seeds tell it apart from every other row "
            f"({test}; p ≤ {worst:.2g})."
        )
    tied = ", ".join(
        f"{row_name(a.row)} ({'one seed each: no spread to test by' if a.p is None else f'p = {a.p:.2g}'})"
        for a in separation.tied
    )
    return (
        f"**Best**: none starred: {row_name(best)} has the {'highest' if analysis.higher else 'lowest'} mean, "
        f"{figure}, but its seeds do not tell it "
        f"apart from {tied} ({test}); more seeds would narrow the difference."
    )


def _not_completed_lines(analysis: Analysis) -> list[str]:
    """Every point that did not complete, in the table's order (batch, then seed), with the command
    that continues its sweep."""
    failed = [
        (row, p)
        for row in analysis.rows
        for p in sorted(row.points, key=lambda p: (p.seed is None, p.seed or 0, p.name))
        if p.status != "completed"
    ]
    if not failed:
        return []
    lines = ["", "## Points that did not complete", ""]
    lines += [f"- `{p.name}`: {p.status}" + (f" ({p.error})" if p.error else "") for _, p in failed]
    sweeps = sorted({str(p.dir.parent.resolve()) for _, p in failed if p.dir is not None and p.status in CONTINUED})
    if sweeps:
        lines += ["", "Continue the sweep where it stopped (completed points are not run again):", "", "```bash"]
        lines += [f"python -m bsexp.train -m resume=auto {shlex.quote(f'hydra.sweep.dir={d}')}" for d in sweeps]
        lines += ["```"]
    return lines


# Points that continuing their sweep (resume=auto) runs: never started, failed, or cut off.
CONTINUED = ("missing", "failed", "preempted")


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _spread(mean: float | None, std: float | None, fmt: str) -> str:
    return _num(mean, fmt) + (f" ± {format(std, fmt)}" if std is not None else "")


# A loss's decimals in report.md (nats or bits per byte: a difference of 0.001 can matter), as the
# run's own summary prints it; accuracies get two decimals of a per cent.
LOSS = ".4f"


def _mean_std(mean: float | None, std: float | None, fmt: str = ".2f") -> str:
    if mean is None:
        return "-"
    return f"{mean:{fmt}} ± {std:{fmt}}" if std is not None else f"{mean:{fmt}}"


def _measured(analysis: Analysis, mean: float | None, std: float | None) -> str:
    """A mean ± std of the sweep's metric with its unit: an accuracy's in %, a loss's as measured."""
    if analysis.higher:
        return f"{_mean_std(pct(mean), pct(std))} %"
    return _mean_std(mean, std, LOSS)


def _at(analysis: Analysis, value: float) -> str:
    """One value of the sweep's metric: "98.00 %", or "val_loss 1.2345"."""
    return f"{pct(value):.2f} %" if analysis.higher else f"{analysis.metric} {value:{LOSS}}"


def _tolerance(breaking: Breaking, analysis: Analysis) -> str:
    how = "--tolerance" if breaking.given else f"{TOLERANCE_SE:g} standard errors of the difference of the two means"
    if analysis.higher:
        return f"{100 * breaking.tolerance:.2f} points: {how}"
    return f"{breaking.tolerance:{LOSS}} in {analysis.metric}: {how}"


def _breaking_line(b: Breaking, analysis: Analysis) -> str:
    metric, head = analysis.metric, f"**Breaking point**{family_note(b.family, analysis)}"
    if b.refused:
        return f"{head}: not judged: {b.refused}."
    best = f"the best, batch {b.best.batch}, at {_at(analysis, b.best.mean(metric))}"
    if b.row is None:
        if b.best is b.members[-1]:
            return f"{head}: none within the swept range: {best}, is the largest batch swept."
        return (
            f"{head}: none within the swept range: every batch up to {b.members[-1].batch} stayed within the "
            f"tolerance ({_tolerance(b, analysis)}) of {best}."
        )
    held = f"; up to batch {b.held.batch} it held" if b.held is not b.best else ""
    value = in_units(analysis, b.row.mean(metric))
    moved = f"({value:.2f} %) falls" if analysis.higher else f"({value:{LOSS}}) rises"
    line = (
        f"{head}: batch {b.row.batch}, the first batch above {best}, whose {metric} "
        f"{moved} more than the tolerance ({_tolerance(b, analysis)}) {'below' if analysis.higher else 'above'} "
        f"it{held}."
    )
    if b.best_is_smallest:
        flat = "accuracy" if analysis.higher else metric
        line += f" The best is the smallest batch swept: {flat} may be flat only below it."
    return line


def _critical_lines(c: StepsCritical, analysis: Analysis) -> list[str]:
    head = f"**Critical batch**{family_note(c.family, analysis)}"
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
        f"steps S and samples E each batch took to reach {_target(analysis, target.value)} ({target.rule}), "
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


def _target(analysis: Analysis, value: float) -> str:
    """A steps-to-target target with the side it is reached from: "val_acc >= 80.00 %", "val_loss <= 1.3000"."""
    if analysis.higher:
        return f"{analysis.metric} >= {100 * value:.2f} %"
    return f"{analysis.metric} <= {value:{LOSS}}"


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
