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


def build_optimizer(
    cfg: DictConfig, model: nn.Module, hp: ScaledHparams, fused: bool = False, capturable: bool = False
) -> torch.optim.Optimizer:
    """`fused`: the update in one kernel over all parameters where the optimizer has one (torch's
    SGD, Adam, AdamW; on the CPU too), else as it comes. `capturable`: safe inside a CUDA graph
    where the optimizer asks for it (Adam and AdamW refuse a capture without it; SGD has no flag)."""
    # PyTorch's SGD multiplies by the LR outside its momentum buffer, so Goyal et al.'s
    # momentum correction (remark 2) is not needed when the LR changes.
    node = cfg.optimizer
    groups = param_groups(model, hp.weight_decay, node.decay_norm_and_bias)
    target = locate("optimizer", node._target_)
    extra = {"fused": True} if fused and _takes(target, "fused") else {}
    if capturable and _takes(target, "capturable"):
        extra["capturable"] = True
    return call_target("optimizer", node, groups, exclude=_APPLIED_BY_BSEXP, lr=hp.lr, **extra)


def graph_ready(optimizer: torch.optim.Optimizer) -> str | None:
    """Why `optimizer` cannot step inside a CUDA graph, or None: its update must take the LR as a
    device tensor and never read a value back to the host (torch's fused SGD, Adam and AdamW; the
    latter two built capturable)."""
    fused = all(group.get("fused") for group in optimizer.param_groups)
    if not fused:
        return f"{type(optimizer).__name__} without a fused kernel reads its LR back to the host each step"
    if "capturable" in optimizer.defaults and not all(g["capturable"] for g in optimizer.param_groups):
        return f"{type(optimizer).__name__} was not built capturable"
    return None


def _takes(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class Hyperparameters:
    """Writes each step's LR and weight decay into the optimizer's parameter groups: the LR built
    with (the scaled LR at the layout's base batch) times the schedule's and the batch's multiplier
    at the step, and each group's weight decay as the layout moves it.

    `lr_device`: the LR is a 0-d float32 tensor there, written in place each step (one kernel
    launch, no host sync), so that an update captured in a CUDA graph reads each step's LR
    (bsexp.engine.cuda_graphs); groups built with the same LR share one tensor. None: a float."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, rules: Rules, layout: Layout, lr_device: torch.device | None = None
    ) -> None:
        self.optimizer, self.rules, self.lr_device = optimizer, rules, lr_device
        # As built, before any checkpoint is loaded.
        self.lrs = [float(group["lr"]) for group in optimizer.param_groups]
        self.decays = [group["weight_decay"] for group in optimizer.param_groups]
        self.lr_tensors: dict[float, torch.Tensor] = {}  # base LR -> the tensor of the groups built with it
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
            if self.lr_device is None:
                group["lr"] = lr * factor
            else:
                self._tensor_lr(group, lr)
            if decays:
                group["weight_decay"] = decays[min(step, len(decays) - 1)]
        for lr, tensor in self.lr_tensors.items():
            tensor.fill_(lr * factor)
        return self.lrs[0] * factor

    def _tensor_lr(self, group: dict, lr: float) -> None:
        """The group's LR tensor, put back where something replaced it (a checkpoint's optimizer
        state brings its own LR, a float or a tensor on the CPU)."""
        tensor = self.lr_tensors.get(lr)
        if tensor is None:
            tensor = self.lr_tensors[lr] = torch.zeros((), dtype=torch.float32, device=self.lr_device)
        if group["lr"] is not tensor:
            group["lr"] = tensor
