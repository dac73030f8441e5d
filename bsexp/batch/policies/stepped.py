"""Runs whose global batch changes at given steps (`points`: (step, batch from it on)), the LR
following the batch by scaling.lr_rule, or by a gain (`gains`: (step, gain from it on), AdaScale's
r), relative to the first batch's, with warmup and decay counted in samples so that they are
neither stretched nor cut. The adaptive policy and branches of another run lay out such runs with
these functions. Pure."""

from __future__ import annotations

import bisect

from bsexp.batch import scaling
from bsexp.batch.schedule import BatchSchedule, RunSteps


def schedule(points: list[tuple[int, int]], world: int, balance_tail: bool = False) -> BatchSchedule:
    return BatchSchedule(
        start=points[0][1], world_size=world, kind="by_step", step_points=tuple(points), balance_tail=balance_tail
    )


def step_gains(gains: list[tuple[int, float]], steps: int) -> list[float]:
    """The LR gain in force at each of the first `steps` steps."""
    starts = [g[0] for g in gains]
    return [gains[max(0, bisect.bisect_right(starts, step) - 1)][1] for step in range(steps)]


def progress(run: RunSteps, b0: int, gains: list[float] | None = None) -> list[float]:
    """Where the LR schedule stands before each step of `run` and after its last: samples; or,
    with `gains` (each step's, AdaScale), scale-invariant samples: r b0-steps of progress for a
    step of S x b0 (taken x r / S samples of b0)."""
    out, seen = [0.0], 0.0
    for step, (size, taken) in enumerate(zip(run.sizes, run.taken or run.sizes)):
        seen += taken * gains[step] * b0 / size if gains is not None else taken
        out.append(seen)
    return out


def follow(
    run: RunSteps, b0: int, ref_batch: int, rule: str, gains: list[float] | None = None
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The LR schedule's position before every step and the LR's coupling to the batch (each
    step's gain where the LR follows `gains`; else the rule's multiplier relative to b0's)."""
    if gains is not None:
        coupling = gains
    else:
        first = scaling.rule_multiplier(rule, b0 / ref_batch)
        coupling = [scaling.rule_multiplier(rule, size / ref_batch) / first for size in run.sizes]
    return tuple(progress(run, b0, gains)[:-1]), tuple(coupling)


def weight_decay_step_ratios(sizes: tuple[int, ...], rule: str) -> tuple[float, ...]:
    """Per step, the weight decay's multiplier over the step before: the rule's ratio of the two
    batches where the batch changes, 1 elsewhere."""
    return tuple(
        1.0 if not step or size == sizes[step - 1] else scaling.rule_multiplier(rule, size / sizes[step - 1])
        for step, size in enumerate(sizes)
    )


def from_step(run: RunSteps, step: int, size: int, drop_last: bool) -> int | None:
    """The step a batch decided at `step` starts at: this one; or, where at `size` this step would
    end its epoch on less than half a batch (a rest the step before, already taken, cannot share),
    the next epoch's first (None: no epoch follows, the batch stays)."""
    epoch = bisect.bisect_right(run.epoch_starts, step) - 1
    left = run.n - sum(run.taken[run.epoch_starts[epoch] : step])
    if size <= 2 * left or drop_last:
        return step
    return run.epoch_starts[epoch + 1] if epoch + 1 < len(run.epoch_starts) else None
