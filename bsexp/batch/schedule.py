"""Which global batch each optimizer step uses. Pure, no torch.

A `BatchSchedule` gives the global batch at every step of a run: constant (fixed, accumulation,
finder), or growing at milestones, linearly, exponentially or from a list (Smith et al. 2018,
"Don't decay the learning rate, increase the batch size"). `run_steps` lays the whole run out
step by step, so the loaders, the LR and its coupling to the batch all agree on it.
"""

from __future__ import annotations

import bisect
from dataclasses import KW_ONLY, dataclass

from bsexp.batch.plan import PlanError, keep_final

KINDS = ("constant", "step", "linear", "exponential", "list", "by_step")


@dataclass(frozen=True)
class BatchSchedule:
    start: int  # the global batch at step 0
    _: KW_ONLY
    world_size: int = 1
    kind: str = "constant"
    unit: str = "epochs"  # of `milestones` (step kind) and `points` (list kind): epochs, steps or samples
    milestones: tuple[float, ...] = ()
    factor: float = 1.0  # step kind: the batch is multiplied by this at each milestone
    end: int | None = None  # linear/exponential: the batch of the last epoch
    epochs: int = 1  # linear/exponential: over how many epochs
    points: tuple[tuple[float, int], ...] = ()  # list kind: (when, batch) pairs, `when` in `unit`
    round_to: int = 1  # linear/exponential sizes: a multiple of round_to x world_size
    step_points: tuple[tuple[int, int], ...] = ()  # by_step kind: (step, batch) from step 0 (the adaptive batch)
    # An epoch's last two steps share its rest where the last alone would take less than half a
    # batch (not with drop_last): a batch the run chose itself can leave any rest, down to a few
    # samples, and a step of 4 samples at an LR set for 437 (with BatchNorm's statistics of 4)
    # undoes training (the adaptive batch on MNIST-1D: validation accuracy 99.6 -> 94.4 %).
    balance_tail: bool = False

    def size_at(self, epoch: int, step: int, seen: int = 0) -> int:
        """The global batch of the optimizer step `step` (counted over the run), in `epoch`, after
        `seen` training samples (what a schedule in samples reads: Merrill et al. grow the batch
        at tokens seen)."""
        at = {"steps": step, "samples": seen}.get(self.unit, epoch)
        if self.kind == "step":
            return _exact(self.start, self.factor, sum(at >= m for m in self.milestones))
        if self.kind in ("linear", "exponential"):
            t = min(1.0, epoch / (self.epochs - 1)) if self.epochs > 1 else 1.0
            end = self.end if self.end is not None else self.start
            size = (
                self.start + (end - self.start) * t if self.kind == "linear" else self.start * (end / self.start) ** t
            )
            quantum = self.round_to * self.world_size
            return max(quantum, quantum * round(size / quantum))
        if self.kind == "by_step":
            steps = [p[0] for p in self.step_points]
            return self.step_points[max(0, bisect.bisect_right(steps, step) - 1)][1] if self.step_points else self.start
        if self.kind == "list":
            whens = [p[0] for p in self.points]
            return self.points[max(0, bisect.bisect_right(whens, at) - 1)][1] if self.points else self.start
        return self.start

    def sizes(self, epochs: int) -> list[int]:
        """Every global batch the schedule uses in `epochs` epochs (steps milestones included)."""
        if self.kind == "by_step":
            return sorted({self.start, *(p[1] for p in self.step_points)})
        found = {self.size_at(e, 0) for e in range(epochs)}
        if self.kind == "step" and self.unit != "epochs":
            found |= {_exact(self.start, self.factor, i + 1) for i in range(len(self.milestones))}
        if self.kind == "list" and self.unit != "epochs":
            found |= {p[1] for p in self.points}
        return sorted(found)

    def run_steps(self, epochs: int, n: int, drop_last: bool, max_steps: int | None = None) -> RunSteps:
        """The global batch of every step of the run, and the step each epoch starts at."""
        sizes: list[int] = []
        taken_by_step: list[int] = []
        epoch_starts: list[int] = []
        cut_epoch = seen = 0
        for epoch in range(epochs):
            if max_steps is not None and len(sizes) >= max_steps:
                break
            epoch_starts.append(len(sizes))
            start = steps = 0
            while start < n:
                size = self.size_at(epoch, epoch_starts[-1] + steps, seen)
                left = n - start
                shared = (
                    self.balance_tail and size < left < 1.5 * size and keep_final(left // 2, self.world_size, drop_last)
                )
                taken = (left + 1) // 2 if shared else min(size, left)
                if taken < size and not keep_final(taken, self.world_size, drop_last):
                    break
                if max_steps is None or len(sizes) < max_steps:
                    sizes.append(size)
                    taken_by_step.append(taken)
                start, steps, seen = start + taken, steps + 1, seen + taken  # past the cap: only counted
            if len(sizes) - epoch_starts[-1] < steps:
                cut_epoch = steps
        return RunSteps(tuple(sizes), tuple(epoch_starts), n, tuple(taken_by_step), cut_epoch)


@dataclass(frozen=True)
class RunSteps:
    sizes: tuple[int, ...]  # the scheduled global batch of each step
    epoch_starts: tuple[int, ...]  # index of each epoch's first step
    n: int  # training samples an epoch
    taken: tuple[int, ...] = ()  # the samples each step trains on (an epoch's last step may take fewer)
    cut_epoch: int = 0  # the steps the last epoch would have had, where max_steps or `first` cut the run within it

    @property
    def total(self) -> int:
        return len(self.sizes)

    @property
    def before(self) -> tuple[int, ...]:
        """Samples seen before each step: where the LR schedule, counted in samples, stands."""
        seen, out = 0, []
        for taken in self.taken or self.sizes:
            out.append(seen)
            seen += taken
        return tuple(out)

    @property
    def total_samples(self) -> int:
        return sum(self.taken or self.sizes)

    def epoch_samples(self) -> list[int]:
        """Samples each epoch trains on (a run cut short by max_steps: the cut epoch's, and no epochs past it)."""
        taken = self.taken or self.sizes
        bounds = [*self.epoch_starts, self.total]
        return [sum(taken[a:b]) for a, b in zip(bounds, bounds[1:])]

    def samples_at(self, epochs: float) -> int:
        """Samples seen after `epochs` epochs (a fraction of an epoch by that epoch's samples);
        past the run's last step (a run cut short by max_steps), at a whole epoch's rate."""
        whole = int(epochs)
        per_epoch = self.epoch_samples()
        # Whether epoch `whole` was trained whole: one that max_steps cut took fewer samples than an epoch.
        complete = per_epoch[whole + 1] > 0 if whole + 1 < len(per_epoch) else not self.cut_epoch
        if whole < len(per_epoch) and per_epoch[whole] and (complete or epochs == whole):
            return sum(per_epoch[:whole]) + round((epochs - whole) * per_epoch[whole])
        rate = per_epoch[0] if len(per_epoch) > 1 and per_epoch[1] else self.n
        return max(round(epochs * rate), sum(per_epoch[:whole]) if whole <= len(per_epoch) else 0)

    def cut(self, samples: int, min_last: int = 1) -> RunSteps:
        """The run stopped once `samples` samples are seen: the last step kept takes only what is
        left of them, unless fewer than `min_last` are (then the run ends a step earlier)."""
        sizes, taken, seen = [], [], 0
        for size, took in zip(self.sizes, self.taken or self.sizes):
            if seen >= samples or min(took, samples - seen) < min_last:
                break
            sizes.append(size)
            taken.append(min(took, samples - seen))
            seen += taken[-1]
        total = len(sizes)
        return RunSteps(tuple(sizes), tuple(min(s, total) for s in self.epoch_starts), self.n, tuple(taken))

    def first(self, steps: int) -> RunSteps:
        """The run's first `steps` steps (the epochs that start within them)."""
        starts = tuple(s for s in self.epoch_starts if s < steps) or self.epoch_starts[:1]
        whole = self.epoch_steps(len(starts) - 1)
        cut = whole if steps < starts[-1] + whole else 0
        return RunSteps(self.sizes[:steps], starts, self.n, self.taken[:steps], cut)

    def epoch_steps(self, epoch: int) -> int:
        """The steps of `epoch` had the run not been cut within it."""
        last = epoch == len(self.epoch_starts) - 1
        return self.cut_epoch if last and self.cut_epoch else len(self.epoch(epoch))

    def samples_before_step(self, step: int) -> int:
        """Samples seen before step `step`; past the run's end, at its last step's size."""
        if step < self.total:
            return self.before[step]
        taken = self.taken or self.sizes
        return self.total_samples + (step - self.total) * (taken[-1] if taken else 0)

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

    def epoch_taken(self, epoch: int) -> tuple[int, ...]:
        """The samples each step of `epoch` trains on."""
        if not self.taken:
            return self.epoch(epoch)
        start = self.epoch_starts[epoch]
        stop = self.epoch_starts[epoch + 1] if epoch + 1 < len(self.epoch_starts) else self.total
        return self.taken[start:stop]


def _exact(start: int, factor: float, reached: int) -> int:
    size = start * factor**reached
    rounded = round(size)
    if abs(size - rounded) > 1e-6 * max(1.0, size):
        raise PlanError(
            "batch.schedule.factor",
            factor,
            f"must make every scheduled batch a whole number; batch {start} x {factor:g}^{reached} = {size:g}",
        )
    return rounded
