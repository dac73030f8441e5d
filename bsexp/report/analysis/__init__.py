"""What a batch-size sweep found, as plain data: pure (no matplotlib, no wandb, no torch, no files).

    points (one per job) -> rows (the seeds of one configuration) -> families (rows that differ
    by batch only) -> the best row, each family's breaking point, the steps each row needed to
    reach a target, each family's critical-batch fit, the gradient noise scale the runs measured.

`points` (points, rows, families), `breaking` (the best row, the breaking point), `separation`
(whether the seeds tell the best row apart from the others), `steps` (steps to a target), `fit`
(the critical batch fitted to them, McCandlish et al. 2018, and the schedule bound), `noise` (the
noise scale) and `sweep` (all of it as one `Analysis`). `render` turns an
`Analysis` into report.md, report.csv, figures and a W&B run; `load` reads points from disk.
Accuracies are fractions here, losses as measured (nats, or bits per byte); rendering decides the
units. A metric is better higher (an accuracy) or lower (a loss: `METRICS` holds both kinds); each
function takes `higher`, which the command line reads from `bsexp.runs.ladder.Ladder(metric).higher`
(this package imports nothing outside the standard library).

The pieces compose for later tables without restructuring: a Pareto front (per arm: steps to a
target, `reach_row`, against the final accuracy, `Row.mean`) and the critical batch over training
(`steps_critical_batch` of one family at a rising list of targets).
"""

from bsexp.report.analysis.breaking import TOLERANCE_SE, Breaking, best_row, breaking_point, difference_se, worse_by
from bsexp.report.analysis.fit import (
    Fit,
    ScheduleBound,
    StepsCritical,
    first_evaluation_bounds,
    fit_critical_batch,
    fit_steps_samples,
    schedule_bound,
    steps_critical_batch,
)
from bsexp.report.analysis.noise import NoiseScale, noise_scale
from bsexp.report.analysis.points import (
    KNOWN_CLASSES,
    TRAINED_ABOVE,
    UNDER_TRAINED,
    Labels,
    Point,
    Row,
    common_settings,
    families,
    labels,
    make_rows,
)
from bsexp.report.analysis.separation import SIGNIFICANCE, Apart, Separation, separate, welch_p
from bsexp.report.analysis.sweep import METRICS, Analysis, analyse, grid
from bsexp.report.analysis.to_target import (
    FAILED_SEED_BY,
    TARGET_BY,
    Reach,
    Target,
    choose_target,
    reach,
    reach_row,
    shown,
    target_rule,
)

__all__ = [
    "FAILED_SEED_BY",
    "KNOWN_CLASSES",
    "METRICS",
    "SIGNIFICANCE",
    "TARGET_BY",
    "TOLERANCE_SE",
    "TRAINED_ABOVE",
    "UNDER_TRAINED",
    "Analysis",
    "Apart",
    "Breaking",
    "Fit",
    "Labels",
    "NoiseScale",
    "Point",
    "Reach",
    "Row",
    "ScheduleBound",
    "Separation",
    "StepsCritical",
    "Target",
    "analyse",
    "best_row",
    "breaking_point",
    "choose_target",
    "common_settings",
    "difference_se",
    "families",
    "first_evaluation_bounds",
    "fit_critical_batch",
    "fit_steps_samples",
    "grid",
    "labels",
    "make_rows",
    "noise_scale",
    "reach",
    "reach_row",
    "schedule_bound",
    "separate",
    "shown",
    "steps_critical_batch",
    "target_rule",
    "welch_p",
    "worse_by",
]
