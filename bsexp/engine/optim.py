"""The optimizer, and the one writer of its hyper-parameters after it is built.

The values in `optimizer.*` hold at `scaling.ref_batch`; the rules of bsexp.batch.hparams turn
them into the values used at every step, from the batch policy's layout. `Hyperparameters` writes
them into the optimizer's parameter groups before each step, and nothing else does: the LR and
weight decay of a step are a function of the step and the layout in force, so a resumed run, a
branch and a closed-loop policy's new layout need nothing restored or patched.
"""

from __future__ import annotations

import inspect

import torch
from omegaconf import DictConfig
from torch import nn

from bsexp.batch.hparams import Rules, scaled
from bsexp.batch.layout import Layout
from bsexp.batch.scaling import ScaledHparams
from bsexp.config.checks import call_target, locate

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


def build_optimizer(cfg: DictConfig, model: nn.Module, hp: ScaledHparams, fused: bool = False) -> torch.optim.Optimizer:
    """`fused`: the update in one kernel over all parameters where the optimizer has one (torch's
    SGD, Adam, AdamW; on the CPU too), else as it comes."""
    # PyTorch's SGD multiplies by the LR outside its momentum buffer, so Goyal et al.'s
    # momentum correction (remark 2) is not needed when the LR changes.
    node = cfg.optimizer
    groups = param_groups(model, hp.weight_decay, node.decay_norm_and_bias)
    extra = {"fused": True} if fused and _takes(locate("optimizer", node._target_), "fused") else {}
    return call_target("optimizer", node, groups, exclude=_APPLIED_BY_BSEXP, lr=hp.lr, **extra)


def _takes(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class Hyperparameters:
    """Writes each step's LR and weight decay into the optimizer's parameter groups: the LR built
    with (the scaled LR at the layout's base batch) times the schedule's and the batch's multiplier
    at the step, and each group's weight decay as the layout moves it."""

    def __init__(self, optimizer: torch.optim.Optimizer, rules: Rules, layout: Layout) -> None:
        self.optimizer, self.rules = optimizer, rules
        self.lrs = [group["lr"] for group in optimizer.param_groups]  # as built, before any checkpoint is loaded
        self.decays = [group["weight_decay"] for group in optimizer.param_groups]
        self.layout: Layout | None = None
        self.apply(0, layout)  # the first step's, as the optimizer stands before it

    def _follow(self, layout: Layout) -> None:
        self.layout = layout
        self.hp, self.factors = scaled(layout, self.rules)
        self.weight_decays = [layout.weight_decays(decay) for decay in self.decays]

    def values(self, step: int, layout: Layout) -> tuple[float, float]:
        """The LR and the (first group's) weight decay of step `step` under `layout`."""
        if layout is not self.layout:
            self._follow(layout)
        decays = self.weight_decays[0]
        return self.lrs[0] * self.factors(step), decays[min(step, len(decays) - 1)] if decays else self.decays[0]

    def apply(self, step: int, layout: Layout) -> float:
        """Set the optimizer's LR and weight decay for step `step`; returns the LR."""
        if layout is not self.layout:
            self._follow(layout)
        factor = self.factors(step)
        for group, lr, decays in zip(self.optimizer.param_groups, self.lrs, self.weight_decays):
            group["lr"] = lr * factor
            if decays:
                group["weight_decay"] = decays[min(step, len(decays) - 1)]
        return self.optimizer.param_groups[0]["lr"]
