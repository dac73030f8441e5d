"""batch=finder: the largest micro-batch whose training step and evaluation fit in memory, less the
margin (bsexp.batch.finder); `batch.size` kept through accumulation when given, else the found
size x the ranks (or, with objective=noise_scale, the batch nearest the measured B_simple)."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from bsexp.batch.layout import Layout
from bsexp.batch.plan import MIN_MICRO, BatchPlan, make_plan
from bsexp.batch.policies.shared import constant_layout, fits_data
from bsexp.errors import ConfigError

log = logging.getLogger(__name__)


class Finder:
    name = "finder"

    def __init__(self, cfg, world: int) -> None:
        self.cfg, self.world = cfg, world
        self.found = None  # the finder's result (bsexp.batch.finder.FinderResult), where it ran
        self.found_plan: BatchPlan | None = None  # what it chose (kept in checkpoints)

    def searches(self) -> bool:
        return True

    def check(self) -> None:
        size = self.cfg.batch.size
        if size is not None and size % self.world:
            raise ConfigError("batch.size", size, f"must be divisible by the world size {self.world}")
        return None

    def check_data(self, n_train: int, data: str = "the data") -> None:
        if self.cfg.batch.size is not None:  # kept through accumulation; else the finder decides, within the data
            fits_data([self.cfg.batch.size], n_train, data)

    def lay_out(self, probe, state: dict | None = None) -> Layout:
        micro_cap = None
        if state is not None:  # the plan found before, not a new search
            self.found_plan = BatchPlan(**state["found_plan"])
        else:
            self.found = probe.find(keep_size=self.cfg.batch.size)
            micro_cap = self.found.plan.micro_size
            self.found_plan = self.found.plan
            if str(self.cfg.batch.finder.objective) == "noise_scale":
                self.found_plan = self._noise_scale_plan(probe)
        fits_data([self.found_plan.size], probe.n_train, probe.data)
        return constant_layout(
            self.cfg, self.world, probe.n_train, self.found_plan.size, first=self.found_plan, micro_cap=micro_cap
        )

    def state_dict(self) -> dict[str, Any]:
        return {"found_plan": asdict(self.found_plan)}

    def _noise_scale_plan(self, probe) -> BatchPlan:
        """objective=noise_scale: train a copy of the run for batch.finder.noise_steps steps at
        batch.finder.noise_batch (at most what fits), measuring B_simple (McCandlish et al. 2018),
        then take the batch nearest it that fits in memory and divides over the ranks. The run
        then trains exactly as batch=fixed at that batch would."""
        node, world, found, n_train = self.cfg.batch.finder, self.world, self.found, probe.n_train
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
