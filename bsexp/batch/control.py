"""A run's batch as it trains: the policy's layout in force, the plan of every step, and the
micro-batch cap after out-of-memory recoveries. The loop holds one `BatchControl` and asks it; a
closed-loop policy's decisions arrive here (rank 0 decides, every rank applies), and the layout
they give replaces the one in force. Its state goes into checkpoints."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from bsexp.batch.layout import Layout
from bsexp.batch.plan import BatchPlan, plan_for
from bsexp.batch.policies.interface import BatchPolicy, Hooks
from bsexp.batch.scaling import ScaledHparams

log = logging.getLogger(__name__)


class BatchControl:
    def __init__(self, policy: BatchPolicy, layout: Layout) -> None:
        self.policy, self.layout = policy, layout
        self.hooks = Hooks(policy)  # its optional hooks, each with its default where it has none
        self.micro_size_cap = layout.micro_size_cap  # the largest micro-batch per rank known to fit (None: any)
        self.oom_recoveries = 0
        self._plan = layout.first_plan  # in force

    # ---------------------------------------------------------------- what the policy tells

    @property
    def found(self):
        """The finder's result (bsexp.finder.FinderResult), where the finder ran."""
        return self.hooks.found

    def record(self) -> dict[str, Any]:
        """What the policy adds to each metrics record."""
        return self.hooks.record()

    def summary(self, samples_seen: int) -> dict[str, Any]:
        """What the policy adds to summary.json, for a run that has seen `samples_seen` samples."""
        return self.hooks.summary(samples_seen)

    def described(self, hp: ScaledHparams) -> ScaledHparams:
        """The LR and weight decay to announce and summarise (those of the run's own first step)."""
        return self.hooks.described(hp)

    # ---------------------------------------------------------------- the steps

    @property
    def current(self) -> BatchPlan:
        """The plan in force (after a change of batch or an out-of-memory recovery)."""
        return self._plan

    def plan(self, step: int) -> BatchPlan:
        """The plan of optimizer step `step` (counted over the run)."""
        self._plan = self.layout.plan(step, self._plan, self.micro_size_cap)
        return self._plan

    def begin(self, step: int, lr: float, weight_decay: float) -> None:
        """Before step `step`, the first this process takes (a branch's first, at its branch point)."""
        self._plan = self.plan(step)
        self.hooks.begin(step, lr, weight_decay)

    def after_oom(self, plan: BatchPlan) -> BatchPlan:
        """The same global batch in micro-batches half as large: the LR and weight decay stay."""
        self.micro_size_cap = plan.micro_size // 2
        self._plan = plan_for(plan.size, plan.world_size, self.micro_size_cap)
        self.oom_recoveries += 1
        log.warning(
            "out of memory at micro-batch %d: micro-batch %d x %d accumulation steps x %d ranks from now "
            "on (global batch %d, LR and weight decay unchanged)",
            plan.micro_size,
            self._plan.micro_size,
            self._plan.accum_steps,
            plan.world_size,
            plan.size,
        )
        return self._plan

    def adapt(self, step: int, world, noise) -> bool:
        """After `step` steps: a closed-loop policy may lay out the steps ahead anew. Rank 0
        decides from its measured noise scale; every rank applies its decision. Whether the layout
        changed."""
        if not self.hooks.due(step, self.layout):
            return False
        decided = None
        if world.is_main:
            averaged = noise.scale.averaged() if noise is not None else None
            b_simple = averaged[1] / averaged[0] if averaged is not None and averaged[0] > 0 else None
            decided = self.hooks.decide(step, self.layout, b_simple)
        layout = self.hooks.apply(step, self.layout, world.broadcast_object(decided))
        if layout is not None:
            self.layout = layout
        return layout is not None

    def epoch_sizes(self, epoch: int) -> EpochSizes:
        """The samples of each step of `epoch`, read as the epoch goes (a closed-loop policy may
        change the steps ahead between two steps)."""
        return EpochSizes(self, epoch)

    def epochs_done(self, state) -> float:
        return self.layout.epochs_done(state.epoch, state.in_epoch, state.samples_seen)

    # ---------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        policy = self.hooks.state_dict()
        return {
            "plan": asdict(self._plan),
            "micro_cap": self.micro_size_cap,
            "oom_recoveries": self.oom_recoveries,
            **policy,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._plan = BatchPlan(**state["plan"])
        self.micro_size_cap, self.oom_recoveries = state["micro_cap"], state["oom_recoveries"]


class EpochSizes:
    """An epoch's steps, read step by step from the layout in force: the samples each takes."""

    def __init__(self, batch_control: BatchControl, epoch: int) -> None:
        self.batch_control, self.epoch = batch_control, epoch

    def __len__(self) -> int:
        run = self.batch_control.layout.run
        return len(run.epoch(self.epoch)) if self.epoch < len(run.epoch_starts) else 0

    def __iter__(self):
        index = 0
        while index < len(self):  # the samples each step takes (an epoch's or the run's last may take fewer)
            yield self.batch_control.layout.run.epoch_taken(self.epoch)[index]
            index += 1
