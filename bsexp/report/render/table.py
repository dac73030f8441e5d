"""The report's table: one row per configuration, in report.csv's columns and units (accuracies in
%; where a loss picks the best row, its mean and std over seeds as measured, in columns of its own
name; a language model's tokens a step and tokens/s), as report.csv, report.md and the W&B table
give it."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bsexp.report.analysis import Analysis, Reach, Row


def pct(value: float | None) -> float | None:
    return None if value is None else 100 * value


def in_units(analysis: Analysis, value: float | None) -> float | None:
    """A value of the sweep's metric in the report's units: an accuracy in %, a loss as measured."""
    return pct(value) if analysis.higher else value


def _plan(row: Row) -> str | None:
    if not row.done:
        return None
    plan = [row.done[0].summary.get(key) for key in ("micro_size", "accum_steps", "world_size")]
    return None if None in plan else " x ".join(map(str, plan))


def _final_batch(row: Row) -> str | None:
    """Where a batch that changed during training ended (batch=adaptive, scheduled): the range
    over the seeds; None where it stayed."""
    finals = [int(b) for b in row.values("final_batch_size")]
    if not finals or all(b == row.batch for b in finals):
        return None
    return f"{min(finals)}" if min(finals) == max(finals) else f"{min(finals)}-{max(finals)}"


def peak(row: Row) -> float | None:
    values = row.values("peak_memory_mb")
    return max(values) if values else None


# report.csv's columns, in its units; report.md shows the same values.
COLUMNS: dict[str, Callable[[Row], Any]] = {
    "configuration": lambda r: r.configuration,
    "batch": lambda r: r.batch,
    "final_batch": _final_batch,
    "micro x accum x world": _plan,
    "lr": lambda r: r.first("lr"),
    "weight_decay": lambda r: r.first("weight_decay"),
    "val_acc_pct": lambda r: pct(r.mean("val_acc")),
    "val_acc_std_pct": lambda r: pct(r.std("val_acc")),
    "test_acc_pct": lambda r: pct(r.mean("test_acc")),
    "test_acc_std_pct": lambda r: pct(r.std("test_acc")),
    "train_acc_pct": lambda r: pct(r.mean("train_acc")),
    "gen_gap_pct": lambda r: pct(r.mean("gen_gap")),
    "gen_gap_std_pct": lambda r: pct(r.std("gen_gap")),
    "steps": lambda r: r.mean("steps"),
    "wall_time_s": lambda r: r.mean("wall_time_s"),
    "wall_time_std_s": lambda r: r.std("wall_time_s"),
    "samples_per_s": lambda r: r.mean("samples_per_s"),
    "samples_per_s_std": lambda r: r.std("samples_per_s"),
    "peak_memory_mb": peak,
    "seeds": lambda r: f"{len(r.done)}/{len(r.points)}",  # completed / the sweep's
    "seed_list": lambda r: " ".join(map(str, r.seeds)),  # every seed of the row, completed or not
    "status": lambda r: r.status,
}
EXTRA = ("did_not_train", "steps_to_target", "samples_to_target")
# A language model's sweep: its batch and speed in tokens too (a sample is a sequence of data.context)
TOKENS: dict[str, Callable[[Row], Any]] = {
    "tokens_per_step": lambda r: r.first("tokens_per_step"),
    "tokens_per_s": lambda r: r.mean("tokens_per_s"),
}


def counts_tokens(analysis: Analysis) -> bool:
    """Whether the sweep trained a language model (its summaries count tokens)."""
    return any((p.summary or {}).get("tokens_per_step") for p in analysis.points)


def _getters(analysis: Analysis) -> dict[str, Callable[[Row], Any]]:
    """COLUMNS, and where a loss picks the best row (`--metric val_loss`) its mean and std over
    seeds, as measured, after the weight decay (an accuracy's columns are there already)."""
    tokens = TOKENS if counts_tokens(analysis) else {}
    if analysis.higher:
        return {**COLUMNS, **tokens}
    metric, names = analysis.metric, list(COLUMNS)
    at = names.index("weight_decay") + 1
    own = {metric: lambda r: r.mean(metric), f"{metric}_std": lambda r: r.std(metric)}
    return {**{n: COLUMNS[n] for n in names[:at]}, **own, **{n: COLUMNS[n] for n in names[at:]}, **tokens}


def columns(analysis: Analysis) -> list[str]:
    """report.csv's columns (and the W&B table's), in order."""
    return [*_getters(analysis), *EXTRA]


def table(analysis: Analysis) -> list[dict[str, Any]]:
    """One dict per row: report.csv's columns (and the W&B table's)."""
    reached = _reached(analysis)
    out = []
    for row in analysis.rows:
        values = {name: get(row) for name, get in _getters(analysis).items()}
        got = reached.get(id(row))
        values.update(
            did_not_train=row.did_not_train(analysis.metric, analysis.higher),
            steps_to_target=got.steps if got else None,
            samples_to_target=got.samples if got else None,
        )
        out.append(values)
    return out


def _reached(analysis: Analysis) -> dict[int, Reach]:
    return {id(row): got for critical in analysis.critical for row, got in critical.reached}


def write_csv(analysis: Analysis, path: Path) -> None:
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=columns(analysis))
        writer.writeheader()
        for values in table(analysis):
            writer.writerow({k: ("" if v is None else v) for k, v in values.items()})
