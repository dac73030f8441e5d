"""batch=finder: the largest micro-batch whose training step and evaluation fit in memory, less the
margin (bsexp.finder); `batch.size` kept through accumulation when given, else the found
size x the ranks (or, with objective=noise_scale, the batch nearest the measured B_simple)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from bsexp.batch.layout import Layout
from bsexp.batch.plan import MIN_MICRO, BatchPlan, make_plan
from bsexp.batch.policies.shared import BatchConfig, Policy, Probe, RunSpec, constant_layout, fits_data
from bsexp.errors import ConfigError
from bsexp.fields import at_least, bounded, choice, positive

log = logging.getLogger(__name__)

FinderMode = choice("FinderMode", "fit", "power", "binsearch", module=__name__)
FinderObjective = choice("FinderObjective", "max", "throughput", "noise_scale", module=__name__)


@dataclass
class FinderConfig:
    """How the batch finder searches (batch=finder; batch=scheduled and batch=adaptive with
    batch.find_micro_size=true)."""

    mode: FinderMode = FinderMode.fit  # fit: measure memory at two sizes, predict, confirm
    objective: FinderObjective = FinderObjective.max
    init: int = at_least(2, 8, why="(BatchNorm needs two samples)")  # the first micro-batch tried
    max_trials: int = at_least(2, 12)
    steps_per_trial: int = at_least(1, 2)  # training steps per trial (the first one after warm-up allocates)
    max_size: Optional[int] = at_least(2, None)  # largest micro-batch considered (also: the training set per rank)
    # The found global batch is at most this fraction of the training set, unless batch.size is
    # given (McCandlish et al. 2018, Smith et al. 2018: the useful batch lies well below N);
    # null: only memory bounds it.
    data_fraction: Optional[float] = bounded(0.1, low=0, high=1, open_low=True)
    # headroom below where memory runs out: the answer is this fraction below the edge the trials
    # measured, never above the largest that fit; null: from what they measured (the kernels a
    # short last batch and the test split will add, then 1 %; 5 % below the largest pass where
    # no edge is measured: CUDA, several ranks) (docs: Finder)
    margin: Optional[float] = bounded(None, low=0, high=0.9)
    memory_limit_gb: Optional[float] = positive(None)  # null: the GPU's memory, or what the machine has free
    throughput_tolerance: float = bounded(0.05, low=0, high=0.5)  # objective=throughput: within this of the best
    noise_steps: int = at_least(1, 100)  # objective=noise_scale: training steps that measure B_simple
    noise_batch: int = at_least(4, 256)  # objective=noise_scale: the batch they use (at most what fits)
    cache: bool = False  # reuse results for the same model, input, precision, device and limit
    cache_dir: str = "${oc.env:BSEXP_CACHE,'~/.cache/bsexp'}/finder"


@dataclass
class FinderBatch(BatchConfig):
    policy: Policy = Policy.finder
    size: Optional[int] = at_least(1, None)  # null: the found micro-batch x world size becomes the global batch
    finder: FinderConfig = field(default_factory=FinderConfig)


class Finder:
    name = "finder"
    config = FinderBatch

    def __init__(self, config: FinderBatch, spec: RunSpec) -> None:
        self.batch, self.spec = config, spec
        self.found = None  # the finder's result (bsexp.finder.FinderResult), where it ran
        self.found_plan: BatchPlan | None = None  # what it chose (kept in checkpoints)

    def searches(self) -> bool:
        return True

    def check(self) -> None:
        size, world = self.batch.size, self.spec.world_size
        if size is not None and size % world:
            raise ConfigError("batch.size", size, f"must be divisible by the world size {world}")
        return None

    def check_data(self, n_train: int, data: str = "the data") -> None:
        if self.batch.size is not None:  # kept through accumulation; else the finder decides, within the data
            fits_data([self.batch.size], n_train, data)

    def lay_out(self, probe: Probe, state: dict | None = None) -> Layout:
        micro_size_cap = None
        if state is not None:  # the plan found before, not a new search
            self.found_plan = BatchPlan(**state["found_plan"])
        else:
            self.found = probe.find(keep_size=self.batch.size)
            micro_size_cap = self.found.plan.micro_size
            self.found_plan = self.found.plan
            if str(self.batch.finder.objective) == "noise_scale":
                self.found_plan = self._noise_scale_plan(probe)
        fits_data([self.found_plan.size], probe.n_train, probe.data)  # what was found (or, resuming, kept)
        return constant_layout(
            self.spec, probe.n_train, self.found_plan.size, first=self.found_plan, micro_size_cap=micro_size_cap
        )

    def state_dict(self) -> dict[str, Any]:
        return {"found_plan": asdict(self.found_plan)}

    def _noise_scale_plan(self, probe: Probe) -> BatchPlan:
        """objective=noise_scale: train a copy of the run for batch.finder.noise_steps steps at
        batch.finder.noise_batch (at most what fits), measuring B_simple (McCandlish et al. 2018),
        then take the batch nearest it that fits in memory and divides over the ranks. The run
        then trains exactly as batch=fixed at that batch would."""
        node, world, found, n_train = self.batch.finder, self.spec.world_size, self.found, probe.n_train
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
