"""The whole sweep: its points, rows, best row, breaking points, critical batches and noise scale
as one `Analysis`, and the grid of a sweep that varies two settings (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bsexp.report.analysis.breaking import Breaking, best_row, breaking_point
from bsexp.report.analysis.fit import StepsCritical, steps_critical_batch
from bsexp.report.analysis.noise import NoiseScale, noise_scale
from bsexp.report.analysis.points import Labels, Point, Row, common_settings, families, labels, make_rows
from bsexp.report.analysis.separation import Separation, separate

# What can pick the best row: the accuracies (better higher) and the losses (better lower: nats per
# sample, or per token for a language model; val_bpb: bits per byte of text) that summary.json holds.
# Which way is better the caller says (`higher`), from bsexp.runs.ladder.Ladder(metric).higher.
METRICS = ("val_acc", "test_acc", "val_loss", "test_loss", "val_bpb")


@dataclass(kw_only=True)
class Analysis:
    points: list[Point]
    rows: list[Row]
    common: tuple[str, ...]
    metric: str
    labels: Labels
    best: Row | None  # the best mean: the highest, or the lowest where `higher` is false
    separation: Separation  # whether the seeds tell it apart from the other rows
    breaking: list[Breaking]
    critical: list[StepsCritical]  # one per family of more than one batch
    noise: NoiseScale
    tolerance: float | None = None  # as given, in the metric's units
    higher: bool = True  # the metric is better higher (an accuracy) or lower (a loss)

    @property
    def experiments(self) -> list[str]:
        return sorted({o.split("=", 1)[1] for p in self.points for o in p.overrides if o.startswith("experiment=")})

    @property
    def starred(self) -> Row | None:
        """The best row where its seeds tell it apart from every other row, else None."""
        return self.best if self.separation.separated else None

    @property
    def varies_configuration(self) -> bool:
        """Whether any row has a configuration besides its batch (else that column says nothing)."""
        return any(r.configuration for r in self.rows)


def analyse(
    points: Sequence[Point],
    metric: str = "val_acc",
    tolerance: float | None = None,
    target: float | None = None,
    higher: bool = True,
) -> Analysis:
    """The sweep's `Analysis` by `metric`: better higher (an accuracy) or, where `higher` is false,
    lower (a loss: the best row the lowest mean, a target reached at or below it, `tolerance` in
    the loss's units)."""
    points = list(points)
    rows = make_rows(points)
    groups = families(rows)
    breaking = [b for b in (breaking_point(m, metric, tolerance, higher) for m in groups.values()) if b is not None]
    critical = [
        steps_critical_batch(m, metric, target, higher) for m in groups.values() if len({r.batch for r in m}) > 1
    ]
    return Analysis(
        points=points,
        rows=rows,
        common=common_settings(points),
        metric=metric,
        labels=labels(rows),
        best=best_row(rows, metric, higher),
        separation=separate(rows, metric, higher),
        breaking=breaking,
        critical=critical,
        noise=noise_scale(points),
        tolerance=tolerance,
        higher=higher,
    )


def grid(rows: Sequence[Row], metric: str):
    """When the rows vary in exactly two settings: ((key_a, values_a), (key_b, values_b), {(a, b): mean})."""
    scored = [r for r in rows if r.mean(metric) is not None]
    settings = [dict(o.split("=", 1) for o in r.setting) for r in scored]
    keys = sorted({k for s in settings for k in s})
    varying = [k for k in keys if len({s.get(k) for s in settings}) > 1]
    if len(varying) != 2:
        return None
    a, b = varying
    values_a = sorted({s.get(a) for s in settings}, key=str)
    values_b = sorted({s.get(b) for s in settings}, key=str)
    cells = {(s.get(a), s.get(b)): r.mean(metric) for s, r in zip(settings, scored)}
    return (a, values_a), (b, values_b), cells
