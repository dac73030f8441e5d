"""Optimizer and LR schedule from the config and the scaled hyper-parameters.

The values in `optimizer.*` hold at `scaling.ref_batch`; `scaled_hparams` turns them into the
values used at the plan's global batch, through the rules in `bsexp.scaling`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from torch import nn

from bsexp import scaling
from bsexp.config import call_target
from bsexp.batch_schedule import RunSteps, lr_coupling
from bsexp.plan import BatchPlan

# Given to the optimizer by bsexp, scaled and per parameter group, not as written in the config.
_APPLIED_BY_BSEXP = ("lr", "weight_decay", "decay_norm_and_bias")


@dataclass(frozen=True)
class ScaledHparams:
    k: float  # batch.size / scaling.ref_batch, at the first step
    lr: float  # the target LR at the first step's batch, reached when warmup ends
    lr_peak: float  # the highest LR applied within the run (below lr if warmup never ends)
    weight_decay: float
    warmup_steps: int
    total_steps: int


@dataclass(frozen=True)
class LRFactors:
    """The multiplier of the first step's LR at each step: warmup and main schedule, times the
    coupling of the LR to a scheduled batch (1 when the batch is constant)."""

    schedule: scaling.LRSchedule
    coupling: tuple[float, ...] = ()

    def __call__(self, step: int) -> float:
        couple = self.coupling[min(step, len(self.coupling) - 1)] if self.coupling else 1.0
        return self.schedule(step) * couple


def scaled_hparams(cfg: DictConfig, plan: BatchPlan, run: RunSteps) -> tuple[ScaledHparams, LRFactors]:
    k = scaling.scale_factor(plan.size, cfg.scaling.ref_batch)
    lr = scaling.scaled_lr(cfg.optimizer.lr, k, str(cfg.scaling.lr_rule))
    wd = scaling.scaled_weight_decay(cfg.optimizer.weight_decay, k, str(cfg.scaling.wd_rule))
    node = cfg.schedule
    in_steps = (lambda length: int(round(length))) if node.unit == "steps" else run.steps_at
    warmup = 0 if node.warmup_shape == "none" else in_steps(node.warmup)
    lr_schedule = scaling.LRSchedule(
        total_steps=run.total,
        warmup_steps=warmup,
        warmup_shape=str(node.warmup_shape),
        start_factor=scaling.warmup_start_factor(node.start_factor, k, str(cfg.scaling.lr_rule)),
        main=str(node.main),
        milestones=tuple(in_steps(m) for m in node.milestones),
        factor=node.factor,
        final_factor=node.final_factor,
    )
    coupling = ()
    if "schedule" in cfg.batch:  # batch=scheduled: the LR follows the batch
        bs = cfg.batch.schedule
        coupling = tuple(lr_coupling(run.sizes, cfg.scaling.ref_batch, str(cfg.scaling.lr_rule), bs.couple_lr,
                                     bs.ramp_steps))
    factors = LRFactors(lr_schedule, coupling)
    peak = lr * max((factors(step) for step in range(run.total)), default=1.0)
    return ScaledHparams(k, lr, peak, wd, warmup, run.total), factors


def param_groups(model: nn.Module, weight_decay: float, decay_norm_and_bias: bool) -> list[dict]:
    """Biases and norm parameters (every tensor of rank <= 1) get no weight decay by default."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if decay_norm_and_bias or param.ndim > 1 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(cfg: DictConfig, model: nn.Module, hp: ScaledHparams) -> torch.optim.Optimizer:
    # PyTorch's SGD multiplies by the LR outside its momentum buffer, so Goyal et al.'s
    # momentum correction (remark 2) is not needed when the LR changes.
    node = cfg.optimizer
    groups = param_groups(model, hp.weight_decay, node.decay_norm_and_bias)
    return call_target("optimizer", node, groups, exclude=_APPLIED_BY_BSEXP, lr=hp.lr)


def build_scheduler(optimizer: torch.optim.Optimizer, factors: LRFactors):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factors)
