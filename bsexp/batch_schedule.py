"""Which global batch each optimizer step uses, and the plan that carries it out. Pure, no torch.

A `BatchSchedule` gives the global batch at every step of a run: constant (fixed, accumulation,
finder), or growing at milestones, linearly, exponentially or from a list (Smith et al. 2018,
"Don't decay the learning rate, increase the batch size"). `plan_for` splits a global batch
into micro-batches no larger than the micro-batch known to fit, accumulating the rest, so the
scheduled global batch is kept exactly. `run_steps` lays the whole run out step by step, so the
loaders, the LR and its coupling to the batch all agree on it.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from bsexp import scaling
from bsexp.plan import BatchPlan, PlanError, make_plan

MIN_MICRO = 2  # samples: BatchNorm cannot normalise a single sample in training
KINDS = ("constant", "step", "linear", "exponential", "list")


@dataclass(frozen=True)
class BatchSchedule:
    start: int  # the global batch at step 0
    world_size: int = 1
    kind: str = "constant"
    unit: str = "epochs"  # of `milestones` (step kind)
    milestones: tuple[float, ...] = ()
    factor: float = 1.0  # step kind: the batch is multiplied by this at each milestone
    end: int | None = None  # linear/exponential: the batch of the last epoch
    epochs: int = 1  # linear/exponential: over how many epochs
    points: tuple[tuple[float, int], ...] = ()  # list kind: (epoch, batch) pairs
    round_to: int = 1  # linear/exponential sizes: a multiple of round_to x world_size

    def size_at(self, epoch: int, step: int) -> int:
        """The global batch of the optimizer step `step` (counted over the run), in `epoch`."""
        if self.kind == "step":
            reached = sum((step if self.unit == "steps" else epoch) >= m for m in self.milestones)
            return _exact(self.start * self.factor**reached)
        if self.kind in ("linear", "exponential"):
            t = min(1.0, epoch / (self.epochs - 1)) if self.epochs > 1 else 1.0
            end = self.end if self.end is not None else self.start
            size = (self.start + (end - self.start) * t if self.kind == "linear"
                    else self.start * (end / self.start) ** t)
            quantum = self.round_to * self.world_size
            return max(quantum, quantum * round(size / quantum))
        if self.kind == "list":
            epochs = [p[0] for p in self.points]
            return self.points[max(0, bisect.bisect_right(epochs, epoch) - 1)][1] if self.points else self.start
        return self.start

    def sizes(self, epochs: int) -> list[int]:
        """Every global batch the schedule uses in `epochs` epochs (steps milestones included)."""
        found = {self.size_at(e, 0) for e in range(epochs)}
        if self.kind == "step" and self.unit == "steps":
            found |= {self.size_at(0, math.ceil(m)) for m in self.milestones}
        return sorted(found)

    def run_steps(self, epochs: int, n: int, drop_last: bool, max_steps: int | None = None) -> "RunSteps":
        """The global batch of every step of the run, and the step each epoch starts at."""
        sizes: list[int] = []
        epoch_starts: list[int] = []
        for epoch in range(epochs):
            epoch_starts.append(len(sizes))
            start = 0
            while start < n and (max_steps is None or len(sizes) < max_steps):
                size = self.size_at(epoch, len(sizes))
                taken = min(size, n - start)
                if taken < size and not keep_final(taken, self.world_size, drop_last):
                    break
                sizes.append(size)
                start += taken
        return RunSteps(tuple(sizes), tuple(epoch_starts), n)


@dataclass(frozen=True)
class RunSteps:
    sizes: tuple[int, ...]  # the scheduled global batch of each step
    epoch_starts: tuple[int, ...]  # index of each epoch's first step
    n: int  # training samples an epoch

    @property
    def total(self) -> int:
        return len(self.sizes)

    def steps_at(self, epochs: float) -> int:
        """The step reached after `epochs` epochs (fractions within an epoch by its own steps)."""
        whole = int(epochs)
        if whole >= len(self.epoch_starts):
            return self.total
        return self.epoch_starts[whole] + round((epochs - whole) * len(self.epoch(whole)))

    def epoch(self, epoch: int) -> tuple[int, ...]:
        start = self.epoch_starts[epoch]
        stop = self.epoch_starts[epoch + 1] if epoch + 1 < len(self.epoch_starts) else self.total
        return self.sizes[start:stop]


def _exact(size: float) -> int:
    rounded = round(size)
    if abs(size - rounded) > 1e-6 * max(1.0, size):
        raise PlanError("batch.schedule.factor", size, "must make every scheduled batch a whole number")
    return rounded


def keep_final(samples: int, world_size: int, drop_last: bool) -> bool:
    """Whether an epoch's last, smaller step is trained on: not with drop_last, nor when a rank
    would get fewer than MIN_MICRO samples of it."""
    return not drop_last and samples // world_size >= MIN_MICRO


def plan_for(size: int, world_size: int, micro_cap: int | None) -> BatchPlan:
    """The plan for a global batch with micro-batches of at most `micro_cap` per rank: the
    largest micro-batch under the cap that divides the rank's share, accumulating the rest."""
    if size % world_size:
        raise PlanError("batch.size", size, f"must be divisible by the world size {world_size}")
    per_rank = size // world_size
    if micro_cap is None or per_rank <= micro_cap:
        return make_plan(size, world_size)
    micro = max(d for d in range(1, micro_cap + 1) if per_rank % d == 0)
    return make_plan(size, world_size, micro_size=micro)


def micro_sizes(local: int, samples: int, plan: BatchPlan) -> list[int]:
    """This rank's micro-batch sizes for a step of `samples` global samples (`local` of them on
    this rank). A full step: accum_steps of micro_size. A smaller last step: the same number of
    micro-batches on every rank (SyncBatchNorm and DDP expect it), as many as the largest share
    needs but none below MIN_MICRO samples, sizes differing by at most one."""
    if samples == plan.size:
        return [plan.micro_size] * plan.accum_steps
    largest, smallest = -(-samples // plan.world_size), samples // plan.world_size
    count = max(1, min(-(-largest // plan.micro_size), smallest // MIN_MICRO))
    return [local // count + (1 if i < local % count else 0) for i in range(count)]


def lr_coupling(sizes: tuple[int, ...], ref_batch: int, rule: str, couple: bool, ramp_steps: int) -> list[float]:
    """Per step, the LR multiplier that makes the LR follow the batch through the scaling rule,
    relative to the first step's batch; a change is ramped over `ramp_steps` steps."""
    if not sizes or not couple:
        return [1.0] * len(sizes)
    base = scaling.rule_multiplier(rule, sizes[0] / ref_batch)
    target = [scaling.rule_multiplier(rule, s / ref_batch) / base for s in sizes]
    factors, previous, changed_at = [], target[0], 0
    for step, value in enumerate(target):
        if step and sizes[step] != sizes[step - 1]:
            previous, changed_at = factors[-1], step
        if ramp_steps and step - changed_at < ramp_steps and value != previous:
            value = previous + (value - previous) * (step - changed_at + 1) / ramp_steps
        factors.append(value)
    return factors
