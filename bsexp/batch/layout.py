"""A run's layout: the global batch and the samples of every optimizer step, the largest
micro-batch known to fit, and how the LR and weight decay follow the batch. Frozen and pure.

A batch policy computes one from its config and what was measured (bsexp.batch.policies); a
closed-loop policy computes a new one when it decides. The loop applies it (bsexp.batch.control)
and never derives batch math of its own; the optimizer's LR and weight decay are written from it
(bsexp.engine.optim.Hyperparameters), with the rules of bsexp.batch.hparams.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

from bsexp.batch.plan import BatchPlan, plan_for
from bsexp.batch.schedule import RunSteps


@dataclass(frozen=True)
class Layout:
    run: RunSteps  # the global batch of every step, the samples it takes, the epochs
    world: int  # ranks the global batch is split over
    first_plan: BatchPlan  # the first step's split (a policy may give it: batch=accumulation's micro-batch)
    _: KW_ONLY
    micro_size_cap: int | None = None  # the largest micro-batch per rank known to fit (None: any)
    base_batch_given: int | None = None  # the batch the LR and weight decay are scaled for (None: the first step's)
    lr_run_given: RunSteps | None = None  # the run the LR schedule's lengths are counted against (None: `run`)
    lr_samples_given: tuple[float, ...] | None = None  # where the LR schedule stands before each step (None: samples)
    lr_coupling: tuple[float, ...] = ()  # the LR's multiplier at each step, relative to base_batch's (empty: 1)
    wd_step_ratios: tuple[float, ...] = ()  # the weight decay's multiplier at each step over the step before (empty: 1)
    eval_steps: tuple[int, ...] = ()  # steps after which the policy wants an evaluation
    epochs_by_samples: bool = False  # epochs count the samples of `lr_run` (a branch ends within one)

    @property
    def total(self) -> int:
        return self.run.total

    @property
    def base_batch(self) -> int:
        """The batch the LR and weight decay are scaled for, and the batch a checkpoint's run is known by."""
        if self.base_batch_given is not None:
            return self.base_batch_given
        return self.run.sizes[0] if self.run.sizes else self.first_plan.size

    @property
    def lr_run(self) -> RunSteps:
        return self.lr_run_given if self.lr_run_given is not None else self.run

    @property
    def lr_samples(self) -> tuple[float, ...]:
        return self.lr_samples_given if self.lr_samples_given is not None else self.run.before

    def plan(self, step: int, current: BatchPlan, micro_size_cap: int | None) -> BatchPlan:
        """The plan of step `step`: `current` while the step's batch is its batch; else the step's
        batch split under `micro_size_cap`."""
        size = self.run.sizes[step]
        return current if current.size == size else plan_for(size, self.world, micro_size_cap)

    def weight_decays(self, base: float) -> list[float]:
        """The weight decay at every step from `base`, each change applied to the step before's
        value (as an optimizer's decay is scaled in place where the batch changes)."""
        if not self.wd_step_ratios:
            return [base] * self.total
        values, value = [], base
        for ratio in self.wd_step_ratios:
            value *= ratio
            values.append(value)
        return values

    def epochs_done(self, epoch: int, in_epoch: int, samples_seen: int) -> float:
        """Epochs trained after `in_epoch` steps of `epoch` (`samples_seen` in all): a partial
        epoch by its steps; one the run was cut within (max_steps, AdaScale's length) by the
        steps it would have had. A branch counts samples against the epochs of `lr_run`."""
        if self.epochs_by_samples:
            per_epoch = self.lr_run.epoch_samples()
            if self.lr_run.cut_epoch:
                per_epoch[-1] = self.lr_run.n
            whole = sum(per_epoch[:epoch])
            inside = per_epoch[epoch] if epoch < len(per_epoch) else 0
            return epoch + ((samples_seen - whole) / inside if inside else 0.0)
        run = self.run
        if not in_epoch and epoch == len(run.epoch_starts) and run.cut_epoch:  # the last step ended the cut epoch
            epoch, in_epoch = epoch - 1, len(run.epoch(epoch - 1))
        whole = run.epoch_steps(epoch) if epoch < len(run.epoch_starts) else 0
        return epoch + (in_epoch / whole if whole else 0.0)
