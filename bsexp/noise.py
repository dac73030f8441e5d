"""The gradient noise scale B_simple = tr(Σ) / |G|² (McCandlish et al. 2018, "An Empirical Model
of Large-Batch Training"), measured from gradients a step computes anyway.

Given the squared norms of the mean gradient over B_small and over B_big samples of the same
step (one micro-batch and the accumulated step; or one rank's share and the all-reduced step),
App. A.1's unbiased estimates are

    |G|²  ≈ (B_big |G_big|² - B_small |G_small|²) / (B_big - B_small)
    tr(Σ) ≈ (|G_small|² - |G_big|²) / (1/B_small - 1/B_big)

Single estimates are noisy and their ratio is biased, so each is averaged on its own (an
exponential moving average, and a mean over the whole run) and B_simple is the ratio of the
averages. Pure arithmetic on tensors: nothing here synchronises with the device until a
record is asked for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger(__name__)


def squared_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Σ |t|² over the tensors, as one float64 tensor on their device."""
    norms = torch._foreach_norm(tensors) if hasattr(torch, "_foreach_norm") else [t.norm() for t in tensors]
    return torch.stack([n.double() for n in norms]).pow(2).sum()


def estimates(small_sq, b_small: float, big_sq, b_big: float):
    """Unbiased |G|² and tr(Σ) from squared gradient norms at two batch sizes (App. A.1)."""
    grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    return grad_sq, trace


@dataclass
class NoiseScale:
    """Running estimates of |G|², tr(Σ) and B_simple.

    A measurement whose estimates are not finite (an fp16 overflow: the step a GradScaler skips)
    enters neither the averages nor the run's means; it is counted in `skipped`. The check is a
    masked update on the device, so measuring never waits for it."""

    decay: float = 0.99  # of the moving averages
    measurements: Any = 0  # taken into the averages (a tensor on the gradients' device once measuring)
    skipped: Any = 0  # not finite, left out
    _ema: list = field(default_factory=lambda: [0.0, 0.0])  # |G|², tr(Σ)
    _run: list = field(default_factory=lambda: [0.0, 0.0])  # sums over the run
    _recent: list = field(default_factory=lambda: [0.0, 0.0, 0])  # sums since the last record, count
    _warned: int = 0  # skipped measurements already warned about

    def update(self, small_sq, b_small: float, big_sq, b_big: float) -> None:
        if not b_big > b_small > 0:
            return
        small_sq, big_sq = torch.as_tensor(small_sq, dtype=torch.float64), torch.as_tensor(big_sq, dtype=torch.float64)
        grad_sq, trace = estimates(small_sq, b_small, big_sq.to(small_sq.device), b_big)
        ok = torch.isfinite(grad_sq) & torch.isfinite(trace)
        zero = torch.zeros((), dtype=torch.float64, device=grad_sq.device)
        grad_sq, trace = torch.where(ok, grad_sq, zero), torch.where(ok, trace, zero)
        d, w = self.decay, ok.double()
        # A skipped measurement leaves the moving averages as they were (weight 0).
        self._ema = [self._ema[0] + w * (1 - d) * (grad_sq - self._ema[0]),
                     self._ema[1] + w * (1 - d) * (trace - self._ema[1])]
        self._run = [self._run[0] + grad_sq, self._run[1] + trace]
        self._recent = [self._recent[0] + grad_sq, self._recent[1] + trace, self._recent[2] + w]
        self.measurements = self.measurements + w
        self.skipped = self.skipped + (1 - w)

    @property
    def count(self) -> int:
        return int(self.measurements)

    def averaged(self) -> tuple[float, float] | None:
        """The moving averages of |G|² and tr(Σ), bias-corrected (as Adam's moments are)."""
        count = self.count
        if not count:
            return None
        correction = 1 - self.decay**count
        return float(self._ema[0]) / correction, float(self._ema[1]) / correction

    def _warn_skipped(self) -> None:
        skipped = int(self.skipped)
        if skipped > self._warned:
            log.warning("gradient noise scale: %d measurement(s) with non-finite gradients (an fp16 overflow, a "
                        "step the loss scaler skipped) left out of the estimates", skipped - self._warned)
            self._warned = skipped

    def record(self) -> dict[str, Any]:
        """The metrics of one evaluation record: the averages, B_simple, and the raw estimates
        averaged since the last record."""
        self._warn_skipped()
        averaged = self.averaged()
        if averaged is None:
            return {}
        grad_sq, trace = averaged
        n = max(float(self._recent[2]), 1.0)
        out = {"noise/b_simple": _ratio(trace, grad_sq), "noise/grad_sq": grad_sq, "noise/trace_sigma": trace,
               "noise/grad_sq_raw": float(self._recent[0]) / n, "noise/trace_sigma_raw": float(self._recent[1]) / n,
               "noise/skipped": int(self.skipped)}
        self._recent = [0.0, 0.0, 0]
        return out

    def summary(self) -> dict[str, Any]:
        count = self.count
        if not count:
            return {"noise_b_simple": None, "noise_b_simple_mean": None, "noise_measurements": 0,
                    "noise_skipped": int(self.skipped)}
        grad_sq, trace = (float(v) / count for v in self._run)
        return {"noise_b_simple": _ratio(*reversed(self.averaged())), "noise_b_simple_mean": _ratio(trace, grad_sq),
                "noise_grad_sq_mean": grad_sq, "noise_trace_sigma_mean": trace,
                "noise_measurements": count, "noise_skipped": int(self.skipped)}


def _ratio(trace: float, grad_sq: float) -> float | None:
    """B_simple; None while |G|² is not yet estimated as positive (early, noisy estimates)."""
    return trace / grad_sq if grad_sq > 0 else None
