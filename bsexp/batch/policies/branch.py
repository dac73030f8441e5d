"""branch.trunk=...: the trunk's run continued from its checkpoint at `branch.at_samples` with the
global batch `batch.size` (in micro-batches of batch.micro_size with batch=accumulation), for
`branch.samples` samples (Merrill et al. 2025's branched training; bsexp.runs.trunk finds the trunk).
The steps before the branch point are the trunk's; from it on, the LR is the trunk's schedule at
the same samples seen times the rule's ratio of the two batches, and the weight decay the
trunk's times its rule's ratio; the data goes on where the trunk's stream was. The LR schedule's
length, warmup and milestones are the trunk's. The run ends after exactly `branch.samples`
samples (its last step takes only what is left)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from bsexp.batch import scaling
from bsexp.batch.layout import Layout
from bsexp.batch.plan import MIN_MICRO, BatchPlan, plan_for
from bsexp.batch.policies import stepped
from bsexp.batch.policies.shared import BatchConfig, Probe, RunSpec, given_plan, run_steps
from bsexp.batch.schedule import BatchSchedule, RunSteps
from bsexp.errors import ConfigError
from bsexp.fields import at_least


@dataclass
class BranchConfig:
    """A branch: the run continued from another run's (the trunk's) checkpoint with its own global
    batch (batch.*; LR and weight decay by scaling.*), on the same data stream, for `samples`
    samples. Every other key must equal the trunk's. Merrill et al. 2025's branched training."""

    trunk: Optional[str] = None  # the trunk: a run directory, or a sweep directory (the job of this seed)
    at_samples: Optional[int] = at_least(
        0, None
    )  # the trunk's checkpoint at these samples seen (checkpoint.at_samples)
    samples: Optional[int] = at_least(1, None)  # samples the branch trains on
    evals: int = at_least(1, 4)  # evaluations along the branch, evenly in samples (and one at its start)


@dataclass(frozen=True)
class BranchBatch:
    """A branch's config: the batch node it trains at (batch=fixed or batch=accumulation's) and branch.*."""

    batch: BatchConfig
    branch: BranchConfig


class Branch:
    """Made from its config and the run's spec, whose `trunk` says where it starts (the trunk's
    batch, step, samples and checkpoint: bsexp.runs.trunk.find; None until the trunk is found, and
    resuming, when the branch's own checkpoint says it)."""

    name = "branch"
    own_setup = False  # the set-up is the trunk's: no cautions of its own

    def __init__(self, config: BranchBatch, spec: RunSpec) -> None:
        self.batch, self.branch, self.spec, self.world = config.batch, config.branch, spec, spec.world_size
        # The trunk's batch, step and samples; once begun, the LR and weight decay of the branch's first step.
        self.trunk: dict[str, Any] | None = None if spec.trunk is None else dict(spec.trunk)
        self.run: RunSteps | None = None

    def check(self) -> BatchPlan:
        branch = self.branch
        if str(self.batch.policy) not in ("fixed", "accumulation"):
            raise ConfigError(
                "batch.policy",
                str(self.batch.policy),
                "a branch trains at one global batch: use batch=fixed or batch=accumulation",
            )
        if branch.samples is None:
            raise ConfigError(
                "branch.samples",
                None,
                "a branch needs its length: the samples to train on after the branch point (e.g. branch.samples=8192)",
            )
        if branch.at_samples is None:
            raise ConfigError(
                "branch.at_samples",
                None,
                "say which of the trunk's checkpoints to branch from: its "
                "samples seen (checkpoint.at_samples of the trunk)",
            )
        return given_plan(self.batch, self.world)

    def lay_out(self, probe: Probe, state: dict | None = None) -> Layout:
        rules, size = self.spec.rules, self.batch.size
        if state is not None:  # a branch resumed: where it branched is in its own checkpoint
            self.trunk = dict(state["trunk"])
        trunk = self.trunk
        given = given_plan(self.batch, self.world)
        counted = run_steps(self.spec, BatchSchedule(start=trunk["batch"], world_size=self.world), probe.n_train)
        points = [(0, trunk["batch"]), (trunk["step"], size)]
        self.run, cut_short = self._run_steps(points, counted, probe.n_train)
        positions, coupling = stepped.follow(self.run, trunk["batch"], rules.ref_batch, rules.lr_rule)
        if cut_short and self.run.total > trunk["step"]:  # the last step takes the LR of the samples it takes
            coupling = (
                *coupling[:-1],
                coupling[-1] * scaling.rule_multiplier(rules.lr_rule, self.run.taken[-1] / self.run.sizes[-1]),
            )
        ratio = scaling.rule_multiplier(rules.wd_rule, size / trunk["batch"])
        wd_step_ratios = tuple(ratio if step == trunk["step"] else 1.0 for step in range(self.run.total))
        first = given if trunk["batch"] == size else plan_for(trunk["batch"], self.world, None)
        return Layout(
            self.run,
            self.world,
            first,
            micro_size_cap=given.micro_size if given.accum_steps > 1 else None,
            base_batch_given=trunk["batch"],
            lr_run_given=counted,
            lr_samples_given=positions,
            lr_coupling=coupling,
            wd_step_ratios=wd_step_ratios,
            eval_steps=self._eval_steps(),
            epochs_by_samples=True,
        )

    def _run_steps(self, points, counted: RunSteps, n_train: int) -> tuple[RunSteps, bool]:
        """The trunk's steps to the branch point, then the branch's to its end; and whether that
        end cuts the last step short of its batch."""
        branch, trunk = self.branch, self.trunk
        full = stepped.schedule(points, self.world).run_steps(self.spec.epochs, n_train, self.spec.drop_last)
        at, end = trunk["samples"], trunk["samples"] + branch.samples
        if trunk["step"] > full.total or full.samples_before_step(trunk["step"]) != at:
            raise ConfigError(
                "branch.trunk",
                branch.trunk,
                f"its checkpoint at step {trunk['step']} has seen {at} "
                f"samples, which this run's layout does not reproduce "
                f"(epochs, data or batch.drop_last differ)",
            )
        last = min(full.total_samples, counted.total_samples)  # the trunk's own end (trainer.max_steps)
        if end > last:
            raise ConfigError(
                "branch.samples",
                branch.samples,
                f"runs past the run's end: the branch starts at {at} of {last} samples, so at most {last - at}",
            )
        cut = full.cut(end, min_last=MIN_MICRO * self.world)
        return cut, bool(cut.total) and cut.taken[-1] < (full.taken or full.sizes)[cut.total - 1]

    def _eval_steps(self) -> tuple[int, ...]:
        """After the first step at or past each `branch.samples / branch.evals` of the branch."""
        branch, trunk, run = self.branch, self.trunk, self.run
        marks = [trunk["samples"] + branch.samples * j / branch.evals for j in range(1, branch.evals + 1)]
        seen, found = trunk["samples"], []
        for step in range(trunk["step"], run.total):
            seen += (run.taken or run.sizes)[step]
            if marks and seen >= marks[0] - 1e-9:
                found.append(step + 1)
                while marks and seen >= marks[0] - 1e-9:
                    marks.pop(0)
        return tuple(found)

    def begin(self, step: int, lr: float, weight_decay: float) -> None:
        """At the branch point, the LR and weight decay of the branch's first step (its summary's)."""
        if step == self.trunk["step"]:  # a branch resumed past its branch point has them already
            self.trunk["lr"], self.trunk["weight_decay"] = lr, weight_decay

    def described(self, hp: scaling.ScaledHparams) -> scaling.ScaledHparams:
        """The branch's own: the LR and weight decay at its batch by the rules, its steps."""
        rules, trunk = self.spec.rules, self.trunk
        k = scaling.scale_factor(self.batch.size, rules.ref_batch)
        return scaling.ScaledHparams(
            k=k,
            lr=scaling.scaled_lr(rules.lr, k, rules.lr_rule),
            lr_peak=hp.lr_peak,
            weight_decay=scaling.scaled_weight_decay(rules.weight_decay, k, rules.wd_rule),
            warmup_steps=0 if hp.warmup_steps <= trunk["step"] else hp.warmup_steps - trunk["step"],
            total_steps=self.run.total - trunk["step"],
        )

    def summary(self, samples_seen: int) -> dict[str, Any]:
        trunk = self.trunk
        return {
            "branch": {
                "trunk": trunk.get("run_dir"),
                "checkpoint": trunk.get("checkpoint"),
                "trunk_batch": trunk["batch"],
                "at_step": trunk["step"],
                "at_samples": trunk["samples"],
                "samples": self.branch.samples,
                "samples_trained": samples_seen - trunk["samples"],
                "batch": self.batch.size,
                "lr": trunk.get("lr"),
                "weight_decay": trunk.get("weight_decay"),
            }
        }

    def state_dict(self) -> dict[str, Any]:
        return {"trunk": dict(self.trunk)}
