"""Arms against the tuned curve (python -m bsexp.tune): each arm's steps to the tuning's target
against the batch size whose best trial, rerun over seeds, needed the fewest, with the seeds'
95 % confidence intervals. Pure: the tuning's result comes in analysed (bsexp.report.steps).

The tuned curve gives each fixed batch its own best LR (Shallue et al. 2019), so it is the fixed
batch an arm must beat, not a rule-scaled one. Steps to the target are read as the tuning reads
them (interpolated between the evaluations around it), so an arm evaluated as often as the tuning
(trainer.eval_growth) is measured on the same scale."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from scipy.stats import t as student_t

from bsexp.config.schema import LOWER_IS_BETTER
from bsexp.report.analysis.to_target import reach
from bsexp.report.pareto.analysis import Arm
from bsexp.report.steps.analysis import StepsToResult

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    mean: float
    half: float  # half the width of the 95 % interval (0 with one seed: no spread to tell)
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Interval:
        n = len(values)
        if n < 2:
            return cls(values[0], 0.0, n)
        sem = statistics.stdev(values) / math.sqrt(n)
        return cls(statistics.fmean(values), float(student_t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * sem, n)

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half


@dataclass(frozen=True)
class AgainstTuned:
    arm: str
    reached: int
    seeds: int
    steps: Interval | None  # over the seeds that reached the target
    ratio: float | None  # the arm's mean steps over the tuned batch's
    verdict: str


@dataclass(frozen=True, kw_only=True)
class TunedBaseline:
    target: float
    batch: int
    lr: float
    steps: Interval
    rows: list[AgainstTuned]
    target_text: str = ""  # the target with its side: `val_acc >= 90 %`, `val_loss <= 1.3`
    seeds: tuple[int, int] = (1, 1)  # the reference's: (seeds that reached the target, seeds run)
    # Faster batches passed over: their best reached the target on some seeds only, as
    # (batch, seeds reached, seeds run); a batch that gets there on a lucky seed is none to train at.
    passed_over: tuple[tuple[int, int, int], ...] = ()


def against_tuned(arms: list[Arm], tuned: StepsToResult) -> TunedBaseline | None:
    """Each arm against the tuned batch with the fewest mean steps over its seeds, among those
    whose best reached the target on every seed (among all that reached it where none did);
    None where no batch of the tuning reached its target."""
    reached = [b for b in tuned.batches if b.best is not None]
    if not reached:
        return None
    steady = [b for b in reached if b.seeds[0] == b.seeds[1]] or reached
    mean_steps = {b.batch: statistics.fmean(b.steps_over_seeds()) for b in reached}
    fastest = min(steady, key=lambda b: mean_steps[b.batch])
    kept = {b.batch for b in steady}
    passed_over = tuple(
        (b.batch, *b.seeds) for b in reached if b.batch not in kept and mean_steps[b.batch] < mean_steps[fastest.batch]
    )
    base = Interval.of(fastest.steps_over_seeds())
    rows = []
    for arm in arms:
        done = [p for p in arm.points if p.done]
        higher = tuned.metric not in LOWER_IS_BETTER
        steps = [r.steps for r in (reach(p, tuned.metric, tuned.target, higher) for p in done) if r is not None]
        interval = Interval.of(steps) if steps else None
        rows.append(
            AgainstTuned(
                arm=arm.name,
                reached=len(steps),
                seeds=len(done),
                steps=interval,
                ratio=None if interval is None else interval.mean / base.mean,
                verdict=_verdict(interval, len(steps), len(done), base),
            )
        )
    return TunedBaseline(
        target=tuned.target,
        target_text=tuned.target_text,
        batch=fastest.batch,
        lr=fastest.best.lr,
        steps=base,
        rows=rows,
        seeds=fastest.seeds,
        passed_over=passed_over,
    )


def _verdict(steps: Interval | None, reached: int, seeds: int, base: Interval) -> str:
    if steps is None:
        return "never reaches the target"
    if reached < seeds:
        return f"reaches the target on {reached} of {seeds} seeds"
    if steps.high < base.low:
        return "fewer steps than the tuned fixed batch (the intervals do not overlap)"
    if steps.low > base.high:
        return "more steps than the tuned fixed batch (the intervals do not overlap)"
    return "no fewer steps than the tuned fixed batch: the intervals overlap"
