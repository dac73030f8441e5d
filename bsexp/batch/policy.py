"""Batch policies: which `BatchPlan` every optimizer step of a run uses. One class per `batch=`
option, behind one small interface; a new policy is one new class and one config file.

A policy is made from the config and the world size (`policy_for`), checks what it can without
data (`check`, run before anything is written), then `resolve`s against the data, the model and
the world: it fixes the global batch of every step (`run_steps`), the largest micro-batch known
to fit (`micro_cap`; the finder measures it) and the LR/WD that follow from them (`hparams`).
The loop then asks `plan(step)`; an out-of-memory error asks `after_oom(plan)` for the same
global batch in smaller micro-batches. Its state (the plan in force, the cap, what was found)
goes into checkpoints.

Torch-free at import: the finder is imported only by the policies that search.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from bsexp.batch import scaling
from bsexp.batch.adaptive import Controller, adascale_gain, efficiency
from bsexp.batch.plan import MIN_MICRO, BatchPlan, PlanError, make_plan, plan_for
from bsexp.batch.schedule import BatchSchedule, RunSteps
from bsexp.config.env import world_size
from bsexp.config.schema import Policy, ScheduleKind
from bsexp.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass
class Probe:
    """What a policy may measure with when it resolves: the data, the built model (unwrapped, on
    the device), the world, and a way to measure the gradient noise scale B_simple by training a
    copy of the run for `steps` steps at `batch` (bsexp.loop provides it)."""

    splits: Any
    model: Any
    world: Any
    measure_noise: Callable[[int, int], float | None] | None = None


def _plan_error(exc: PlanError) -> ConfigError:
    return ConfigError(exc.key, exc.value, exc.expected)


class BatchPolicy:
    """The interface, and what every policy shares: a run of steps laid out by a `BatchSchedule`,
    split by `plan_for` under the micro-batch cap."""

    name = ""
    measures_noise = False  # whether the policy needs B_simple measured on every step (side halves)
    own_setup = True  # whether the run's set-up is its own to caution about (a branch continues its trunk's)

    def __init__(self, cfg: DictConfig, world: int) -> None:
        self.cfg, self.world = cfg, world
        self.run_steps: RunSteps | None = None  # set by resolve
        self.micro_cap: int | None = None  # the largest micro-batch per rank known to fit (None: any)
        self.oom_recoveries = 0
        self.found = None  # the finder's result (bsexp.batch.finder.FinderResult), where it ran
        self.found_plan: BatchPlan | None = None  # what the finder chose (kept in checkpoints)
        self._plan: BatchPlan | None = None  # in force

    # ---------------------------------------------------------------- the interface

    def check(self) -> BatchPlan | None:
        """What the config alone can tell is wrong (ConfigError); returns the first step's plan
        where the config alone decides it (None: the data or a measurement will)."""
        return None

    def searches(self) -> bool:
        """Whether resolving afresh (not from a checkpoint) runs the batch finder."""
        return bool(self.cfg.batch.get("find_micro_size", False))

    def resolve(self, probe: Probe, state: dict | None = None) -> None:
        """Fix the run: the global batch of every step and the micro-batch cap; `state` is a
        checkpoint's (`state_dict`), whose choices are taken instead of measured again."""
        n_train = len(probe.splits.train)
        start = self._start(probe, state, n_train)
        self.lay_out(n_train, start, probe.splits.name)
        if state is not None:
            self.load_state_dict(state)

    def check_data(self, n_train: int, data: str = "the data", start: int | None = None) -> None:
        """Every batch the run asks for fits in the `n_train` training samples (checked as soon as
        the data is known, before a model is built or anything measured)."""
        start = self.cfg.batch.size if start is None else start
        if start is None:  # the finder decides it, within the data
            return
        sizes = self.schedule(start).sizes(self.cfg.epochs)
        if max(sizes) > n_train:
            key, value = ("batch.size", start) if len(sizes) == 1 else ("batch.schedule", sizes)
            raise ConfigError(
                key, value, f"{'grows past' if len(sizes) > 1 else 'exceeds'} the {n_train} training samples of {data}"
            )

    def lay_out(self, n_train: int, start: int | None = None, data: str = "the data") -> None:
        """The run step by step for `n_train` training samples, from the global batch `start`
        (default: batch.size), and the first step's plan. Pure: what resolve does once any
        measuring is done (and what a test of the policy calls directly)."""
        start = self.cfg.batch.size if start is None else start
        self.check_data(n_train, data, start)
        self.run_steps = self._run_steps(start, n_train)
        self._plan = self.first_plan(start)

    def _run_steps(self, start: int, n_train: int) -> RunSteps:
        """Every step of the run from the global batch `start`, as `schedule` lays it out."""
        cfg = self.cfg
        return self.schedule(start).run_steps(cfg.epochs, n_train, cfg.batch.drop_last, cfg.trainer.max_steps)

    def plan(self, step: int) -> BatchPlan:
        """The plan of optimizer step `step` (counted over the run)."""
        size = self.run_steps.sizes[step]
        if self._plan.size != size:  # the schedule moved on
            self._plan = plan_for(size, self.world, self.micro_cap)
        return self._plan

    def after_oom(self, plan: BatchPlan) -> BatchPlan:
        """The same global batch in micro-batches half as large: the LR and weight decay stay."""
        self.micro_cap = plan.micro_size // 2
        self._plan = plan_for(plan.size, plan.world_size, self.micro_cap)
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

    def schedule(self, start: int) -> BatchSchedule:
        """The global batch of each step: constant, unless the policy schedules it."""
        return BatchSchedule(start=start, world_size=self.world)

    def adapt(self, step: int, parts) -> None:
        """Called after every optimizer step with the number of steps taken and the training
        step's parts (bsexp.step.Step): a closed-loop policy may change the batch of the steps
        to come. Open-loop policies decided everything in `resolve`."""
        return None

    def epoch_sizes(self, epoch: int) -> EpochSizes:
        """The global batch of each step of `epoch`, read as the epoch goes (a policy may change
        the steps ahead between two steps)."""
        return EpochSizes(self, epoch)

    def record(self) -> dict[str, Any]:
        """What the policy adds to each metrics record."""
        return {}

    def summary(self, samples_seen: int) -> dict[str, Any]:
        """What the policy adds to summary.json, for a run that has seen `samples_seen` samples."""
        return {}

    def figures(self, records: list[dict[str, Any]], run_dir: Path) -> dict[str, str]:
        """Figures the policy draws in the run directory at the end: {W&B key: file name}."""
        return {}

    def lr_coupling(self) -> tuple[float, ...]:
        """Per step, how the LR follows the batch relative to the first step's (empty: it does not)."""
        return ()

    def first_plan(self, start: int) -> BatchPlan:
        return plan_for(start, self.world, self.micro_cap)

    # ---------------------------------------------------------------- shared

    @property
    def current(self) -> BatchPlan:
        """The plan in force (after a schedule change or an OOM recovery)."""
        return self._plan

    def hparams(self) -> tuple[scaling.ScaledHparams, scaling.LRFactors]:
        """The LR and weight decay at the first step's batch, by the scaling rules, and the LR's
        multiplier at every step: warmup and main schedule, times the coupling to the batch."""
        cfg, run, counted = self.cfg, self.run_steps, self.lr_layout()
        rule = str(cfg.scaling.lr_rule)
        k = scaling.scale_factor(self.first_batch(), cfg.scaling.ref_batch)
        lr = scaling.scaled_lr(cfg.optimizer.lr, k, rule)
        wd = scaling.scaled_weight_decay(cfg.optimizer.weight_decay, k, str(cfg.scaling.wd_rule))
        node = cfg.schedule
        # Counted in samples seen, so that a batch that changes (batch=scheduled) can neither stretch
        # nor cut the warmup or the decay; lengths given in steps are the samples of those steps.
        in_samples = (
            (lambda steps: counted.samples_before_step(int(round(steps))))
            if node.unit == "steps"
            else counted.samples_at
        )
        warmup = 0 if node.warmup_shape == "none" else in_samples(node.warmup)
        lr_schedule = scaling.LRSchedule(
            total=counted.total_samples,
            warmup=warmup,
            warmup_shape=str(node.warmup_shape),
            start_factor=scaling.warmup_start_factor(node.start_factor, k, rule),
            main=str(node.main),
            milestones=tuple(in_samples(m) for m in node.milestones),
            factor=node.factor,
            final_factor=node.final_factor,
        )
        factors = self.lr_factors(lr_schedule)
        peak = lr * max((factors(step) for step in range(run.total)), default=1.0)
        warmup_steps = sum(1 for position in self.lr_positions() if position < warmup)
        return scaling.ScaledHparams(k, lr, peak, wd, warmup_steps, run.total), factors

    def lr_factors(self, lr_schedule: scaling.LRSchedule):
        """The LR multiplier of every step (a callable of the step, as torch's LambdaLR takes)."""
        return scaling.LRFactors(lr_schedule, self.lr_coupling(), self.lr_positions())

    def lr_positions(self) -> tuple[float, ...]:
        """Where the LR schedule stands before each step, in the samples `lr_layout` counts."""
        return self.run_steps.before

    def first_batch(self) -> int:
        """The global batch the LR and weight decay are scaled for (the first step's), and the
        batch a checkpoint's run is known by."""
        return self.run_steps.sizes[0] if self.run_steps.sizes else self._plan.size

    def lr_layout(self) -> RunSteps:
        """The run the LR schedule's length, warmup and milestones are counted against: this one
        (a branch counts them against its trunk's)."""
        return self.run_steps

    def eval_steps(self) -> tuple[int, ...]:
        """Steps (counted after them) at which the policy wants an evaluation, besides the
        trainer's own interval."""
        return ()

    def epochs_done(self, state) -> float:
        """Epochs trained so far, counting a partial epoch by its steps (what records call `epoch`);
        a run cut within an epoch (max_steps, AdaScale's length) by the steps that epoch would
        have had: the loop has ended it, but not all of it was trained."""
        run, epoch, steps = self.run_steps, state.epoch, state.in_epoch
        if not steps and epoch == len(run.epoch_starts) and run.cut_epoch:  # the last step ended the cut epoch
            epoch, steps = epoch - 1, len(run.epoch(epoch - 1))
        whole = run.epoch_steps(epoch) if epoch < len(run.epoch_starts) else 0
        return epoch + (steps / whole if whole else 0.0)

    def described(self, hp: scaling.ScaledHparams) -> scaling.ScaledHparams:
        """The LR and weight decay to announce and summarise (those of the first step)."""
        return hp

    def begin(self, parts, step: int) -> None:
        """Called once the run's parts are built and restored, before step `step` is taken: a
        branch sets its weight decay and LR here."""
        return None

    @staticmethod
    def _set_lr(parts, step: int) -> None:
        """Set the optimizer's LR of step `step` from the scheduler's multipliers (after the layout
        changed under the scheduler)."""
        scheduler = parts.scheduler
        if scheduler is None:
            return
        for group, base, factor in zip(parts.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
            group["lr"] = base * factor(step)
        scheduler._last_lr = [group["lr"] for group in parts.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {"plan": asdict(self._plan), "micro_cap": self.micro_cap, "oom_recoveries": self.oom_recoveries}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._plan = BatchPlan(**state["plan"])
        self.micro_cap, self.oom_recoveries = state["micro_cap"], state["oom_recoveries"]

    def _start(self, probe: Probe, state: dict | None, n_train: int) -> int:
        """The global batch of the first step."""
        return self.cfg.batch.size

    def _make_plan(self, *args, **kwargs) -> BatchPlan:
        try:
            return make_plan(*args, **kwargs)
        except PlanError as exc:
            raise _plan_error(exc) from None


class FixedPolicy(BatchPolicy):
    """batch=fixed: `batch.size` every step, one micro-step a rank."""

    name = "fixed"

    def check(self) -> BatchPlan:
        return self._make_plan(self.cfg.batch.size, self.world)


class AccumulationPolicy(BatchPolicy):
    """batch=accumulation: `batch.size` every step, in micro-batches of `batch.micro_size` (or
    `batch.accum_steps` of them) on each rank."""

    name = "accumulation"

    def check(self) -> BatchPlan:
        return self._given()

    def _given(self) -> BatchPlan:
        batch = self.cfg.batch
        if batch.micro_size is None and batch.accum_steps is None:
            raise ConfigError(
                "batch.micro_size", None, "batch=accumulation needs batch.micro_size (per rank) or batch.accum_steps"
            )
        return self._make_plan(batch.size, self.world, batch.micro_size, batch.accum_steps)

    def first_plan(self, start: int) -> BatchPlan:
        plan = self._given()
        self.micro_cap = plan.micro_size
        return plan


class FinderPolicy(BatchPolicy):
    """batch=finder: the largest micro-batch whose training step and evaluation fit in memory,
    less the margin; `batch.size` kept through accumulation when given, else the found size x
    the ranks (or, with objective=noise_scale, the batch nearest the measured B_simple)."""

    name = "finder"

    def searches(self) -> bool:
        return True

    def check(self) -> None:
        size = self.cfg.batch.size
        if size is not None and size % self.world:
            raise ConfigError("batch.size", size, f"must be divisible by the world size {self.world}")
        return None

    def _start(self, probe: Probe, state: dict | None, n_train: int) -> int:
        if state is not None:  # the plan found before, not a new search
            self.found_plan = BatchPlan(**state["found_plan"])
            return self.found_plan.size
        from bsexp.batch.finder.find import find_plan

        keep = self.cfg.batch.size  # kept through accumulation (check_data: within the data)
        self.found = find_plan(self.cfg, probe.world, probe.splits, probe.model.to(probe.world.device), keep_size=keep)
        self.micro_cap = self.found.plan.micro_size
        self.found_plan = self.found.plan
        if str(self.cfg.batch.finder.objective) == "noise_scale":
            self.found_plan = self._noise_scale_plan(probe, n_train)
        return self.found_plan.size

    def first_plan(self, start: int) -> BatchPlan:
        return self.found_plan

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "found_plan": asdict(self.found_plan)}

    def _noise_scale_plan(self, probe: Probe, n_train: int) -> BatchPlan:
        """objective=noise_scale: train a copy of the run for batch.finder.noise_steps steps at
        batch.finder.noise_batch (at most what fits), measuring B_simple (McCandlish et al. 2018),
        then take the batch nearest it that fits in memory and divides over the ranks. The run
        then trains exactly as batch=fixed at that batch would."""
        node, world, found = self.cfg.batch.finder, self.world, self.found
        quantum = 2 * world  # two halves on every rank
        fits = found.micro_size * world
        measure = max(quantum * MIN_MICRO, min(node.noise_batch, fits, n_train) // quantum * quantum)
        b_simple = probe.measure_noise(measure, node.noise_steps)
        if b_simple is None:
            raise ConfigError(
                "batch.finder.noise_steps",
                node.noise_steps,
                "too few to estimate the gradient noise scale (|G|^2 not yet positive); measure for more steps",
            )
        target = min(max(b_simple, world * MIN_MICRO), fits, n_train)
        size = max(world * MIN_MICRO, round(target / world) * world)
        if size > fits:
            size -= world
        found.noise_b_simple = b_simple
        found.note = (
            f"Noise-scale objective: B_simple = {b_simple:,.0f} measured over {node.noise_steps} steps at "
            f"batch {measure}; the nearest batch that fits (at most {fits}) and divides over {world} "
            f"rank(s) is {size}."
        )
        found.plan = make_plan(size, world)
        log.info(
            "gradient noise scale B_simple = %.0f (measured over %d steps at batch %d): training at batch %d",
            b_simple,
            node.noise_steps,
            measure,
            size,
        )
        return found.plan


class ScheduledPolicy(BatchPolicy):
    """batch=scheduled: the global batch grows as `batch.schedule` says (Smith et al. 2018); a
    batch above the micro-batch cap (`batch.micro_size`, or what the finder found with
    `batch.find_micro_size`) is reached by accumulation. The LR follows the batch through
    `scaling.lr_rule` (`batch.schedule.couple_lr`), ramped over `batch.schedule.ramp_steps`."""

    name = "scheduled"

    def schedule(self, start: int) -> BatchSchedule:
        node = self.cfg.batch.schedule
        if node.kind == ScheduleKind.seesaw:  # the batch x alpha at the LR schedule's own decay points
            lr = self.cfg.schedule
            return BatchSchedule(
                start=start,
                world_size=self.world,
                kind="step",
                unit=str(lr.unit),
                milestones=tuple(lr.milestones),
                factor=1 / lr.factor,
                epochs=self.cfg.epochs,
            )
        return BatchSchedule(
            start=start,
            world_size=self.world,
            kind=str(node.kind),
            unit=str(node.unit),
            milestones=tuple(node.milestones),
            factor=node.factor,
            end=node.end,
            epochs=self.cfg.epochs,
            points=tuple((p[0], p[1]) for p in node.points),
            round_to=node.round_to,
        )

    def check(self) -> BatchPlan:
        """Every batch the schedule reaches must split over the ranks."""
        cfg, node, world = self.cfg, self.cfg.batch.schedule, self.world
        if node.kind == ScheduleKind.seesaw:
            main = cfg.schedule
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
        milestones = list(node.milestones)
        if milestones != sorted(milestones):
            raise ConfigError("batch.schedule.milestones", milestones, "must be non-negative and increasing")
        if node.kind in (ScheduleKind.linear, ScheduleKind.exponential) and node.end is None:
            raise ConfigError("batch.schedule.end", None, f"batch.schedule.kind={node.kind} needs the final batch")
        if node.kind == ScheduleKind.list:
            points = [list(p) for p in node.points]
            if (
                not points
                or any(len(p) != 2 for p in points)
                or points[0][0] != 0
                or [p[0] for p in points] != sorted(p[0] for p in points)
            ):
                raise ConfigError(
                    "batch.schedule.points", points, "must be [[0, batch], [epoch, batch], ...] in epoch order"
                )
            if points[0][1] != cfg.batch.size:
                raise ConfigError("batch.schedule.points", points, f"must start at batch.size ([0, {cfg.batch.size}])")
        try:
            sizes = self.schedule(cfg.batch.size).sizes(cfg.epochs)
        except PlanError as exc:
            raise _plan_error(exc) from None
        for size in sizes:
            if size < world * MIN_MICRO or size % world:
                key = "batch.schedule" if size != cfg.batch.size else "batch.size"
                raise ConfigError(
                    key,
                    size,
                    f"every scheduled batch must be a multiple of the world size {world} "
                    f"and at least {world * MIN_MICRO} ({MIN_MICRO} samples a rank); the "
                    f"schedule reaches {sizes}",
                )
        try:
            return plan_for(cfg.batch.size, world, cfg.batch.micro_size)
        except PlanError as exc:
            raise _plan_error(exc) from None

    def _start(self, probe: Probe, state: dict | None, n_train: int) -> int:
        cfg = self.cfg
        self.micro_cap = cfg.batch.micro_size
        if cfg.batch.find_micro_size and state is None:  # the largest micro-batch that fits bounds them all
            from bsexp.batch.finder.find import find_plan

            largest = max(self.schedule(cfg.batch.size).sizes(cfg.epochs)) // self.world
            if largest * self.world <= n_train:
                self.found = find_plan(
                    cfg, probe.world, probe.splits, probe.model.to(probe.world.device), largest=largest
                )
                cap = self.found.micro_size
                self.micro_cap = cap if self.micro_cap is None else min(self.micro_cap, cap)
        return cfg.batch.size

    def lr_coupling(self) -> tuple[float, ...]:
        node = self.cfg.batch.schedule
        if node.kind == ScheduleKind.seesaw:
            # Seesaw (Meterez et al. 2025): where the step schedule multiplies the LR by 1/alpha, the
            # batch grows x alpha and the LR falls by 1/sqrt(alpha) only: x sqrt(batch / start) on it.
            start = self.run_steps.sizes[0]
            return tuple((size / start) ** 0.5 for size in self.run_steps.sizes)
        return tuple(
            scaling.lr_coupling(
                self.run_steps.sizes,
                self.cfg.scaling.ref_batch,
                str(self.cfg.scaling.lr_rule),
                node.couple_lr,
                node.ramp_steps,
            )
        )


class SteppedPolicy(BatchPolicy):
    """A run whose global batch changes at given steps (`points`: (step, batch from it on)), the
    LR following the batch by scaling.lr_rule (or by a gain, `gains`) relative to the first
    batch's, counted in samples so that warmup and decay are neither stretched nor cut. The
    adaptive controller and branches of another run are two of them."""

    def __init__(self, cfg: DictConfig, world: int) -> None:
        super().__init__(cfg, world)
        self.points: list[tuple[int, int]] = []  # (step, global batch from that step on)
        self.gains: list[tuple[int, float]] = []  # (step, LR gain from that step on): AdaScale's r, or 1
        self.n_train = 0
        self._positions: tuple[float, ...] = ()  # where the LR schedule stands before each step (samples)
        self._coupling: tuple[float, ...] = ()

    def schedule(self, start: int) -> BatchSchedule:
        return BatchSchedule(
            start=start, world_size=self.world, kind="by_step", step_points=tuple(self.points) or ((0, start),)
        )

    def lay_out(self, n_train: int, start: int | None = None, data: str = "the data") -> None:
        super().lay_out(n_train, start, data)
        self.n_train = n_train
        self._follow()

    def _relay_out(self) -> None:
        """The run from the batches decided so far: steps already taken keep their batches."""
        self.run_steps = self._run_steps(self.points[0][1], self.n_train)
        self._follow()

    def first_batch(self) -> int:
        """The batch the coupling is relative to (a branch from step 0 takes its own at once)."""
        return self.points[0][1]

    def _by_gain(self) -> bool:
        """Whether the LR follows `gains` (AdaScale) rather than the batch through the rule."""
        return False

    def _step_gains(self, steps: int) -> list[float]:
        """The LR gain in force at each of the first `steps` steps (AdaScale's r; 1 where the LR
        follows the rule)."""
        starts = [g[0] for g in self.gains]
        return [self.gains[max(0, bisect.bisect_right(starts, step) - 1)][1] for step in range(steps)]

    def _progress(self, run: RunSteps, gains: list[float] | None = None) -> list[float]:
        """Where the LR schedule stands before each step of `run` and after its last: samples, or
        with gains (AdaScale) scale-invariant samples, r b0-steps of progress a step of S x b0
        (taken x r / S samples of b0). `gains`: `_step_gains(run.total)`, where already at hand."""
        b0, by_gain = self.points[0][1], self._by_gain()
        if by_gain and gains is None:
            gains = self._step_gains(run.total)
        out, seen = [0.0], 0.0
        for step, (size, taken) in enumerate(zip(run.sizes, run.taken or run.sizes)):
            seen += taken * gains[step] * b0 / size if by_gain else taken
            out.append(seen)
        return out

    def _follow(self) -> None:
        """The LR's position and coupling to the batch before every step, from the run as laid
        out now."""
        run, b0 = self.run_steps, self.points[0][1]
        ref, rule = self.cfg.scaling.ref_batch, str(self.cfg.scaling.lr_rule)
        gains = self._step_gains(run.total) if self._by_gain() else None
        if gains is not None:
            coupling = gains
        else:
            coupling = [
                scaling.rule_multiplier(rule, size / ref) / scaling.rule_multiplier(rule, b0 / ref)
                for size in run.sizes
            ]
        self._positions, self._coupling = tuple(self._progress(run, gains)[:-1]), tuple(coupling)

    def lr_positions(self) -> tuple[float, ...]:
        return self._positions

    def lr_factors(self, lr_schedule: scaling.LRSchedule):
        # A function, not an object: torch's LambdaLR saves (and on loading, overwrites) the
        # attributes of a callable object, which would cut it off from this policy.
        def factor(step: int) -> float:
            return scaling.LRFactors(lr_schedule, self._coupling, self._positions)(step)

        return factor

    def first_plan(self, start: int) -> BatchPlan:
        size = self.run_steps.sizes[0] if self.run_steps and self.run_steps.sizes else start
        return plan_for(size, self.world, self.micro_cap)


class AdaptivePolicy(SteppedPolicy):
    """batch=adaptive: a closed loop. Every `batch.adaptive.interval` steps the controller
    (bsexp.batch.adaptive) sets the global batch of the steps ahead from the measured gradient
    noise scale; all ranks take the same decision. The run is laid out again from that step on:
    the data, the LR (by scaling.lr_rule, or AdaScale's gain) and the weight decay (by
    scaling.wd_rule) follow, with warmup and decay counted in samples, so a change of batch
    neither stretches nor cuts them. Batches above the micro-batch cap accumulate."""

    name = "adaptive"
    measures_noise = True

    def __init__(self, cfg: DictConfig, world: int) -> None:
        super().__init__(cfg, world)
        self.decisions: list[dict[str, Any]] = []
        self.rates: list[tuple[int, float]] = []  # (micro-batch, samples/s) of the finder's trials

    def check(self) -> BatchPlan:
        node, world, size = self.cfg.batch.adaptive, self.world, self.cfg.batch.size
        low = node.min_size if node.min_size is not None else size
        if size % world or size < world * MIN_MICRO:
            raise ConfigError(
                "batch.size", size, f"must be a multiple of the world size {world} and at least {world * MIN_MICRO}"
            )
        if not low <= size:
            raise ConfigError("batch.adaptive.min_size", low, f"must be at most batch.size={size}")
        if node.max_size is not None and node.max_size < size:
            raise ConfigError("batch.adaptive.max_size", node.max_size, f"must be at least batch.size={size}")
        if str(self.cfg.trainer.noise_scale) == "off":
            raise ConfigError(
                "trainer.noise_scale", "off", "batch=adaptive steers by the measured noise scale: use auto or always"
            )
        if not self.cfg.data.get("in_memory", True):
            raise ConfigError(
                "batch.policy",
                "adaptive",
                "needs the data in memory (data.in_memory=true): the steps ahead change as the run goes",
            )
        if str(node.objective) == "goodput" and not self.cfg.batch.find_micro_size:
            raise ConfigError(
                "batch.adaptive.objective",
                "goodput",
                "needs the finder's throughput at each size: set batch.find_micro_size=true",
            )
        try:
            return plan_for(size, world, self.cfg.batch.micro_size)
        except PlanError as exc:
            raise _plan_error(exc) from None

    def controller(self) -> Controller:
        node, size = self.cfg.batch.adaptive, self.cfg.batch.size
        high = self.n_train if node.max_size is None else min(node.max_size, self.n_train)
        return Controller(
            start=size,
            min_size=node.min_size if node.min_size is not None else size,
            max_size=high,
            quantum=self.world,
            c=node.c,
            power=node.power,
            max_growth=node.max_growth,
            shrink=node.shrink,
            objective=str(node.objective),
        )

    def _start(self, probe: Probe, state: dict | None, n_train: int) -> int:
        cfg = self.cfg
        self.n_train, self.micro_cap = n_train, cfg.batch.micro_size
        self.points, self.gains = [(0, cfg.batch.size)], [(0, 1.0)]
        if cfg.batch.find_micro_size and state is None:
            from bsexp.batch.finder.find import find_plan

            largest = self.controller().max_size // self.world
            self.found = find_plan(cfg, probe.world, probe.splits, probe.model.to(probe.world.device), largest=largest)
            cap = self.found.micro_size
            self.micro_cap = cap if self.micro_cap is None else min(self.micro_cap, cap)
            self.rates = sorted((t.size, t.samples_per_s) for t in self.found.trials if t.ok and t.samples_per_s)
        return cfg.batch.size

    def check_data(self, n_train: int, data: str = "the data", start: int | None = None) -> None:
        start = self.cfg.batch.size if start is None else start
        if start > n_train:
            raise ConfigError("batch.size", start, f"exceeds the {n_train} training samples of {data}")

    def _by_gain(self) -> bool:
        return str(self.cfg.batch.adaptive.lr) == "adascale"

    def schedule(self, start: int) -> BatchSchedule:
        return dataclasses.replace(super().schedule(start), balance_tail=True)

    def lr_layout(self) -> RunSteps:
        """The run of `epochs` (cut at trainer.max_steps) at the first batch: the budget the
        schedule is counted against, in samples (with AdaScale, scale-invariant ones). Counted
        against this run instead, a cap in steps (or drop_last) would end the schedule where the
        first batch's run ends, long before a grown batch's does, and a resumed run, its
        batches grown, would count warmup steps and the cap otherwise than the run it resumes."""
        cfg = self.cfg
        return BatchSchedule(start=self.points[0][1], world_size=self.world).run_steps(
            cfg.epochs, self.n_train, cfg.batch.drop_last, cfg.trainer.max_steps
        )

    def _run_steps(self, start: int, n_train: int) -> RunSteps:
        """The steps until the schedule's position reaches the end of `lr_layout`, the budget: the
        run ends with its schedule. In samples, that is `epochs` of them (a cap in steps or
        drop_last, a budget of the first batch's steps). With AdaScale, AdaScale's length
        (Johnson et al. 2020, Algorithm 1: train while the scale-invariant iterations τ, advanced r
        a step, are below the budget T), the steps ahead at the gain in force: a gain below the
        scale S takes more samples than `epochs` (up to S times as many)."""
        cfg = self.cfg
        budget, epochs = self.lr_layout().total_samples, cfg.epochs
        while True:
            run = self.schedule(start).run_steps(epochs, n_train, cfg.batch.drop_last, cfg.trainer.max_steps)
            progress = self._progress(run)
            if progress[-1] >= budget or not run.total or run.total == cfg.trainer.max_steps:
                return run.first(bisect.bisect_left(progress, budget, hi=run.total))
            per_epoch = progress[-1] - progress[run.epoch_starts[-1]]  # the last epoch's, at the gain ahead
            if per_epoch <= 0:
                return run
            epochs += max(1, math.ceil((budget - progress[-1]) / per_epoch))

    def adapt(self, step: int, parts) -> None:
        node = self.cfg.batch.adaptive
        if not step % node.interval and step < self.run_steps.total:
            self._decide(step, parts)
        self._follow_weight_decay(step, parts)

    def _follow_weight_decay(self, step: int, parts) -> None:
        """The weight decay follows the batch by its rule, from the step the batch changes."""
        sizes = self.run_steps.sizes
        if 0 < step < len(sizes) and sizes[step] != sizes[step - 1]:
            ratio = scaling.rule_multiplier(str(self.cfg.scaling.wd_rule), sizes[step] / sizes[step - 1])
            for group in parts.optimizer.param_groups:
                group["weight_decay"] *= ratio

    def _from_step(self, step: int, size: int) -> int | None:
        """The step a batch decided at `step` starts at: this one; or, where at `size` this step
        would end its epoch on less than half a batch (a rest the step before, already taken,
        cannot share), the next epoch's first (None: no epoch follows, the batch stays)."""
        run = self.run_steps
        epoch = bisect.bisect_right(run.epoch_starts, step) - 1
        left = run.n - sum(run.taken[run.epoch_starts[epoch] : step])
        if size <= 2 * left or self.cfg.batch.drop_last:
            return step
        return run.epoch_starts[epoch + 1] if epoch + 1 < len(run.epoch_starts) else None

    def _decide(self, step: int, parts) -> None:
        node = self.cfg.batch.adaptive
        current = self.run_steps.sizes[step]
        decided = None
        if parts.world.is_main:  # one decision for every rank: rank 0's (its throughput is its own)
            averaged = parts.noise.scale.averaged() if parts.noise is not None else None
            b_simple = averaged[1] / averaged[0] if averaged is not None and averaged[0] > 0 else None
            decision = self.controller().next_size(current, b_simple, self._throughput(), step)
            gain = 1.0
            if str(node.lr) == "adascale":
                gain = adascale_gain(decision.b_simple, self.points[0][1], decision.size, kept=self.gains[-1][1])
            decided = decision, gain, b_simple
        decision, gain, b_simple = parts.world.broadcast_object(decided)
        size = decision.size
        at = self._from_step(step, size)
        if at is None:  # the last epoch's last step: the batch stays to the end
            size, gain, at = current, self.gains[-1][1], step
        self.decisions.append(
            {
                "step": step,
                "b_simple": decision.b_simple,
                "target": decision.target,
                "size": size,
                "previous": current,
                "gain": gain,
                "from_step": at,
                "efficiency": None if b_simple is None else efficiency(b_simple, self.points[0][1], size),
            }
        )
        if size == current and gain == self.gains[-1][1]:
            return
        # A later decision replaces one still waiting for its epoch (the steps stay in order).
        if size != current:
            self.points = [p for p in self.points if p[0] < at] + [(at, size)]
        if gain != self.gains[-1][1]:
            self.gains = [g for g in self.gains if g[0] < at] + [(at, gain)]
        self._relay_out()
        self._set_lr(parts, step)  # the scheduler set this step's LR from the layout before the change
        log.info(
            "adaptive batch at step %d: B_simple %s -> global batch %d (was %d)%s%s",
            step,
            "unknown" if b_simple is None else f"{b_simple:.0f}",
            size,
            current,
            f", AdaScale gain {gain:.3g}" if str(node.lr) == "adascale" else "",
            f", from step {at}, the next epoch's first" if at != step else "",
        )

    def _throughput(self):
        """objective=goodput: samples/s at a global batch, from the finder's trials (a batch above
        the micro-batch cap runs at the cap's rate, accumulating)."""
        timed = self.rates
        if not timed:
            return None
        cap = self.micro_cap or timed[-1][0]

        def rate(batch: int) -> float:  # linear between the sizes tried, flat beyond them
            micro = min(batch / self.world, cap)
            if micro <= timed[0][0]:
                return timed[0][1]
            for (a, ra), (b, rb) in zip(timed, timed[1:]):
                if micro <= b:
                    return ra + (rb - ra) * (micro - a) / (b - a)
            return timed[-1][1]

        return rate

    def record(self) -> dict[str, Any]:
        last = self.decisions[-1] if self.decisions else {}
        return {
            "adaptive/target": last.get("target"),
            "adaptive/efficiency": last.get("efficiency"),
            "adaptive/gain": last.get("gain"),
            "adaptive/decisions": len(self.decisions),
        }

    def summary(self, samples_seen: int) -> dict[str, Any]:
        return {
            "adaptive": {
                "sizes": [list(p) for p in self.points],
                "gains": [list(g) for g in self.gains],
                "decisions": self.decisions,
            }
        }

    def figures(self, records: list[dict[str, Any]], run_dir: Path) -> dict[str, str]:
        from bsexp.report.render import batch_figure

        name = batch_figure(records, run_dir)  # the batch over training, against its target and B_simple
        return {"adaptive/batch": name} if name else {}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "points": [list(p) for p in self.points],
            "gains": [list(g) for g in self.gains],
            "decisions": list(self.decisions),
            "rates": [list(r) for r in self.rates],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.points = [tuple(p) for p in state["points"]]
        self.gains = [tuple(g) for g in state["gains"]]
        self.decisions = list(state["decisions"])
        self.rates = [tuple(r) for r in state["rates"]]
        self._relay_out()
        super().load_state_dict(state)


class BranchPolicy(SteppedPolicy):
    """branch.trunk=...: the trunk's run continued from its checkpoint at `branch.at_samples` with
    the global batch `batch.size` (in micro-batches of batch.micro_size with batch=accumulation),
    for `branch.samples` samples (Merrill et al. 2025's branched training). The steps before the
    branch point are the trunk's; from it on, the LR is the trunk's schedule at the same samples
    seen times the rule's ratio of the two batches, and the weight decay the trunk's times its
    rule's ratio; the data goes on where the trunk's stream was. The LR schedule's length, warmup
    and milestones are the trunk's. The run ends after exactly `branch.samples` samples (its last
    step takes only what is left)."""

    name = "branch"
    own_setup = False

    def __init__(self, cfg: DictConfig, world: int) -> None:
        super().__init__(cfg, world)
        self.trunk: dict[str, Any] | None = None  # batch, step, samples, checkpoint: set before resolve
        self._cut_short = False  # whether the branch's end cuts its last step short (set by _run_steps)

    def check(self) -> BatchPlan:
        batch = self.cfg.batch
        if str(batch.policy) not in (Policy.fixed.value, Policy.accumulation.value):
            raise ConfigError(
                "batch.policy",
                str(batch.policy),
                "a branch trains at one global batch: use batch=fixed or batch=accumulation",
            )
        if self.cfg.branch.samples is None:
            raise ConfigError(
                "branch.samples",
                None,
                "a branch needs its length: the samples to train on after the branch point (e.g. branch.samples=8192)",
            )
        if self.cfg.branch.at_samples is None:
            raise ConfigError(
                "branch.at_samples",
                None,
                "say which of the trunk's checkpoints to branch from: its "
                "samples seen (checkpoint.at_samples of the trunk)",
            )
        return self._given()

    def _given(self) -> BatchPlan:
        batch = self.cfg.batch
        return self._make_plan(batch.size, self.world, batch.get("micro_size"), batch.get("accum_steps"))

    def _start(self, probe: Probe, state: dict | None, n_train: int) -> int:
        if state is not None:  # a branch resumed: where it branched is in its own checkpoint
            self.trunk = dict(state["trunk"])
        given = self._given()
        self.micro_cap = given.micro_size if given.accum_steps > 1 else None
        self.n_train = n_train
        self.points = [(0, self.trunk["batch"]), (self.trunk["step"], self.cfg.batch.size)]
        self.gains = [(0, 1.0)]
        return self.trunk["batch"]

    def check_data(self, n_train: int, data: str = "the data", start: int | None = None) -> None:
        if self.cfg.batch.size > n_train:
            raise ConfigError("batch.size", self.cfg.batch.size, f"exceeds the {n_train} training samples of {data}")

    def _run_steps(self, start: int, n_train: int) -> RunSteps:
        cfg, trunk = self.cfg, self.trunk
        full = self.schedule(start).run_steps(cfg.epochs, n_train, cfg.batch.drop_last)
        at, end = trunk["samples"], trunk["samples"] + cfg.branch.samples
        if trunk["step"] > full.total or full.samples_before_step(trunk["step"]) != at:
            raise ConfigError(
                "branch.trunk",
                cfg.branch.trunk,
                f"its checkpoint at step {trunk['step']} has seen {at} "
                f"samples, which this run's layout does not reproduce "
                f"(epochs, data or batch.drop_last differ)",
            )
        last = min(full.total_samples, self.lr_layout().total_samples)  # the trunk's own end (trainer.max_steps)
        if end > last:
            raise ConfigError(
                "branch.samples",
                cfg.branch.samples,
                f"runs past the run's end: the branch starts at {at} of {last} samples, so at most {last - at}",
            )
        cut = full.cut(end, min_last=MIN_MICRO * self.world)
        self._cut_short = bool(cut.total) and cut.taken[-1] < (full.taken or full.sizes)[cut.total - 1]
        return cut

    def _follow(self) -> None:
        """As any stepped run; and a last step cut short of its batch (the branch's end) takes the
        LR the rule gives the samples it takes, not the whole batch's."""
        super()._follow()
        run = self.run_steps
        if self._cut_short and run.total > self.trunk["step"]:
            rule = str(self.cfg.scaling.lr_rule)
            coupling = list(self._coupling)
            coupling[-1] *= scaling.rule_multiplier(rule, run.taken[-1] / run.sizes[-1])
            self._coupling = tuple(coupling)

    def lr_layout(self) -> RunSteps:
        trunk = BatchSchedule(start=self.trunk["batch"], world_size=self.world)
        cfg = self.cfg
        return trunk.run_steps(cfg.epochs, self.n_train, cfg.batch.drop_last, cfg.trainer.max_steps)

    def first_plan(self, start: int) -> BatchPlan:
        return self._given() if start == self.cfg.batch.size else plan_for(start, self.world, None)

    def eval_steps(self) -> tuple[int, ...]:
        """After the first step at or past each `branch.samples / branch.evals` of the branch."""
        cfg, trunk, run = self.cfg, self.trunk, self.run_steps
        marks = [trunk["samples"] + cfg.branch.samples * j / cfg.branch.evals for j in range(1, cfg.branch.evals + 1)]
        seen, found = trunk["samples"], []
        for step in range(trunk["step"], run.total):
            seen += (run.taken or run.sizes)[step]
            if marks and seen >= marks[0] - 1e-9:
                found.append(step + 1)
                while marks and seen >= marks[0] - 1e-9:
                    marks.pop(0)
        return tuple(found)

    def begin(self, parts, step: int) -> None:
        """At the branch point: the weight decay by its rule's ratio of the branch's batch to the
        trunk's, and the LR of the branch's layout."""
        if step != self.trunk["step"]:  # a branch resumed past its branch point has both already
            return
        ratio = scaling.rule_multiplier(str(self.cfg.scaling.wd_rule), self.cfg.batch.size / self.trunk["batch"])
        for group in parts.optimizer.param_groups:
            group["weight_decay"] *= ratio
        self._set_lr(parts, step)
        self._plan = self.plan(step)
        self.trunk["lr"] = parts.optimizer.param_groups[0]["lr"]  # the branch's first step's
        self.trunk["weight_decay"] = parts.optimizer.param_groups[0]["weight_decay"]

    def epochs_done(self, state) -> float:
        """By samples against the trunk's epochs: a branch ends within one (within an epoch the
        trunk's max_steps cut, against a whole epoch's samples)."""
        layout = self.lr_layout()
        per_epoch = layout.epoch_samples()
        if layout.cut_epoch:
            per_epoch[-1] = layout.n
        whole = sum(per_epoch[: state.epoch])
        return state.epoch + (
            (state.samples_seen - whole) / per_epoch[state.epoch]
            if state.epoch < len(per_epoch) and per_epoch[state.epoch]
            else 0.0
        )

    def described(self, hp: scaling.ScaledHparams) -> scaling.ScaledHparams:
        """The branch's own: the LR and weight decay at its batch by the rules, its steps."""
        cfg, trunk, run = self.cfg, self.trunk, self.run_steps
        k = scaling.scale_factor(cfg.batch.size, cfg.scaling.ref_batch)
        return scaling.ScaledHparams(
            k=k,
            lr=scaling.scaled_lr(cfg.optimizer.lr, k, str(cfg.scaling.lr_rule)),
            lr_peak=hp.lr_peak,
            weight_decay=scaling.scaled_weight_decay(cfg.optimizer.weight_decay, k, str(cfg.scaling.wd_rule)),
            warmup_steps=0 if hp.warmup_steps <= trunk["step"] else hp.warmup_steps - trunk["step"],
            total_steps=run.total - trunk["step"],
        )

    def summary(self, samples_seen: int) -> dict[str, Any]:
        return {
            "branch": {
                "trunk": self.trunk.get("run_dir"),
                "checkpoint": self.trunk.get("checkpoint"),
                "trunk_batch": self.trunk["batch"],
                "at_step": self.trunk["step"],
                "at_samples": self.trunk["samples"],
                "samples": self.cfg.branch.samples,
                "samples_trained": samples_seen - self.trunk["samples"],
                "batch": self.cfg.batch.size,
                "lr": self.trunk.get("lr"),
                "weight_decay": self.trunk.get("weight_decay"),
            }
        }

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "trunk": dict(self.trunk)}


class EpochSizes:
    """An epoch's global batches, read step by step from the policy's layout in force."""

    def __init__(self, policy: BatchPolicy, epoch: int) -> None:
        self.policy, self.epoch = policy, epoch

    def __len__(self) -> int:
        run = self.policy.run_steps
        return len(run.epoch(self.epoch)) if self.epoch < len(run.epoch_starts) else 0

    def __iter__(self):
        index = 0
        while index < len(self):  # the samples each step takes (an epoch's or the run's last may take fewer)
            yield self.policy.run_steps.epoch_taken(self.epoch)[index]
            index += 1


POLICIES: dict[str, type[BatchPolicy]] = {
    Policy.fixed.value: FixedPolicy,
    Policy.accumulation.value: AccumulationPolicy,
    Policy.finder.value: FinderPolicy,
    Policy.scheduled.value: ScheduledPolicy,
    Policy.adaptive.value: AdaptivePolicy,
}


def policy_for(cfg: DictConfig, world: int | None = None) -> BatchPolicy:
    """The policy `batch.policy` names (a branch's, where branch.trunk is set), for `world` ranks
    (default: what the config and the environment say)."""
    world = world_size(cfg) if world is None else world
    if cfg.get("branch") is not None and cfg.branch.trunk is not None:
        return BranchPolicy(cfg, world)
    return POLICIES[str(cfg.batch.policy)](cfg, world)
