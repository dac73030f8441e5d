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
from bsexp.plan import BatchPlan

# Given to the optimizer by bsexp, scaled and per parameter group, not as written in the config.
_APPLIED_BY_BSEXP = ("lr", "weight_decay", "decay_norm_and_bias")


@dataclass(frozen=True)
class ScaledHparams:
    k: float  # batch.size / scaling.ref_batch
    lr: float  # the target LR, reached when warmup ends
    lr_peak: float  # the highest LR the schedule applies within the run (below lr if warmup never ends)
    weight_decay: float
    warmup_steps: int
    total_steps: int
    steps_per_epoch: int


def scaled_hparams(cfg: DictConfig, plan: BatchPlan, steps_per_epoch: int) -> tuple[ScaledHparams, scaling.LRSchedule]:
    k = scaling.scale_factor(plan.size, cfg.scaling.ref_batch)
    lr = scaling.scaled_lr(cfg.optimizer.lr, k, str(cfg.scaling.lr_rule))
    wd = scaling.scaled_weight_decay(cfg.optimizer.weight_decay, k, str(cfg.scaling.wd_rule))
    total = cfg.epochs * steps_per_epoch
    if cfg.trainer.max_steps is not None:
        total = min(total, cfg.trainer.max_steps)
    node = cfg.schedule
    unit = str(node.unit)
    warmup = 0 if node.warmup_shape == "none" else scaling.to_steps(node.warmup, unit, steps_per_epoch)
    lr_schedule = scaling.LRSchedule(
        total_steps=total,
        warmup_steps=warmup,
        warmup_shape=str(node.warmup_shape),
        start_factor=scaling.warmup_start_factor(node.start_factor, k),
        main=str(node.main),
        milestones=tuple(scaling.to_steps(m, unit, steps_per_epoch) for m in node.milestones),
        factor=node.factor,
        final_factor=node.final_factor,
    )
    peak = lr * max(lr_schedule(step) for step in range(total))
    return ScaledHparams(k, lr, peak, wd, warmup, total, steps_per_epoch), lr_schedule


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


def build_scheduler(optimizer: torch.optim.Optimizer, lr_schedule: scaling.LRSchedule):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule)
