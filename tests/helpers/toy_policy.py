"""A batch policy of a user's own, outside bsexp: the extension point as a user meets it. One
module (this) and one YAML (its `_target_` names the class), nothing of bsexp's edited.

Doubling: the global batch doubles at every epoch's start, from batch.size, up to batch.max_size.
Misspelt: the same with a hook misspelt (`recrod`), which bsexp refuses rather than never call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bsexp.batch.layout import Layout
from bsexp.batch.plan import BatchPlan, make_plan, plan_for
from bsexp.batch.policies import Probe, RunSpec
from bsexp.batch.schedule import BatchSchedule
from bsexp.errors import ConfigError


@dataclass
class DoublingBatch:
    _target_: str = "toy_policy.Doubling"
    policy: str = "doubling"
    size: int = 16  # the first epoch's global batch
    max_size: int = 256  # it stops doubling there
    drop_last: bool = False


class Doubling:
    name = "doubling"
    config = DoublingBatch

    def __init__(self, config: DoublingBatch, spec: RunSpec) -> None:
        self.batch, self.spec = config, spec

    def _schedule(self) -> BatchSchedule:
        batch, epochs = self.batch, self.spec.epochs
        doublings = sum(1 for epoch in range(1, epochs) if batch.size * 2**epoch <= batch.max_size)
        return BatchSchedule(
            start=batch.size,
            world_size=self.spec.world_size,
            kind="step",
            milestones=tuple(float(e) for e in range(1, doublings + 1)),
            factor=2.0,
            epochs=epochs,
        )

    def check(self) -> BatchPlan:
        if self.batch.max_size < self.batch.size:
            raise ConfigError("batch.max_size", self.batch.max_size, f"must be at least batch.size={self.batch.size}")
        return make_plan(self.batch.size, self.spec.world_size)

    def check_data(self, n_train: int, data: str = "the data") -> None:
        if self.batch.max_size > n_train:
            raise ConfigError("batch.max_size", self.batch.max_size, f"exceeds the {n_train} samples of {data}")

    def lay_out(self, probe: Probe, state: dict[str, Any] | None = None) -> Layout:
        spec = self.spec
        run = self._schedule().run_steps(spec.epochs, probe.n_train, spec.drop_last, spec.max_steps)
        return Layout(run, spec.world_size, plan_for(self.batch.size, spec.world_size, None))


class Misspelt(Doubling):
    def recrod(self) -> dict[str, Any]:  # meant: record
        return {"doubling/epochs": self.spec.epochs}
