"""Arms of a comparison against tuned fixed batches: optimizer steps to a target accuracy against
the final accuracy (the Pareto front), with samples and training time to the target beside them.

    python -m bsexp.report.pareto SWEEP_DIR [SWEEP_DIR ...] [--out DIR] [--tuned TUNE_DIR]

Each sweep point is an arm (its `experiment/<name>=<arm>` override, with any other override that
sets it apart from the rest, such as `batch.adaptive.c=0.5`) and a seed. Points of the arm
`fixed` are one row per batch, at the LR (over the points' `optimizer.lr`) with the best mean final
validation accuracy: a tuned baseline (Shallue et al. 2019); another arm run at several LRs is
tuned the same way. The target is the best tuned fixed batch's final validation accuracy less its
standard deviation over seeds (the bottom of its one-std band); an arm's steps, samples and
seconds to it are the first evaluation at or above it, averaged over the seeds that reach it. The
goal line compares each other arm with the fixed batch that needs the fewest steps among those
that reach the target on every seed: at least 30 % fewer steps, no more samples, final accuracy
in the band, and the target reached on every seed; under it, how far the verdict moves when the
seeds are drawn again (`seed_spread`, a bootstrap over seeds). Beside it, what any batch schedule
could gain over a fixed batch at the baseline's samples in McCandlish et al.'s model, fitted to
the fixed batches that reach the target on every seed at a ladder of targets up to it (`bound`:
an estimate, not a bound; the model's derivation is at `bsexp.report.analysis.schedule_bound`).

With --tuned, pareto.md also holds every arm against the tuned curve of `python -m bsexp.tune`
on the same data and model: its steps to the tuning's target against those of the batch size whose
own tuned LR needed the fewest, with the seeds' 95 % intervals (`tuned`).

Writes pareto.md, pareto.csv and pareto.png into --out (default: the first sweep directory).

`analysis` holds the arms, the target, the verdicts and the bound (pure, tested alone), `tuned`
the arms against the tuned curve (pure), `render`
writes pareto.md, pareto.csv and pareto.png, `cli` is the command line; the points are read by
`bsexp.report.load`, as the sweep report reads them.
"""

from bsexp.report.pareto.cli import main

__all__ = ["main"]
