"""batch=fixed: `batch.size` every step, one micro-step a rank."""

from __future__ import annotations

from dataclasses import dataclass

from bsexp.batch.layout import Layout
from bsexp.batch.plan import BatchPlan, make_plan
from bsexp.batch.policies.shared import BatchConfig, Policy, Probe, RunSpec, constant_layout


@dataclass
class FixedBatch(BatchConfig):
    policy: Policy = Policy.fixed


class Fixed:
    name = "fixed"
    config = FixedBatch

    def __init__(self, config: FixedBatch, spec: RunSpec) -> None:
        self.batch, self.spec = config, spec

    def check(self) -> BatchPlan:
        return make_plan(self.batch.size, self.spec.world_size)

    def lay_out(self, probe: Probe, state: dict | None = None) -> Layout:
        return constant_layout(self.spec, probe.n_train, self.batch.size)
