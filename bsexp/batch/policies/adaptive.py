"""batch=adaptive: a closed loop. Every `batch.adaptive.interval` steps the controller
(bsexp.batch.closed_loop) sets the global batch of the steps ahead from the measured gradient noise
scale; rank 0 decides and every rank applies its decision. The run is laid out again from that
step on: the data, the LR (by scaling.lr_rule, or AdaScale's gain) and the weight decay (by
scaling.wd_rule) follow, with warmup and decay counted in samples, so a change of batch neither
stretches nor cuts them. Batches above the micro-batch cap accumulate."""

from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from bsexp.batch.closed_loop import Controller, adascale_gain, efficiency
from bsexp.batch.layout import Layout
from bsexp.batch.plan import MIN_MICRO, BatchPlan, plan_for
from bsexp.batch.policies import stepped
from bsexp.batch.policies.finder import FinderConfig
from bsexp.batch.policies.shared import BatchConfig, Policy, Probe, RunSpec, run_steps
from bsexp.batch.schedule import BatchSchedule, RunSteps
from bsexp.errors import ConfigError
from bsexp.fields import at_least, bounded, choice, positive

log = logging.getLogger(__name__)

AdaptiveObjective = choice("AdaptiveObjective", "noise", "goodput", module=__name__)
AdaptiveLR = choice("AdaptiveLR", "rule", "adascale", module=__name__)


@dataclass
class AdaptiveConfig:
    interval: int = at_least(1, 25)  # optimizer steps between the controller's decisions
    objective: AdaptiveObjective = AdaptiveObjective.noise  # noise: c x B_simple; goodput: Pollux
    c: float = positive(1.0)  # objective=noise: the batch aimed at is c x B_simple (x batch.size^(1-power))
    # objective=noise: B_simple^power; 0.5 is McCandlish et al.'s fewest steps for the samples (B ∝ √B_noise)
    power: float = bounded(1.0, low=0, high=1, open_low=True)
    min_size: Optional[int] = at_least(1, None)  # null: batch.size
    max_size: Optional[int] = at_least(1, None)  # null: the training set
    max_growth: float = at_least(1.0, 2.0)  # at most x this per decision (and / this when shrinking)
    shrink: bool = False  # let the batch fall when B_simple does
    lr: AdaptiveLR = AdaptiveLR.rule  # rule: scaling.lr_rule follows the batch; adascale: the gain ratio


@dataclass
class AdaptiveBatch(BatchConfig):
    policy: Policy = Policy.adaptive
    size: int = at_least(1, 32)  # the first steps' global batch, until the noise scale is measured
    micro_size: Optional[int] = at_least(1, None)  # per rank: larger batches accumulate micro-batches
    find_micro_size: bool = True  # run the batch finder for the micro-batch that fits (and its throughput)
    finder: FinderConfig = field(default_factory=FinderConfig)
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)


class Adaptive:
    name = "adaptive"
    config = AdaptiveBatch
    measures_noise = True
    batch_figure = "adaptive/batch"  # the batch over training, against its target and B_simple

    def __init__(self, config: AdaptiveBatch, spec: RunSpec) -> None:
        self.batch, self.spec, self.world = config, spec, spec.world_size
        self.found = None
        self.n_train, self.micro_size_cap = 0, config.micro_size
        self.points: list[tuple[int, int]] = [(0, config.size)]  # (step, global batch from it on)
        self.gains: list[tuple[int, float]] = [(0, 1.0)]  # (step, LR gain from it on): AdaScale's r, or 1
        self.decisions: list[dict[str, Any]] = []
        self.rates: list[tuple[int, float]] = []  # (micro-batch, samples/s) of the finder's trials
        self.adascale = str(config.adaptive.lr) == "adascale"  # the LR follows AdaScale's gain, not the rule

    def searches(self) -> bool:
        return bool(self.batch.find_micro_size)

    def check(self) -> BatchPlan:
        batch, world, size = self.batch, self.world, self.batch.size
        node = batch.adaptive
        low = node.min_size if node.min_size is not None else size
        if size % world or size < world * MIN_MICRO:
            raise ConfigError(
                "batch.size", size, f"must be a multiple of the world size {world} and at least {world * MIN_MICRO}"
            )
        if not low <= size:
            raise ConfigError("batch.adaptive.min_size", low, f"must be at most batch.size={size}")
        if node.max_size is not None and node.max_size < size:
            raise ConfigError("batch.adaptive.max_size", node.max_size, f"must be at least batch.size={size}")
        if self.spec.noise_scale == "off":
            raise ConfigError(
                "trainer.noise_scale", "off", "batch=adaptive steers by the measured noise scale: use auto or always"
            )
        if not self.spec.data_in_memory:
            raise ConfigError(
                "batch.policy",
                "adaptive",
                "needs the data in memory (data.in_memory=true): the steps ahead change as the run goes",
            )
        if str(node.objective) == "goodput" and not batch.find_micro_size:
            raise ConfigError(
                "batch.adaptive.objective",
                "goodput",
                "needs the finder's throughput at each size: set batch.find_micro_size=true",
            )
        return plan_for(size, world, batch.micro_size)

    def lay_out(self, probe: Probe, state: dict | None = None) -> Layout:
        self.n_train = probe.n_train
        if state is not None:
            self.points = [tuple(p) for p in state["points"]]
            self.gains = [tuple(g) for g in state["gains"]]
            self.decisions, self.rates = list(state["decisions"]), [tuple(r) for r in state["rates"]]
        elif self.batch.find_micro_size:
            self.found = probe.find(largest=controller(self.batch, self.world, self.n_train).max_size // self.world)
            cap = self.found.micro_size
            self.micro_size_cap = cap if self.micro_size_cap is None else min(self.micro_size_cap, cap)
            self.rates = sorted((t.size, t.samples_per_s) for t in self.found.trials if t.ok and t.samples_per_s)
        return self._layout()

    # ------------------------------------------------------------------ the layout

    def _gains(self, steps: int) -> list[float] | None:
        return stepped.step_gains(self.gains, steps) if self.adascale else None

    def _run_steps(self, budget: int) -> RunSteps:
        """The steps until the schedule's position reaches `budget`: the run ends with its
        schedule. In samples, that is `epochs` of them (a cap in steps or drop_last, a budget of
        the first batch's steps). With AdaScale, AdaScale's length (Johnson et al. 2020, Algorithm
        1: train while the scale-invariant iterations τ, advanced r a step, are below the budget
        T), the steps ahead at the gain in force: a gain below the scale S takes more samples than
        `epochs` (up to S times as many)."""
        spec, epochs, b0 = self.spec, self.spec.epochs, self.points[0][1]
        while True:
            run = stepped.schedule(self.points, self.world, balance_tail=True).run_steps(
                epochs, self.n_train, spec.drop_last, spec.max_steps
            )
            position = stepped.progress(run, b0, self._gains(run.total))
            if position[-1] >= budget or not run.total or run.total == spec.max_steps:
                return run.first(bisect.bisect_left(position, budget, hi=run.total))
            per_epoch = position[-1] - position[run.epoch_starts[-1]]  # the last epoch's, at the gain ahead
            if per_epoch <= 0:
                return run
            epochs += max(1, math.ceil((budget - position[-1]) / per_epoch))

    def _layout(self) -> Layout:
        # The budget the schedule is counted against: the run of `epochs` (cut at trainer.max_steps)
        # at the first batch, in samples (with AdaScale, scale-invariant ones). Counted against the
        # run itself, a cap in steps (or drop_last) would end the schedule where the first batch's
        # run ends, long before a grown batch's does, and a resumed run, its batches grown, would
        # count warmup steps and the cap otherwise than the run it resumes.
        rules, b0 = self.spec.rules, self.points[0][1]
        budget = run_steps(self.spec, BatchSchedule(start=b0, world_size=self.world), self.n_train)
        run = self._run_steps(budget.total_samples)
        positions, coupling = stepped.follow(run, b0, rules.ref_batch, rules.lr_rule, self._gains(run.total))
        first = plan_for(run.sizes[0] if run.sizes else b0, self.world, self.micro_size_cap)
        return Layout(
            run,
            self.world,
            first,
            micro_size_cap=self.micro_size_cap,
            base_batch_given=b0,
            lr_run_given=budget,
            lr_samples_given=positions,
            lr_coupling=coupling,
            wd_step_ratios=stepped.weight_decay_step_ratios(run.sizes, rules.wd_rule),
        )

    # ------------------------------------------------------------------ the closed loop

    def due(self, step: int, layout: Layout) -> bool:
        return not step % self.batch.adaptive.interval and step < layout.total

    def decide(self, step: int, layout: Layout, b_simple: float | None) -> tuple:
        """Rank 0's decision at `step` from its measured B_simple (and its throughput)."""
        current = layout.run.sizes[step]
        decision = controller(self.batch, self.world, self.n_train).next_size(
            current, b_simple, throughput(self.rates, self.micro_size_cap, self.world), step
        )
        gain = 1.0
        if self.adascale:
            gain = adascale_gain(decision.b_simple, self.points[0][1], decision.size, kept=self.gains[-1][1])
        return decision, gain, b_simple

    def apply(self, step: int, layout: Layout, decided: tuple) -> Layout | None:
        """Every rank: the run laid out again from the decision (None where nothing changes)."""
        decision, gain, b_simple = decided
        current, size = layout.run.sizes[step], decision.size
        at = stepped.from_step(layout.run, step, size, self.spec.drop_last)
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
            return None
        # A later decision replaces one still waiting for its epoch (the steps stay in order).
        if size != current:
            self.points = [p for p in self.points if p[0] < at] + [(at, size)]
        if gain != self.gains[-1][1]:
            self.gains = [g for g in self.gains if g[0] < at] + [(at, gain)]
        log.info(
            "adaptive batch at step %d: B_simple %s -> global batch %d (was %d)%s%s",
            step,
            "unknown" if b_simple is None else f"{b_simple:.0f}",
            size,
            current,
            f", AdaScale gain {gain:.3g}" if self.adascale else "",
            f", from step {at}, the next epoch's first" if at != step else "",
        )
        return self._layout()

    # ------------------------------------------------------------------ what it tells

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

    def state_dict(self) -> dict[str, Any]:
        return {
            "points": [list(p) for p in self.points],
            "gains": [list(g) for g in self.gains],
            "decisions": list(self.decisions),
            "rates": [list(r) for r in self.rates],
        }


def controller(batch: AdaptiveBatch, world: int, n_train: int) -> Controller:
    """The controller of a run of `world` ranks on `n_train` training samples: the batch stays a
    multiple of the ranks, within batch.adaptive.min_size and .max_size and the training set."""
    node, size = batch.adaptive, batch.size
    return Controller(
        start=size,
        min_size=node.min_size if node.min_size is not None else size,
        max_size=n_train if node.max_size is None else min(node.max_size, n_train),
        quantum=world,
        c=node.c,
        power=node.power,
        max_growth=node.max_growth,
        shrink=node.shrink,
        objective=str(node.objective),
    )


def throughput(rates: list[tuple[int, float]], micro_size_cap: int | None, world: int):
    """objective=goodput: samples/s at a global batch, from the finder's trials (micro-batch,
    samples/s); a batch above the micro-batch cap runs at the cap's rate, accumulating. None
    where nothing was timed."""
    if not rates:
        return None
    cap = micro_size_cap or rates[-1][0]

    def rate(batch: int) -> float:  # linear between the sizes tried, flat beyond them
        micro = min(batch / world, cap)
        if micro <= rates[0][0]:
            return rates[0][1]
        for (a, ra), (b, rb) in zip(rates, rates[1:]):
            if micro <= b:
                return ra + (rb - ra) * (micro - a) / (b - a)
        return rates[-1][1]

    return rate
