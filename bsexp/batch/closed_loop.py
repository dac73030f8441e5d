"""The closed-loop batch: every `interval` steps, the next global batch from the measured gradient
noise scale. Pure arithmetic, no torch: a B_simple series in, sizes out.

The critical batch grows as the loss falls (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training"): a batch near B_simple = tr(Σ)/|G|² spends samples and steps in balance,
one much above it wastes samples. The controller follows `c × B_simple`, growing at most
`max_growth` times an interval (shrinking only when asked), within `[min_size, max_size]`, in
multiples of the ranks. In their model a batch that follows c × B_noise is no better than a fixed
batch (`bsexp.report.analysis.schedule_bound`): the fewest steps for the samples are at B ∝
√B_noise, `power=0.5` (target c × √(b0 × B_simple), b0 the starting batch).

`objective=goodput` (Pollux; Qiao et al., OSDI 2021) instead picks the batch that maximises
throughput(b) × efficiency(b), the statistical efficiency of a batch b against the starting batch
b0 being (B_noise + b0) / (B_noise + b): the progress per sample relative to b0's.

AdaScale (Johnson et al. 2020) scales the LR of batch S × b0 by the gain ratio
r = (σ² + |G|²) / (σ²/S + |G|²), σ² the variance of a b0-sample gradient (tr(Σ)/b0); in B_simple
terms r = S × (B_simple + b0) / (B_simple + S × b0), between 1 and S, and advances the LR
schedule by r b0-steps a step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

OBJECTIVES = ("noise", "goodput")
LR_MODES = ("rule", "adascale")


@dataclass(frozen=True)
class Decision:
    """One look of the controller: what it saw and what it set (the size in force after it)."""

    step: int
    b_simple: float | None
    target: float | None  # what the objective asked for, before the bounds (goodput: its pick within them)
    size: int
    previous: int
    efficiency: float | None  # of `size` against the starting batch, where B_simple is known

    @property
    def changed(self) -> bool:
        return self.size != self.previous


def efficiency(b_noise: float, b0: int, b: int) -> float:
    """Progress per sample of batch `b` relative to batch `b0` (Pollux): (B + b0) / (B + b)."""
    return (b_noise + b0) / (b_noise + b)


def adascale_gain(b_noise: float | None, b0: int, b: int, kept: float = 1.0) -> float:
    """AdaScale's gain ratio r for batch b = S x b0; while the noise scale is unknown, `kept`, the
    gain in force (1 before the first measurement). An estimate of |G|² that a loss spike drove
    below zero leaves B_simple unknown for many steps: falling back to 1 there would cut the LR
    r-fold, to b0's, and slow the schedule as much."""
    if b_noise is None or not math.isfinite(b_noise) or b_noise <= 0:
        return kept
    scale = b / b0
    return scale * (b_noise + b0) / (b_noise + scale * b0)


@dataclass(frozen=True, kw_only=True)
class Controller:
    """Sets the global batch from the noise scale. All sizes are multiples of `quantum` (the world
    size) and lie within [min_size, max_size]."""

    start: int  # the first step's global batch (b0)
    min_size: int
    max_size: int
    quantum: int = 1
    c: float = 1.0  # target = c x start^(1 - power) x B_simple^power
    power: float = 1.0
    max_growth: float = 2.0  # at most x this per decision (and / this when shrinking)
    shrink: bool = False
    objective: str = "noise"

    def bounds(self, current: int) -> tuple[int, int]:
        """The sizes one decision may reach from `current`, in multiples of the ranks: the upper
        rounded down, the lower up, so neither the growth cap nor min_size is overstepped. Where
        the cap allows less than one multiple of growth (8 ranks at batch 8, x1.5), the least the
        ranks allow, one multiple, stands in for it: else the batch could never grow."""
        high = self._down(min(self.max_size, current * self.max_growth))
        if high <= current and current + self.quantum <= self.max_size:
            high = current + self.quantum
        low = min(self._up(max(self.min_size, current / self.max_growth)), current) if self.shrink else current
        return low, max(high, current)

    def next_size(
        self, current: int, b_simple: float | None, throughput: Callable[[int], float] | None = None, step: int = 0
    ) -> Decision:
        """The batch for the next interval, given the B_simple measured so far (None or not
        finite: keep the batch) and, for goodput, samples/s at each size."""
        known = b_simple is not None and math.isfinite(b_simple) and b_simple > 0
        if not known:
            return Decision(step, None, None, current, current, None)
        low, high = self.bounds(current)
        if self.objective == "goodput":
            if throughput is None:
                raise ValueError("objective=goodput needs the throughput at each size")
            candidates = range(low, high + 1, self.quantum)
            size = max(candidates, key=lambda b: (throughput(b) * efficiency(b_simple, self.start, b), -b))
            target = float(size)
        else:
            target = self.c * self.start ** (1 - self.power) * b_simple**self.power
            size = min(max(self._nearest(target), low), high)
        return Decision(step, b_simple, target, size, current, efficiency(b_simple, self.start, size))

    def _down(self, size: float) -> int:
        return max(self.quantum, int(size // self.quantum) * self.quantum)

    def _up(self, size: float) -> int:
        return max(self.quantum, math.ceil(size / self.quantum) * self.quantum)

    def _nearest(self, size: float) -> int:
        return max(self.quantum, int(round(size / self.quantum)) * self.quantum)
