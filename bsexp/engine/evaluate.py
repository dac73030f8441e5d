"""Evaluation: loss and accuracy over a split, and the `Evaluator` the loop calls after every step,
which decides its own interval and writes one metrics record when it is due."""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from bsexp.engine.datasets import Split
from bsexp.engine.distributed import World
from bsexp.engine.feed import PAD_LABEL, eval_batches, shard, subset
from bsexp.engine.losses import correct as count_correct
from bsexp.engine.losses import counted, summed_loss

log = logging.getLogger(__name__)


@torch.no_grad()
def evaluate(
    net: torch.nn.Module,
    split: Split,
    world: World,
    autocast,
    batch_size: int,
    num_workers: int = 0,
    one_shape: bool | None = None,
) -> tuple[float, float]:
    """Mean loss and accuracy over a whole split, in eval mode; each rank evaluates its shard
    and the sums are all-reduced, so every sample counts once, whatever the world size. On CUDA
    in batches of one shape per split (`one_shape`, None: on CUDA; bsexp.engine.feed.eval_batches:
    its padding counts nowhere)."""
    was_training = net.training
    net.eval()
    world.sync_buffers(net)  # rank 0's BatchNorm statistics on every rank
    sums = torch.zeros(3, device=world.device, dtype=torch.float64)  # loss, correct, count
    one_shape = world.device.type == "cuda" if one_shape is None else one_shape
    batches = eval_batches(shard(split, world.rank, world.size), batch_size, world.device, num_workers, one_shape)
    for x, y in batches:
        with autocast():
            logits = net(x)
        sums[0] += summed_loss(logits.float(), y)  # PAD_LABEL is F.cross_entropy's ignore_index
        sums[1] += count_correct(logits, y)
        sums[2] += counted(y, PAD_LABEL) if one_shape else len(y)
    net.train(was_training)
    loss, correct, count = world.all_reduce(sums).tolist()
    return loss / count, correct / count


@torch.no_grad()
def precise_bn(
    net: torch.nn.Module, split: Split, world: World, autocast, batch_size: int, samples: int, seed: int
) -> int:
    """PreciseBN (Wu & Johnson 2021, "Rethinking 'Batch' in BatchNorm"): every BatchNorm layer's
    running statistics recomputed as the plain average of the batch statistics over `samples`
    training samples (a subset drawn by `seed`, the same at every evaluation), in batches of
    `batch_size`, in training mode with the weights as they are now — in place of the exponential
    average along training, whose older terms come from older weights, and which a slow momentum
    leaves stale. Every rank takes the same samples, so the statistics agree (SyncBatchNorm's
    all-reduces too). Returns the layers recomputed (0: the model has none, nothing done)."""
    layers = [
        m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]
    if not layers:
        return 0
    momenta = [m.momentum for m in layers]
    for m in layers:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average: each batch counts alike
    was_training = net.training
    net.train()
    order = torch.randperm(len(split), generator=torch.Generator().manual_seed(seed))[: min(samples, len(split))]
    try:
        for x, _ in eval_batches(subset(split, order), batch_size, world.device):
            with autocast():
                net(x)
    finally:
        for m, momentum in zip(layers, momenta, strict=True):
            m.momentum = momentum
        net.train(was_training)
    return len(layers)


class Evaluator:
    """Every `every_steps` steps (0: at each epoch's end), and at the run's last step: validation
    and train accuracy (both in eval mode, on equal-sized samples), the running training loss,
    the LR and batch plan of the last step, and the noise scale — one record, to the sinks."""

    def __init__(
        self,
        every_steps: int,
        batch_size: int,
        sinks,
        at_steps: tuple[int, ...] = (),
        growth: float | None = None,
        precise_bn: tuple[int, int] | None = None,
    ) -> None:
        self.every_steps, self.batch_size, self.sinks = every_steps, batch_size, sinks
        self.precise_bn = precise_bn  # (samples, seed): trainer.precise_bn, before every evaluation
        self.at_steps = frozenset(at_steps)  # besides the interval (a branch's evaluations along it)
        self.growth = growth  # besides: at steps growing by this fraction (trainer.eval_growth)
        self._mark = 1  # the next of those steps

    def due(self, step: int, at_epoch_end: bool, total: int) -> bool:
        if step >= total or step in self.at_steps or (self.growth and self._grown(step)):
            return True
        if self.every_steps:
            return step % self.every_steps == 0
        return at_epoch_end

    def _grown(self, step: int) -> bool:
        """Whether `step` is one of 1, then each the first step at least (1 + growth) times the
        one before: between two of them the steps grow by `growth` at most, so a step
        interpolated between them (the one a target was reached at) is off by less than that."""
        while self._mark < step:
            self._mark = max(self._mark + 1, math.ceil(self._mark * (1 + self.growth)))
        return self._mark == step

    def split(self, loop, split: Split) -> tuple[float, float]:
        step = loop.step
        return evaluate(step.net, split, step.world, step.autocast, self.batch_size, loop.splits.num_workers)

    def record(self, loop, state, epoch: float) -> dict[str, Any]:
        """One metrics record; train accuracy is measured like val's (eval mode, equal size)."""
        train_loss, train_batch_acc = state.take_running(loop.step.world)
        if self.precise_bn is not None:
            step, (samples, seed) = loop.step, self.precise_bn
            micro = loop.batch_control.current.micro_size
            precise_bn(step.net, loop.splits.train, step.world, step.autocast, micro, samples, seed)
        train_eval_loss, train_acc = self.split(loop, loop.splits.train_eval)
        val_loss, val_acc = self.split(loop, loop.splits.val)
        state.best_val_acc = max(state.best_val_acc, val_acc)
        plan, noise = loop.batch_control.current, loop.step.noise
        record = {
            "epoch": round(epoch, 4),
            "step": state.step,
            "samples_seen": state.samples_seen,
            "train_loss": train_loss,
            "train_batch_acc": train_batch_acc,
            "train_eval_loss": train_eval_loss,
            "train_acc": train_acc,
            "val_loss": val_loss,
            "val_acc": val_acc,
            "gen_gap": train_acc - val_acc,
            "lr": state.lr,  # with the batch and plan below: what the last step used
            "batch_size": plan.size,
            "micro_size": plan.micro_size,
            "accum_steps": plan.accum_steps,
            "norm_batch": loop.norm_batch,
            "oom_recoveries": loop.batch_control.oom_recoveries,
            "samples_per_s": (state.samples_seen - state.samples_before) / max(state.train_time_s, 1e-9),
            **(noise.scale.record() if noise is not None else {}),
            **loop.batch_control.record(),
        }
        if loop.splits.tokens is not None:  # a language model's: tokens seen, tokens/s, bits per byte
            record.update(loop.splits.tokens.record(state.samples_seen, record["samples_per_s"], val_loss))
        return record

    def log(self, loop, state, epoch: float) -> None:
        record = self.record(loop, state, epoch)
        state.records.append(record)
        self.sinks.log(record)
        log.info(
            f"epoch {record['epoch']:g} step {record['step']}: train_loss {record['train_loss']:.4f} "
            f"train_acc {record['train_acc']:.4f} val_loss {record['val_loss']:.4f} "
            f"val_acc {record['val_acc']:.4f} lr {record['lr']:.4g}"
        )
