"""Synchronised BatchNorm: statistics over the global batch of every rank.

torch's `nn.SyncBatchNorm` refuses CPU tensors in a process group, so CPU/gloo runs use
`CPUSyncBatchNorm`: the per-channel sums are all-reduced with autograd-aware collectives, so
the forward output, the input gradients and the running statistics over k ranks of n samples
equal BatchNorm's over k·n.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


class CPUSyncBatchNorm(_BatchNorm):
    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input (got {x.dim()}-D)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        # With a process group, even of one rank (the batch finder's probe), the synchronised
        # path runs, so its memory is what training will use.
        if not self.training or not (dist.is_available() and dist.is_initialized()):
            return super().forward(x)
        # Statistics in fp32 (the count in fp64) whatever the input's dtype, as torch's BatchNorm
        # computes them under autocast: in bf16 a count of 2601 becomes 2608 and the sums lose
        # digits. The output is cast back to the input's dtype.
        with torch.autocast(x.device.type, enabled=False):
            y = self._normalise(x.float()).to(x.dtype)
        return y

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:
        dims = [0, *range(2, x.dim())]
        shape = [1, -1] + [1] * (x.dim() - 2)
        local_count = torch.tensor([x.numel() / x.shape[1]], dtype=torch.float64, device=x.device)
        # Two passes (mean, then squared deviations) keep the variance as exact as BatchNorm's;
        # the first carries the sample count (times positions) along, in fp64.
        sums = _all_reduce_sum(torch.cat([x.sum(dims).double(), local_count]))
        count = sums[-1].detach()
        mean = (sums[:-1] / count).float()
        var = (_all_reduce_sum(((x - mean.view(shape)) ** 2).sum(dims).double()) / count).float()  # biased
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                unbiased = var * (count / (count - 1).clamp(min=1)).float()
                self.running_mean.mul_(1 - factor).add_(factor * mean)
                self.running_var.mul_(1 - factor).add_(factor * unbiased)
        y = (x - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y


class _AllReduceSum(torch.autograd.Function):
    """Sum over ranks whose gradient is the sum over ranks of the gradients: each rank's loss
    depends on every rank's input through the shared statistics."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        total = tensor.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        total = grad.clone()
        dist.all_reduce(total)
        return total


def _all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    return _AllReduceSum.apply(tensor)


def convert_sync_batchnorm(module: nn.Module, device: torch.device) -> nn.Module:
    """Every BatchNorm in `module` synchronised over the ranks: torch's on CUDA, ours elsewhere."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    if isinstance(module, _BatchNorm) and not isinstance(module, CPUSyncBatchNorm):
        sync = CPUSyncBatchNorm(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats
        ).to(next(module.buffers(), torch.empty(0)).device)
        sync.load_state_dict(module.state_dict())
        sync.train(module.training)
        return sync
    for name, child in module.named_children():
        module.add_module(name, convert_sync_batchnorm(child, device))
    return module
