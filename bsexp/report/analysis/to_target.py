"""Steps to a target: where each run, and each row on the mean of its seeds, first reached a
target accuracy, at or above it, or a target loss, at or below it (optimizer steps and training
samples actually taken), and the default target every point reaches well before its end (pure).
`higher`: the metric is better higher (an accuracy) or lower (a loss); the caller says which
(`bsexp.runs.ladder.Ladder(metric).higher`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bsexp.report.analysis.points import Point, Row, is_number

# The default steps-to-target target: the highest accuracy (the lowest loss) that every point of
# the fit had reached by this fraction of its training samples, so that every point reaches it well
# before its end and the large batches' steps measure optimisation, not the end of their LR schedule.
TARGET_BY = 0.5


def share(fraction: float) -> str:
    """A fraction of the training samples in words: "half", "quarter", else a percentage."""
    return {0.5: "half", 0.25: "quarter"}.get(fraction, f"{fraction:.0%}")


@dataclass(frozen=True)
class Reach:
    """Where a run (or the mean of a row's seeds) first reached a target: optimizer steps and
    training samples actually taken, read from its metrics records."""

    steps: float
    samples: float
    at_first_eval: bool = False  # reached by the first evaluation: steps and samples are upper bounds

    @property
    def batch(self) -> float:
        """Samples per step actually taken (below the nominal batch where an epoch ends in a smaller step)."""
        return self.samples / self.steps


def reach(point: Point, metric: str, target: float, higher: bool = True) -> Reach | None:
    """Steps and samples at which `metric` first reached `target` (at or above it, or at or below
    it where `higher` is false), interpolated linearly between the evaluation before, which had not
    reached it, and the first that had (the records' own steps and samples, so a smaller last step
    of an epoch counts as what it was); None if it never did."""
    below = None
    for record in point.records:
        value = record.get(metric)
        if not is_number(value):
            continue
        if value >= target if higher else value <= target:
            if below is None:
                return Reach(record["step"], record["samples_seen"], at_first_eval=True)
            f = (target - below[metric]) / (value - below[metric])
            return Reach(
                below["step"] + f * (record["step"] - below["step"]),
                below["samples_seen"] + f * (record["samples_seen"] - below["samples_seen"]),
            )
        below = record
    return None


def reach_row(row: Row, metric: str, target: float, higher: bool = True) -> Reach | None:
    """Mean over the row's seeds; None unless every completed seed reached the target."""
    reached = [reach(p, metric, target, higher) for p in row.done]
    if not reached or any(r is None for r in reached):
        return None
    return Reach(
        statistics.fmean(r.steps for r in reached),
        statistics.fmean(r.samples for r in reached),
        any(r.at_first_eval for r in reached),
    )


@dataclass(frozen=True)
class Target:
    value: float | None
    rule: str  # how it was chosen
    refused: str | None = None
    doubt: str | None = None  # why the value may not be what the sweep can reach (a failed seed set it)


# A seed whose early best lies this far (in the metric's units: an accuracy's fraction, a loss's
# nats or bits) on the worse side of every other seed of its batch has failed, not trained more
# slowly: a target it sets says little about the others.
FAILED_SEED_BY = 0.1


def target_rule(metric: str, higher: bool = True) -> str:
    most = "highest" if higher else "lowest"
    return f"the {most} {metric} every point reached within the first {share(TARGET_BY)} of its training samples"


def shown(value: float, higher: bool = True) -> str:
    """A value of the metric as the report's words give it: an accuracy in %, a loss as it is."""
    return f"{100 * value:.1f} %" if higher else f"{value:.4f}"


def choose_target(rows: Sequence[Row], metric: str, higher: bool = True) -> Target:
    """The best `metric` that every completed point had reached by TARGET_BY of its training
    samples: the lowest of the points' highest accuracies by then, or the highest of their lowest
    losses. Every point reaches it well before its end."""
    rule = target_rule(metric, higher)
    best, worst = (max, min) if higher else (min, max)
    reached: list[tuple[float, Point, Row]] = []
    for row in rows:
        for point in row.done:
            total = point.final_samples
            early = [
                rec[metric]
                for rec in point.records
                if is_number(rec.get(metric)) and total and rec.get("samples_seen", math.inf) <= TARGET_BY * total
            ]
            if not early:
                return Target(
                    None,
                    rule,
                    f"`{point.name}` has no evaluation within the first {share(TARGET_BY)} of "
                    f"its training samples (evaluate more often: trainer.eval_every_steps)",
                )
            reached.append((best(early), point, row))
    if not reached:
        return Target(None, rule, "no completed point has metrics records")
    value, setter, row = worst(reached, key=lambda item: item[0])
    siblings = [v for v, p, r in reached if r is row and p is not setter]
    doubt = None
    if siblings and (worst(siblings) - value if higher else value - worst(siblings)) >= FAILED_SEED_BY:
        lo, hi = min(siblings), max(siblings)
        span = f"{100 * lo:.1f}-{100 * hi:.1f} %" if higher else f"{lo:.4f}-{hi:.4f}"
        far, easy = ("below", "low") if higher else ("above", "high")
        doubt = (
            f"the target was set by `{setter.name}` ({shown(value, higher)}), far {far} the other seeds of batch "
            f"{row.batch} ({span}): a failed seed sets it {easy}, and every batch reaches a {easy} target "
            f"early; give --target, or leave that seed out"
        )
    return Target(value, rule, doubt=doubt)
