"""The gradient noise scale B_simple = tr(Σ) / |G|² (McCandlish et al. 2018, "An Empirical Model
of Large-Batch Training"), measured from gradients a step computes anyway.

Given the squared norms of the mean gradient over B_small and over B_big samples of the same
step (one micro-batch and the accumulated step; or one rank's share and the all-reduced step),
App. A.1's unbiased estimates are

    |G|²  ≈ (B_big |G_big|² - B_small |G_small|²) / (B_big - B_small)
    tr(Σ) ≈ (|G_small|² - |G_big|²) / (1/B_small - 1/B_big)

for samples drawn independently. A step's samples are drawn without replacement from a training
set of N (each epoch a permutation), so the mean over b of them varies by tr(Σ)(1/b - 1/N), not
tr(Σ)/b: the tr(Σ) estimate is unchanged and the |G|² one falls short by tr(Σ)/N, which makes
B_simple read 1/(1/B_simple - 1/N), high by a factor growing without bound as B_simple nears
N (x1.03-1.06 at the 100-200 the adaptive runs on MNIST-1D's 3,500 training samples end at,
x1.33 at N/4). Given the training set's size (`population`), the |G|² estimate gets
tr(Σ)/N back: both are then unbiased for the training set's own gradient and per-sample
covariance (the finite-population correction of sampling theory; Cochran, Sampling Techniques,
1977, Thm 2.2). With augmentation the samples vary beyond the N originals and the correction
is at most this.

Single estimates are noisy and their ratio is biased, so each is averaged on its own (an
exponential moving average, and a mean over the whole run) and B_simple is the ratio of the
averages. Pure arithmetic on tensors: nothing here synchronises with the device until a
record is asked for. `NoiseMeter` takes the measurements from the training step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from bsexp.engine.losses import mean_loss
from bsexp.system.memory import is_oom, release

log = logging.getLogger(__name__)


def squared_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Σ |t|² over the tensors, as one float64 tensor on their device: each norm in the tensors'
    own precision (one kernel over all of them), stacked, then cast once (a cast per tensor made
    about 88 dispatches a step on cnn1d; the values are the same)."""
    norms = torch._foreach_norm(tensors) if hasattr(torch, "_foreach_norm") else [t.norm() for t in tensors]
    return torch.stack(norms).double().pow(2).sum()


def estimates(small_sq, b_small: float, big_sq, b_big: float, population: int | None = None):
    """Unbiased |G|² and tr(Σ) from squared gradient norms at two batch sizes (App. A.1), for
    samples drawn without replacement from `population` samples (None: independent draws)."""
    grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    if population:
        grad_sq = grad_sq + trace / population
    return grad_sq, trace


@dataclass(kw_only=True)
class NoiseScale:
    """Running estimates of |G|², tr(Σ) and B_simple.

    A measurement whose estimates are not finite (an fp16 overflow: the step a GradScaler skips)
    enters neither the averages nor the run's means; it is counted in `skipped`. The check is a
    masked update on the device, so measuring never waits for it."""

    decay: float = 0.99  # of the moving averages
    population: int | None = None  # the training set's size, which the steps draw from without replacement
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
        grad_sq, trace = estimates(small_sq, b_small, big_sq.to(small_sq.device), b_big, self.population)
        ok = torch.isfinite(grad_sq) & torch.isfinite(trace)
        zero = torch.zeros((), dtype=torch.float64, device=grad_sq.device)
        grad_sq, trace = torch.where(ok, grad_sq, zero), torch.where(ok, trace, zero)
        d, w = self.decay, ok.double()
        # A skipped measurement leaves the moving averages as they were (weight 0).
        self._ema = [
            self._ema[0] + w * (1 - d) * (grad_sq - self._ema[0]),
            self._ema[1] + w * (1 - d) * (trace - self._ema[1]),
        ]
        self._run = [self._run[0] + grad_sq, self._run[1] + trace]
        self._recent = [self._recent[0] + grad_sq, self._recent[1] + trace, self._recent[2] + w]
        self.measurements = self.measurements + w
        self.skipped = self.skipped + (1 - w)

    @classmethod
    def restored(cls, saved: dict[str, Any], population: int | None) -> NoiseScale:
        """From a checkpoint's `asdict`, measuring on against `population`. A checkpoint written
        before the correction for drawing without replacement (no `population` in it) holds
        uncorrected |G|² sums: the correction is linear, so it is applied to them here."""
        scale = cls(**{**saved, "population": population})
        if "population" not in saved and population:
            for sums in (scale._ema, scale._run, scale._recent):
                sums[0] = sums[0] + sums[1] / population
        return scale

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
            log.warning(
                "gradient noise scale: %d measurement(s) with non-finite gradients (an fp16 overflow, a "
                "step the loss scaler skipped) left out of the estimates",
                skipped - self._warned,
            )
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
        out = {
            "noise/b_simple": _ratio(trace, grad_sq),
            "noise/grad_sq": grad_sq,
            "noise/trace_sigma": trace,
            "noise/grad_sq_raw": float(self._recent[0]) / n,
            "noise/trace_sigma_raw": float(self._recent[1]) / n,
            "noise/skipped": int(self.skipped),
        }
        self._recent = [0.0, 0.0, 0]
        return out

    def summary(self) -> dict[str, Any]:
        count = self.count
        counts = {"noise_measurements": count, "noise_skipped": int(self.skipped), "noise_population": self.population}
        if not count:
            return {"noise_b_simple": None, "noise_b_simple_mean": None, **counts}
        grad_sq, trace = (float(v) / count for v in self._run)
        return {
            "noise_b_simple": _ratio(*reversed(self.averaged())),
            "noise_b_simple_mean": _ratio(trace, grad_sq),
            "noise_grad_sq_mean": grad_sq,
            "noise_trace_sigma_mean": trace,
            **counts,
        }


def _ratio(trace: float, grad_sq: float) -> float | None:
    """B_simple; None while |G|² is not yet estimated as positive (early, noisy estimates)."""
    return trace / grad_sq if grad_sq > 0 else None


def loss_scale(scaler, device: torch.device) -> float | torch.Tensor:
    """The factor a GradScaler multiplies the loss, and so the gradients, by (1 without one): a
    tensor on `device`, read without waiting for it (`get_scale()` would copy it to the host
    every step); a power of two, so dividing by it is exact."""
    return scaler.scale(torch.ones((), device=device)) if scaler.is_enabled() else 1.0


def grad_sq(model: torch.nn.Module, scaler) -> torch.Tensor:
    """Squared norm of the gradients `model` holds now, undoing a loss scaler's factor."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return squared_norm(grads) / loss_scale(scaler, grads[0].device) ** 2


class NoiseMeter:
    """Measures B_simple from each training step (`trainer.noise_scale`): a hook on the step at
    three moments, each free where the step computes two batch sizes anyway.

    - `begin`: only with `always`, for a step of one micro-batch in one process (nothing to
      compare for free): the mean gradient over the first half of the batch, computed on the side
      (its own forward and backward through `torch.autograd.grad`, so no .grad is touched), with
      the random generators and every buffer (BatchNorm's running statistics) put back. The step
      then runs on the whole batch exactly as without measuring. With `whole_batch` (a model with
      BatchNorm) the side forward is of the whole batch and only the loss is the half's, so the
      half is normalised with the statistics the step trains on, not over itself (over itself the
      estimate depends on the batch: docs: The noise scale and the critical batch, "BatchNorm").
    - `after_micro`: with accumulation, the first micro-batch's gradient (still this rank's own,
      under no_sync), scaled to its own mean. No extra backward pass.
    - `end`: the whole step's gradient against the small one (or, with one micro-batch a rank
      under DDP, this rank's share before the all-reduce, which the gradient sync kept).

    `step` is the training step's parts (bsexp.engine.step.Step): model, autocast, scaler, world."""

    def __init__(self, scale: NoiseScale, side_half: bool, grad_sync=None, whole_batch: bool = False) -> None:
        self.scale, self.side_half, self.grad_sync, self.whole_batch = scale, side_half, grad_sync, whole_batch
        self._small = None  # (squared norm of a mean gradient over b_small samples, b_small)

    def begin(self, step, x: torch.Tensor, y: torch.Tensor, n_micro: int) -> None:
        self._small = None
        if self.grad_sync is not None:
            self.grad_sync.local_sq = None
        if self.side_half and n_micro == 1 and not step.world.distributed and len(y) >= 4:
            self._small = self._side(step, x, y, self.whole_batch)

    def after_micro(self, step, index: int, n_micro: int, micro_samples: int, step_samples: int) -> None:
        if index == 0 and n_micro > 1 and self._small is None:
            # The gradient so far is this micro-batch's mean gradient x len / step_samples.
            self._small = (grad_sq(step.model, step.scaler) * (step_samples / micro_samples) ** 2, micro_samples)

    def end(self, step, local: int, step_samples: int) -> None:
        measured = self.measure(step, local, step_samples)
        if measured is not None:
            self.scale.update(*measured)

    def measure(self, step, local: int, step_samples: int):
        """This step's (|G_small|², b_small, |G_big|², b_big), or None where it has nothing to
        compare: tensors computed on the device, nothing taken into the averages yet (which a
        CUDA graph of the step captures; `scale.update` takes them after each replay)."""
        small = self._small
        if small is None and self.grad_sync is not None and self.grad_sync.local_sq is not None:
            scale = loss_scale(step.scaler, step.device)
            small = (self.grad_sync.local_sq / scale**2 * (step_samples / local) ** 2, local)
        if small is None:
            return None
        small_sq, b_small = small
        world = step.world
        if world.distributed:  # the small figure, averaged over the ranks
            both = world.all_reduce(
                torch.stack(
                    [small_sq.double(), torch.tensor(float(b_small), dtype=torch.float64, device=small_sq.device)]
                )
            )
            small_sq, b_small = both[0] / world.size, both[1].item() / world.size
        return small_sq, b_small, grad_sq(step.model, step.scaler), step_samples

    @staticmethod
    def _side(step, x: torch.Tensor, y: torch.Tensor, whole_batch: bool):
        half = len(y) // 2
        net = step.net
        params = [p for p in net.parameters() if p.requires_grad]
        buffers = [b.detach().clone() for b in net.buffers()]
        device = x.device
        try:
            with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
                with step.autocast():
                    loss = mean_loss(net(x)[:half] if whole_batch else net(x[:half]), y[:half])
                grads = torch.autograd.grad(step.scaler.scale(loss), params, allow_unused=True)
        except Exception as exc:
            if not is_oom(exc):
                raise
            release(device)
            return None
        finally:
            with torch.no_grad():
                for buffer, saved in zip(net.buffers(), buffers):
                    buffer.copy_(saved)
        return squared_norm([g for g in grads if g is not None]) / loss_scale(step.scaler, device) ** 2, half
