"""The training step: the one place in bsexp where a model learns from a batch. The loop calls it
once per optimizer step; the batch finder's trials call it too, so what a trial measures is what
training allocates.

Every loss is summed per sample and divided by the samples of the whole optimizer step (all
micro-steps; all ranks once there are several), so accumulation is exact even when the last
step of an epoch is smaller. Two small hooks ride on it: the noise meter (bsexp.engine.gradient_noise) and the
out-of-memory guard, which retries the same data in micro-batches half as large (every rank
agreeing under DDP), through the batch policy (`Step.on_oom`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bsexp.batch.plan import BatchPlan, micro_sizes
from bsexp.engine.distributed import GradSync, World
from bsexp.engine.gradient_noise import NoiseMeter
from bsexp.engine.losses import correct as count_correct
from bsexp.engine.losses import mean_loss, summed_loss
from bsexp.system.memory import is_oom, release

# How gradients meet over the ranks: not at all (one process); in the last micro-step's backward
# through DDP's communication hook; or, so that ranks can agree on an out-of-memory error, in the
# last micro-step's backward too, through bsexp's own buckets (bsexp.engine.distributed.GradBuckets).
REDUCE = ("none", "hook", "buckets")


@dataclass(frozen=True, kw_only=True)
class Step:
    """What a training step works with. Built once (bsexp.engine.build.make_step)."""

    model: nn.Module  # as trained: DDP-wrapped when the run is distributed
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    autocast: Callable[[], Any]
    world: World
    reduce: str = "none"
    channels_last: bool = False  # inputs of 4 dimensions in channels_last, as the fast path's model is
    compiled: bool = False  # the model is torch.compile's: the batch dimension is marked dynamic
    clip_grad_norm: float | None = None
    grad_sync: GradSync | None = None  # the DDP communication hook's state
    noise: NoiseMeter | None = None
    on_oom: Callable[[BatchPlan], BatchPlan] | None = None  # the plan to retry with; None: an OOM propagates
    graphs: Any = None  # bsexp.engine.cuda_graphs.StepGraphs: the step graphed per shape (None: eager)

    @property
    def net(self) -> nn.Module:
        """The model itself, without torch.compile's wrapper or DDP's (its parameters are theirs)."""
        model = getattr(self.model, "_orig_mod", self.model)
        return model.module if isinstance(model, DistributedDataParallel) else model

    @property
    def device(self) -> torch.device:
        return self.world.device


def train_step(step: Step, x: torch.Tensor, y: torch.Tensor, step_samples: int, plan: BatchPlan):
    """One optimizer step on this rank's share (x, y) of a step of `step_samples` samples, in
    micro-batches of `plan`. Returns the summed loss and correct count of this rank's samples
    (detached) and the plan the step ended with (smaller after an out-of-memory error). With
    `step.graphs` (trainer.cuda_graphs), the step runs there: captured in a CUDA graph per shape,
    or eagerly on its static gradients; x and y may then be one `bsexp.engine.feed.Rows`."""
    if step.graphs is not None:
        return step.graphs.train_step(step, x, y, step_samples, plan)
    return eager_step(step, x, y, step_samples, plan)


def eager_step(step: Step, x: torch.Tensor, y: torch.Tensor, step_samples: int, plan: BatchPlan):
    """`train_step` without a graph (the static gradients zeroed in place where `step.graphs` is on)."""
    if step.noise is not None:
        step.noise.begin(step, x, y, len(micro_sizes(len(y), step_samples, plan)))
    while True:
        outcome = _forward_backward(step, x, y, step_samples, plan)
        failed = outcome is None
        if step.reduce == "buckets":  # every bucket reduced on every rank; an OOM anywhere known everywhere
            failed = step.grad_sync.buckets.finish(step.world, failed)
        if not failed:
            break
        plan = _shrink(step, plan)
    measured = finish(step, len(y), step_samples)
    if measured is not None:
        step.noise.scale.update(*measured)
    return outcome[0], outcome[1], plan


def finish(step: Step, local: int, step_samples: int):
    """After the backward: the noise meter's measurement of the step (tensors, not yet in its
    averages), the clip of the whole step's gradient, the update. Returns the measurement."""
    measured = step.noise.measure(step, local, step_samples) if step.noise is not None else None
    if step.clip_grad_norm is not None:
        step.scaler.unscale_(step.optimizer)  # clip the true gradient of the whole step
        nn.utils.clip_grad_norm_(step.model.parameters(), step.clip_grad_norm)
    step.scaler.step(step.optimizer)
    step.scaler.update()
    return measured


def _zero_grads(step: Step) -> None:
    # Set to None, autograd hands the first micro-batch's gradient over as `.grad`; kept (the
    # static gradients a graph reads and writes, bsexp's buckets), it adds every micro-batch's
    # into them in place.
    if step.reduce == "buckets":
        step.grad_sync.buckets.zero()
    else:
        step.optimizer.zero_grad(set_to_none=step.graphs is None)


def _forward_backward(step: Step, x: torch.Tensor, y: torch.Tensor, step_samples: int, plan: BatchPlan):
    """Forward and backward over the micro-batches; None after an OOM (when the guard is on)."""
    _zero_grads(step)
    try:
        return micro_steps(step, x, y, step_samples, micro_sizes(len(y), step_samples, plan))
    except Exception as exc:
        if step.on_oom is None or not is_oom(exc):
            raise
        return None


def micro_steps(step: Step, x: torch.Tensor, y: torch.Tensor, step_samples: int, sizes: list[int]):
    """Forward and backward of each micro-batch of `sizes`, gradients added into `.grad`: the
    summed loss and the correct count of this rank's samples (detached)."""
    model = step.model
    step_loss = correct = 0
    for i, (xm, ym) in enumerate(zip(x.split(sizes), y.split(sizes))):
        xm = _fast_input(step, xm)
        last = i == len(sizes) - 1
        sync = step.reduce == "none" or (step.reduce == "hook" and last)
        with contextlib.nullcontext() if sync else model.no_sync():
            with step.autocast():
                logits = model(xm)
                # This micro-batch's share of the mean loss over the step's samples (all
                # micro-steps, all ranks); when it is the whole step, that is the plain mean.
                if len(ym) == step_samples:
                    loss = mean_loss(logits, ym)
                else:
                    loss = summed_loss(logits, ym) / step_samples
            if last and step.reduce == "buckets":
                step.grad_sync.buckets.arm(step.world)
            step.scaler.scale(loss).backward()
        if step.noise is not None:
            step.noise.after_micro(step, i, len(sizes), len(ym), step_samples)
        step_loss = step_loss + loss.detach()
        correct = correct + count_correct(logits.detach(), ym)
    return step_loss * step_samples, correct


def _fast_input(step: Step, x: torch.Tensor) -> torch.Tensor:
    """The fast path's input: in channels_last for a channels_last model; for a compiled one, its
    batch dimension marked dynamic, so that a micro-batch of another size (an epoch's short last
    step, a batch that grows, an OOM's halving) runs the graph compiled once, not a new one."""
    if step.channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    if step.compiled and len(x) > 1:
        # maybe_: a model whose code fixes the batch size (ResNet-18 in channels_last on CUDA did)
        # then compiles once per size instead of failing (ConstraintViolationError).
        torch._dynamo.maybe_mark_dynamic(x, 0)
    return x


def _shrink(step: Step, plan: BatchPlan) -> BatchPlan:
    """Abandon the step (gradients, partial outputs) and ask for a smaller micro-batch. A
    GradScaler keeps no state of a step before unscale_/step, so there is nothing of it to undo."""
    _zero_grads(step)
    release(step.device)
    if plan.micro_size == 1:
        raise torch.OutOfMemoryError(
            f"even a micro-batch of 1 sample per rank does not fit (global batch {plan.size}): nothing left to halve"
        )
    return step.on_oom(plan)
