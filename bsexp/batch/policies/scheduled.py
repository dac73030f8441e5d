"""batch=scheduled: the global batch grows as `batch.schedule` says (Smith et al. 2018); a batch above
the micro-batch cap (`batch.micro_size`, or what the finder found with `batch.find_micro_size`)
is reached by accumulation. The LR follows the batch through `scaling.lr_rule`
(`batch.schedule.couple_lr`), ramped over `batch.schedule.ramp_steps`; the weight decay stays."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from bsexp.batch import scaling
from bsexp.batch.hparams import Rules
from bsexp.batch.layout import Layout
from bsexp.batch.plan import MIN_MICRO, BatchPlan, plan_for
from bsexp.batch.policies.finder import FinderConfig
from bsexp.batch.policies.shared import BatchConfig, Policy, Probe, RunSpec, fits_data, run_steps
from bsexp.batch.schedule import BatchSchedule
from bsexp.errors import ConfigError
from bsexp.fields import at_least, bounded, choice, positive

SEESAW = "seesaw"
ScheduleKind = choice("ScheduleKind", "step", "linear", "exponential", "list", SEESAW, module=__name__)
# What milestones and list points count: epochs, optimizer steps, or training samples seen (for a
# language model, sequences: x data.context for the tokens; Merrill et al. grow the batch at tokens seen)
ScheduleUnit = choice("ScheduleUnit", "epochs", "steps", "samples", module=__name__)


@dataclass
class BatchScheduleConfig:
    kind: ScheduleKind = ScheduleKind.step
    unit: ScheduleUnit = ScheduleUnit.epochs  # of `milestones` and `points`
    milestones: List[float] = bounded(low=0, factory=lambda: [8.0, 14.0])  # step: batch x factor at each
    factor: float = positive(5.0)  # step (Smith et al. 2018 grow the batch x5 where the LR would drop /5)
    end: Optional[int] = at_least(1, None)  # linear / exponential: the batch of the last epoch
    points: List[List[int]] = field(default_factory=list)  # list: [[when, batch], ...] from 0, `when` in `unit`
    round_to: int = at_least(1, 8)  # linear / exponential: batches are multiples of round_to x world size
    couple_lr: bool = True  # the LR follows the batch through scaling.lr_rule; false: held fixed
    ramp_steps: int = at_least(0, 0)  # ramp an LR change over this many steps


@dataclass
class ScheduledBatch(BatchConfig):
    policy: Policy = Policy.scheduled
    size: int = at_least(1, 32)  # the global batch the schedule starts from
    micro_size: Optional[int] = at_least(1, None)  # per rank: larger scheduled batches accumulate micro-batches
    find_micro_size: bool = False  # run the batch finder for the micro-batch that fits
    finder: FinderConfig = field(default_factory=FinderConfig)
    schedule: BatchScheduleConfig = field(default_factory=BatchScheduleConfig)


class Scheduled:
    name = "scheduled"
    config = ScheduledBatch

    def __init__(self, config: ScheduledBatch, spec: RunSpec) -> None:
        self.batch, self.spec = config, spec
        self.found = None

    def searches(self) -> bool:
        return bool(self.batch.find_micro_size)

    def _schedule(self, start: int) -> BatchSchedule:
        node, world, epochs = self.batch.schedule, self.spec.world_size, self.spec.epochs
        if node.kind == SEESAW:  # the batch x alpha at the LR schedule's own decay points
            lr = self.spec.rules
            return BatchSchedule(
                start=start,
                world_size=world,
                kind="step",
                unit=str(lr.unit),
                milestones=tuple(lr.milestones),
                factor=1 / lr.factor,
                epochs=epochs,
            )
        return BatchSchedule(
            start=start,
            world_size=world,
            kind=str(node.kind),
            unit=str(node.unit),
            milestones=tuple(node.milestones),
            factor=node.factor,
            end=node.end,
            epochs=epochs,
            points=tuple((p[0], p[1]) for p in node.points),
            round_to=node.round_to,
        )

    def check(self) -> BatchPlan:
        """Every batch the schedule reaches must split over the ranks."""
        batch, node, world = self.batch, self.batch.schedule, self.spec.world_size
        if node.kind == SEESAW:
            _check_seesaw(self.spec.rules)
        milestones = list(node.milestones)
        if milestones != sorted(milestones):
            raise ConfigError("batch.schedule.milestones", milestones, "must be non-negative and increasing")
        if node.kind in ("linear", "exponential") and node.end is None:
            raise ConfigError("batch.schedule.end", None, f"batch.schedule.kind={node.kind} needs the final batch")
        if node.kind == "list":
            _check_points([list(p) for p in node.points], batch.size, str(node.unit))
        sizes = self._schedule(batch.size).sizes(self.spec.epochs)
        for size in sizes:
            if size < world * MIN_MICRO or size % world:
                key = "batch.schedule" if size != batch.size else "batch.size"
                raise ConfigError(
                    key,
                    size,
                    f"every scheduled batch must be a multiple of the world size {world} "
                    f"and at least {world * MIN_MICRO} ({MIN_MICRO} samples a rank); the "
                    f"schedule reaches {sizes}",
                )
        return plan_for(batch.size, world, batch.micro_size)

    def check_data(self, n_train: int, data: str = "the data") -> None:
        fits_data(self._schedule(self.batch.size).sizes(self.spec.epochs), n_train, data)

    def lay_out(self, probe: Probe, state: dict | None = None) -> Layout:
        batch, start, world = self.batch, self.batch.size, self.spec.world_size
        micro_size_cap = batch.micro_size
        if batch.find_micro_size and state is None:  # the largest micro-batch that fits bounds them all
            largest = max(self._schedule(start).sizes(self.spec.epochs)) // world
            if largest * world <= probe.n_train:
                self.found = probe.find(largest=largest)
                micro_size_cap = (
                    self.found.micro_size if micro_size_cap is None else min(micro_size_cap, self.found.micro_size)
                )
        run = run_steps(self.spec, self._schedule(start), probe.n_train)
        return Layout(
            run,
            world,
            plan_for(start, world, micro_size_cap),
            micro_size_cap=micro_size_cap,
            lr_coupling=tuple(self._coupling(run.sizes)),
        )

    def _coupling(self, sizes: tuple[int, ...]) -> list[float]:
        node, rules = self.batch.schedule, self.spec.rules
        if node.kind == SEESAW:
            # Seesaw (Meterez et al. 2025): where the step schedule multiplies the LR by 1/alpha, the
            # batch grows x alpha and the LR falls by 1/sqrt(alpha) only: x sqrt(batch / start) on it.
            return [(size / sizes[0]) ** 0.5 for size in sizes]
        return scaling.lr_coupling(sizes, rules.ref_batch, rules.lr_rule, node.couple_lr, node.ramp_steps)


def _check_seesaw(main: Rules) -> None:
    if str(main.main) != "step" or not main.milestones:
        raise ConfigError(
            "batch.schedule.kind",
            "seesaw",
            "needs schedule.main=step with schedule.milestones: the batch grows where the LR would decay",
        )
    alpha = 1 / main.factor
    if main.factor >= 1 or abs(alpha - round(alpha)) > 1e-6:
        raise ConfigError(
            "schedule.factor",
            main.factor,
            "must be 1/alpha for a whole alpha >= 2 under batch.schedule.kind=seesaw (the batch grows x alpha)",
        )


def _check_points(points: list[list[int]], size: int, unit: str) -> None:
    if (
        not points
        or any(len(p) != 2 for p in points)
        or points[0][0] != 0
        or [p[0] for p in points] != sorted(p[0] for p in points)
    ):
        when = unit.rstrip("s")
        valid = f"must be [[0, batch], [{when}, batch], ...] in {when} order (batch.schedule.unit={unit})"
        raise ConfigError("batch.schedule.points", points, valid)
    if points[0][1] != size:
        raise ConfigError("batch.schedule.points", points, f"must start at batch.size ([0, {size}])")
