"""Optimizer and LR scheduler from the config and the scaled hyper-parameters.

The values in `optimizer.*` hold at `scaling.ref_batch`; the batch policy turns them into the
values used (bsexp.batch.policy.BatchPolicy.hparams, through the rules in bsexp.batch.scaling).
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn

from bsexp.batch.scaling import LRFactors, ScaledHparams
from bsexp.config.checks import call_target

# Given to the optimizer by bsexp, scaled and per parameter group, not as written in the config.
_APPLIED_BY_BSEXP = ("lr", "weight_decay", "decay_norm_and_bias")


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
