"""batch=fixed: `batch.size` every step, one micro-step a rank."""

from __future__ import annotations

from dataclasses import dataclass

from bsexp.batch.layout import Layout
from bsexp.batch.plan import BatchPlan, make_plan
from bsexp.batch.policies.shared import BatchConfig, Policy, constant_layout, fits_data


@dataclass
class FixedBatch(BatchConfig):
    policy: Policy = Policy.fixed


class Fixed:
    name = "fixed"
    config = FixedBatch

    def __init__(self, cfg, world: int) -> None:
        self.cfg, self.world = cfg, world

    def check(self) -> BatchPlan:
        return make_plan(self.cfg.batch.size, self.world)

    def check_data(self, n_train: int, data: str = "the data") -> None:
        fits_data([self.cfg.batch.size], n_train, data)

    def lay_out(self, probe, state: dict | None = None) -> Layout:
        self.check_data(probe.n_train, probe.data)
        return constant_layout(self.cfg, self.world, probe.n_train, self.cfg.batch.size)
