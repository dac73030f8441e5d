"""`python -m bsexp.report DIR [DIR ...]`: what a batch-size sweep found, as a table and figures.

Reads every point of the sweeps in DIR (its `.hydra/`, `summary.json`, `metrics.jsonl` and the
sweep's `jobs.jsonl`), groups the points that differ only by seed into one row, and writes next
to the first DIR:

- `report.md` and `report.csv`: one row per configuration of the sweep's grid, in batch order (a
  row never started shows its batch and seeds), accuracies in % as mean ± std over seeds, rows at
  chance level flagged "did not train", the best row marked where its seeds tell it apart from
  every other row (Welch's t-test, 5 %; else the rows it cannot separate are named), and per
  family of rows that differ by batch only, the breaking point: the first batch above the best whose mean
  falls more than the tolerance below the best's (2 standard errors of the difference, or
  `--tolerance`), or "none within the swept range";
- the critical batch B_crit = E_min / S_min, the fit of (S/S_min - 1)(E/E_min - 1) = 1
  (McCandlish et al. 2018) to the steps and samples each batch actually took to reach a target
  accuracy (default: the highest every point reached within the first half of its training
  samples), refused with its reason for fewer than 3 batch sizes or a degenerate fit; beside it
  the gradient noise scale B_simple the runs measured, or why they did not;
- by a loss (`--metric val_loss`, `test_loss` or `val_bpb`: better lower), the best row is the
  lowest mean, the breaking point a loss that rises past the tolerance (in the loss's units), a
  target a loss reached at or below it (default: the lowest every point reached within the first
  half of its training samples), the loss in a column of its own and `<metric>_by_batch.png` in
  place of `accuracy.png`;
- `accuracy.png`, `val_loss.png`, `throughput_memory.png`, `noise_scale.png` (B_simple over
  training, where the runs measured it) and `grid.png` when the sweep varies two settings besides
  the batch (`experiment=scaling_rules`).

With W&B enabled in the sweep, the table and figures also go to a `report` run of its group.
Failed, diverged and missing points are listed as such, with the command that continues the sweep.

The report's three commands share one shape: load (points from disk), analyse (pure: no plotting,
no files, no wandb, no torch; tested alone), render (markdown, CSV, figures, W&B), and a command
line that calls the three in turn:

- `python -m bsexp.report` (this package): `load`, `analysis/`, `render/`, `cli`;
- `python -m bsexp.report.critical`, the critical batch measured by branches (Merrill et al.):
  `critical/` with its own `load`, `analysis`, `render` and `cli`;
- `python -m bsexp.report.pareto`, arms against tuned fixed batches: `pareto/` with its own
  `analysis`, `render` and `cli`, its points read by `load` as this package reads them.

Two critical batches, kept apart by name: `StepsCritical` (`analysis.fit`), fitted to the steps
each batch of a sweep took to a target (McCandlish et al.), and `BranchedCritical`
(`critical.analysis`), measured by branches from one trunk (Merrill et al.).
"""

from bsexp.report.analysis import fit_critical_batch

__all__ = ["fit_critical_batch"]
