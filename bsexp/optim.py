"""Optimizer and LR schedule from the config and the scaled hyper-parameters.

The values in `optimizer.*` hold at `scaling.ref_batch`; `scaled_hparams` turns them into the
values used at the plan's global batch, through the rules in `bsexp.scaling`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from bsexp import scaling
from bsexp.config import locate
from bsexp.errors import ConfigError
from bsexp.plan import BatchPlan

# Not passed to the optimizer class: bsexp applies them itself.
_OWN_KEYS = ("_target_", "lr", "weight_decay", "decay_norm_and_bias")


@dataclass(frozen=True)
class ScaledHparams:
    k: float  # batch.size / scaling.ref_batch
    lr: float  # peak LR used (after warmup)
    weight_decay: float
    warmup_steps: int
    total_steps: int
    steps_per_epoch: int


def scaled_hparams(cfg: DictConfig, plan: BatchPlan, steps_per_epoch: int) -> tuple[ScaledHparams, scaling.LRSchedule]:
    k = scaling.scale_factor(plan.size, cfg.scaling.ref_batch)
    lr = scaling.scaled_lr(cfg.optimizer.lr, k, str(cfg.scaling.lr_rule))
    wd = scaling.scaled_weight_decay(cfg.optimizer.get("weight_decay", 0.0), k, str(cfg.scaling.wd_rule))
    total = cfg.epochs * steps_per_epoch
    if cfg.trainer.max_steps is not None:
        total = min(total, cfg.trainer.max_steps)
    sched = cfg.schedule
    unit = str(sched.unit)
    warmup = 0 if sched.warmup_shape == "none" else scaling.to_steps(sched.warmup, unit, steps_per_epoch)
    schedule = scaling.LRSchedule(
        total_steps=total,
        warmup_steps=warmup,
        warmup_shape=str(sched.warmup_shape),
        start_factor=scaling.warmup_start_factor(sched.start_factor, k),
        main=str(sched.main),
        milestones=tuple(scaling.to_steps(m, unit, steps_per_epoch) for m in sched.milestones),
        factor=sched.factor,
        final_factor=sched.final_factor,
    )
    return ScaledHparams(k, lr, wd, warmup, total, steps_per_epoch), schedule


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
    options = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k not in _OWN_KEYS}
    if isinstance(options.get("betas"), list):
        options["betas"] = tuple(options["betas"])
    groups = param_groups(model, hp.weight_decay, node.get("decay_norm_and_bias", False))
    cls = locate("optimizer", node._target_)
    try:
        return cls(groups, lr=hp.lr, **options)
    except (TypeError, ValueError) as exc:
        raise ConfigError("optimizer", node._target_, f"rejected its options: {exc}") from None


def build_scheduler(optimizer: torch.optim.Optimizer, schedule: scaling.LRSchedule):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
