"""batch=accumulation: `batch.size` every step, in micro-batches of `batch.micro_size` (or
`batch.accum_steps` of them) on each rank; an out-of-memory error halves the micro-batch from there."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from bsexp.batch.layout import Layout
from bsexp.batch.plan import BatchPlan
from bsexp.batch.policies.shared import BatchConfig, Policy, Probe, RunSpec, constant_layout, given_plan
from bsexp.errors import ConfigError
from bsexp.fields import at_least


@dataclass
class AccumulationBatch(BatchConfig):
    policy: Policy = Policy.accumulation
    size: int = at_least(1, 512)
    micro_size: Optional[int] = at_least(1, None)  # per rank; give this or accum_steps (or both, consistent)
    accum_steps: Optional[int] = at_least(1, None)


class Accumulation:
    name = "accumulation"
    config = AccumulationBatch

    def __init__(self, config: AccumulationBatch, spec: RunSpec) -> None:
        self.batch, self.spec = config, spec

    def check(self) -> BatchPlan:
        batch = self.batch
        if batch.micro_size is None and batch.accum_steps is None:
            raise ConfigError(
                "batch.micro_size", None, "batch=accumulation needs batch.micro_size (per rank) or batch.accum_steps"
            )
        return given_plan(batch, self.spec.world_size)

    def lay_out(self, probe: Probe, state: dict | None = None) -> Layout:
        plan = self.check()
        return constant_layout(self.spec, probe.n_train, plan.size, first=plan, micro_size_cap=plan.micro_size)
