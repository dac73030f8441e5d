"""Steps to result as a pure function of the tuning's points: no files, no plotting, no torch.

Each trial's steps to the target are read from its records as the sweep report reads them
(bsexp.report.analysis.reach: interpolated between the evaluations around the target, which
trainer.eval_growth puts a few percent apart). A batch size's best trial is the one with the
fewest steps; its reruns over seeds give the spread. S = S_min + E_min / B is fitted to the best
steps and the samples they took (McCandlish et al. 2018's form of Shallue et al.'s curve), so
B_crit = E_min / S_min; the regions follow from it: perfect scaling while the samples stay within
REGION of their least (E = E_min (1 + B / B_crit): B <= REGION x B_crit), maximal data parallelism
once the steps do (S = S_min (1 + B_crit / B): B >= B_crit / REGION), diminishing returns between.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from bsexp.config.schema import LOWER_IS_BETTER
from bsexp.report.analysis.fit import Fit, fit_steps_samples
from bsexp.report.analysis.points import Point
from bsexp.report.analysis.to_target import reach

REGION = 0.25  # within 25 % of the least samples (steps), scaling counts as perfect (maximal)


@dataclass(frozen=True)
class Trial:
    """One run of the search (or a rerun of a batch's best): what it tried and how soon it got there."""

    name: str
    batch: int
    lr: float
    momentum: float | None
    seed: int
    steps: float | None  # to the target, interpolated; None where it never got there
    samples: float | None
    status: str
    warmup: float | None = None  # in schedule.unit, with its shape: searched where tune.warmup_max is set
    warmup_shape: str | None = None


@dataclass
class BatchResult:
    batch: int
    trials: list[Trial]
    reruns: list[Trial] = field(default_factory=list)  # the best trial's values over other seeds

    @property
    def reached(self) -> list[Trial]:
        return [t for t in self.trials if t.steps is not None]

    @property
    def best(self) -> Trial | None:
        """The trial with the fewest steps to the target."""
        return min(self.reached, key=lambda t: t.steps, default=None)

    @property
    def at_edge(self) -> str | None:
        """Where the best LR is the smallest or largest tried: the best may lie outside the range."""
        best, tried = self.best, [t.lr for t in self.trials]
        if best is None or len(tried) < 2:
            return None
        if best.lr <= min(tried):
            return "lowest"
        return "highest" if best.lr >= max(tried) else None

    @property
    def seeds(self) -> tuple[int, int]:
        """(seeds on which the best configuration reached the target, seeds it ran on)."""
        if self.best is None:
            return 0, 1 + len(self.reruns)
        return 1 + sum(t.steps is not None for t in self.reruns), 1 + len(self.reruns)

    def steps_over_seeds(self) -> list[float]:
        """The best trial's steps and its reruns' (those that got there)."""
        best = self.best
        if best is None:
            return []
        return [best.steps, *(t.steps for t in self.reruns if t.steps is not None)]

    def samples_over_seeds(self) -> list[float]:
        best = self.best
        return [] if best is None else [best.samples, *(t.samples for t in self.reruns if t.samples is not None)]


@dataclass(frozen=True)
class Regions:
    """The three regions of the fitted curve, by batch size."""

    perfect_up_to: float  # perfect scaling: doubling the batch halves the steps
    maximal_from: float  # maximal data parallelism: more batch, no fewer steps


@dataclass
class StepsToResult:
    target: float
    batches: list[BatchResult]
    fit: Fit | None = None
    regions: Regions | None = None
    reference: int | None = None  # the batch the rules are scaled from (its tuned LR)
    metric: str = "val_acc"  # what reaches the target: an accuracy at or above it, a loss at or below
    context: int | None = None  # a language model's tokens per sample (the runs' summary.json `context`)

    @property
    def target_text(self) -> str:
        """The target with the side it is reached from: `val_acc >= 90 %`, `val_loss <= 1.3`."""
        if self.metric in LOWER_IS_BETTER:
            return f"{self.metric} <= {self.target:g}"
        return f"{self.metric} >= {100 * self.target:g} %"

    @property
    def not_reached(self) -> list[int]:
        return [b.batch for b in self.batches if b.best is None]

    def curve(self) -> list[tuple[int, float, float]]:
        """(batch, mean steps, mean samples) over each reached batch's best and its reruns."""
        return [
            (b.batch, statistics.fmean(b.steps_over_seeds()), statistics.fmean(b.samples_over_seeds()))
            for b in self.batches
            if b.best is not None
        ]

    def region(self, batch: float) -> str | None:
        if self.regions is None:
            return None
        if batch <= self.regions.perfect_up_to:
            return "perfect scaling"
        return "maximal data parallelism" if batch >= self.regions.maximal_from else "diminishing returns"

    def rule_ratios(self, batch: BatchResult) -> dict[str, float] | None:
        """The linear and square-root rules' LR at `batch`, scaled from the reference batch's tuned
        LR, over the LR tuned at `batch` (1: the rule is right; 2: it is twice too high)."""
        ref = next((b for b in self.batches if b.batch == self.reference), None)
        if ref is None or ref.best is None or batch.best is None:
            return None
        k = batch.batch / ref.batch
        return {"linear": ref.best.lr * k / batch.best.lr, "sqrt": ref.best.lr * math.sqrt(k) / batch.best.lr}


def trial(point: Point, target: float, metric: str = "val_acc") -> Trial:
    got = reach(point, metric, target, higher=metric not in LOWER_IS_BETTER) if point.done else None
    summary = point.summary or {}
    return Trial(
        name=point.name,
        batch=int(point.batch or 0),
        lr=float(summary.get("lr") or math.nan),
        momentum=summary.get("momentum"),
        seed=int(summary.get("seed", 0)),
        steps=None if got is None else got.steps,
        samples=None if got is None else got.samples,
        status=point.status,
        warmup=summary.get("warmup"),
        warmup_shape=summary.get("warmup_shape"),
    )


def analyse(
    trials: Sequence[Point], reruns: Sequence[Point], target: float, reference: int = 128, metric: str = "val_acc"
) -> StepsToResult:
    """Steps to result from the search's points (`trials`) and the best ones' reruns over seeds, to
    `metric` reaching `target` (at or below it for a loss)."""
    by_batch: dict[int, BatchResult] = {}
    for point in trials:
        t = trial(point, target, metric)
        by_batch.setdefault(t.batch, BatchResult(t.batch, [])).trials.append(t)
    for point in reruns:
        t = trial(point, target, metric)
        if t.batch in by_batch:
            by_batch[t.batch].reruns.append(t)
    context = next((p.summary["context"] for p in trials if (p.summary or {}).get("context")), None)
    result = StepsToResult(target, [by_batch[b] for b in sorted(by_batch)], metric=metric, context=context)
    reached = [b.batch for b in result.batches if b.best is not None]
    result.reference = min(reached, key=lambda b: abs(math.log(b / reference))) if reached else None
    curve = result.curve()
    result.fit = fit_steps_samples([s for _, s, _ in curve], [e for _, _, e in curve])
    if not result.fit.refused:
        b_crit = result.fit.b_crit
        result.regions = Regions(perfect_up_to=REGION * b_crit, maximal_from=b_crit / REGION)
    return result
