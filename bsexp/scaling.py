"""The large-batch rules as pure functions (no torch), each checkable against its paper.

`optimizer.lr` and `optimizer.weight_decay` are the values tuned at `scaling.ref_batch`;
`k = batch.size / ref_batch` converts them to the values used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RULES = ("linear", "sqrt", "none")


def scale_factor(size: int, ref_batch: int) -> float:
    """k = size / ref_batch (Goyal et al. 2017 write the global batch as k·n)."""
    return size / ref_batch


def rule_multiplier(rule: str, k: float) -> float:
    """How much a value tuned at ref_batch grows when the batch grows by k."""
    if rule == "linear":  # Goyal et al. 2017 §2.1: batch × k -> LR × k
        return k
    if rule == "sqrt":  # Hoffer et al. 2017 (SGD), Malladi et al. 2022 (Adam): × √k
        return math.sqrt(k)
    if rule == "none":
        return 1.0
    raise ValueError(f"unknown scaling rule {rule!r}; valid: {', '.join(RULES)}")


def scaled_lr(base_lr: float, k: float, rule: str) -> float:
    return base_lr * rule_multiplier(rule, k)


def scaled_weight_decay(base_wd: float, k: float, rule: str) -> float:
    """`sqrt` keeps the decay timescale B/(η·λ·N) fixed when η grows by √k (SCIENCE.md:
    Loshchilov & Hutter App. B.1; Wang & Aitchison 2025)."""
    return base_wd * rule_multiplier(rule, k)


@dataclass(frozen=True)
class LRSchedule:
    """Multiplier of the scaled LR at each optimizer step: warmup, then the main schedule.

    All lengths are in optimizer steps. `start_factor` is the warmup's first multiplier
    (Goyal et al. §2.2 ramp from the unscaled LR, i.e. 1/k).
    """

    total_steps: int
    warmup_steps: int = 0
    warmup_shape: str = "linear"  # linear | constant | none
    start_factor: float = 1.0
    main: str = "constant"  # cosine | step | constant
    milestones: tuple[int, ...] = ()  # absolute steps at which `step` multiplies by `factor`
    factor: float = 0.1
    final_factor: float = 0.0  # cosine ends at final_factor × the peak

    def __call__(self, step: int) -> float:
        if self.warmup_shape != "none" and step < self.warmup_steps:
            if self.warmup_shape == "constant":  # low LR, then a jump (Goyal's ablation)
                return self.start_factor
            return self.start_factor + (1.0 - self.start_factor) * step / self.warmup_steps
        if self.main == "cosine":
            begin = self.warmup_steps if self.warmup_shape != "none" else 0
            span = max(1, self.total_steps - begin)
            progress = min(1.0, (step - begin) / span)
            cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
            return self.final_factor + (1.0 - self.final_factor) * cosine
        if self.main == "step":
            return self.factor ** sum(step >= m for m in self.milestones)
        return 1.0


def warmup_start_factor(start_factor: float | None, k: float) -> float:
    """None means Goyal's choice: begin at the unscaled LR (1/k of the target), never above it."""
    if start_factor is None:
        return min(1.0, 1.0 / k)
    return start_factor
