"""An `Analysis` as people read it: report.md, report.csv, figures (PNG) and a W&B `report` run.

Nothing here decides what the sweep found; it only shows it. Accuracies and the gap are in %
in report.md, report.csv and the figures alike. `table` (report.csv's rows and columns), `text`
(report.md), `plots` (the sweep's figures), `axes` (how every figure draws its axes, and an adaptive
run's batch figure), `names` (how the sweep, a row and a family are named in all of them) and
`wandb_run` (the W&B `report` run).
"""

from bsexp.report.render.axes import batch_figure
from bsexp.report.render.names import title
from bsexp.report.render.plots import (
    accuracy_figure,
    figures,
    grid_figure,
    noise_figure,
    throughput_memory_figure,
    val_loss_figure,
)
from bsexp.report.render.table import COLUMNS, EXTRA, table, write_csv
from bsexp.report.render.text import markdown
from bsexp.report.render.wandb_run import to_wandb

__all__ = [
    "COLUMNS",
    "EXTRA",
    "accuracy_figure",
    "batch_figure",
    "figures",
    "grid_figure",
    "markdown",
    "noise_figure",
    "table",
    "throughput_memory_figure",
    "title",
    "to_wandb",
    "val_loss_figure",
    "write_csv",
]
