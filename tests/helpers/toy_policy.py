"""A batch policy of a user's own, outside bsexp: the extension point as a user meets it. One
module (this) and one YAML (its `_target_` names the class), nothing of bsexp's edited.

Doubling: the global batch doubles at every epoch's start, from batch.size, up to batch.max_size."""

from __future__ import annotations

from dataclasses import dataclass

from bsexp.batch.layout import Layout
from bsexp.batch.plan import BatchPlan, make_plan, plan_for
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

    def __init__(self, cfg, world: int) -> None:
        self.cfg, self.world = cfg, world

    def _schedule(self) -> BatchSchedule:
        node, epochs = self.cfg.batch, self.cfg.epochs
        doublings = sum(1 for epoch in range(1, epochs) if node.size * 2**epoch <= node.max_size)
        return BatchSchedule(
            start=node.size,
            world_size=self.world,
            kind="step",
            milestones=tuple(float(e) for e in range(1, doublings + 1)),
            factor=2.0,
            epochs=epochs,
        )

    def check(self) -> BatchPlan:
        if self.cfg.batch.max_size < self.cfg.batch.size:
            raise ConfigError(
                "batch.max_size", self.cfg.batch.max_size, f"must be at least batch.size={self.cfg.batch.size}"
            )
        return make_plan(self.cfg.batch.size, self.world)

    def check_data(self, n_train: int, data: str = "the data") -> None:
        if self.cfg.batch.max_size > n_train:
            raise ConfigError("batch.max_size", self.cfg.batch.max_size, f"exceeds the {n_train} samples of {data}")

    def lay_out(self, probe, state=None) -> Layout:
        cfg = self.cfg
        run = self._schedule().run_steps(cfg.epochs, probe.n_train, cfg.batch.drop_last, cfg.trainer.max_steps)
        return Layout(run, self.world, plan_for(cfg.batch.size, self.world, None))
