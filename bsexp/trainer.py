"""The training loop: one `train` function calling one `train_step` per optimizer step.

Every loss is summed per sample and divided by the samples of the whole optimizer step (all
micro-steps; all ranks once there are several), so accumulation is exact even when the last
step of an epoch is smaller. Evaluation decides its own interval.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from bsexp.data import Split, Splits, eval_batches, shard, steps_per_epoch
from bsexp.distributed import GradSync, World
from bsexp.metrics import MetricsSink
from bsexp.optim import ScaledHparams
from bsexp.plan import BatchPlan

log = logging.getLogger(__name__)


@dataclass
class Loop:
    """Everything the loop needs, built by `bsexp.run`."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    autocast: Callable[[], Any]
    batches: Any  # TensorBatches or LoaderBatches
    splits: Splits
    plan: BatchPlan
    hp: ScaledHparams
    sinks: MetricsSink
    world: World
    epochs: int
    clip_grad_norm: float | None = None
    eval_every_steps: int = 0
    eval_batch_size: int = 1024
    drop_last: bool = False
    show_progress: bool = True
    grad_sync: GradSync | None = None  # DDP's gradient all-reduce (None in one process)
    finder: Any = None  # the batch finder's result (bsexp.finder.FinderResult), when it ran

    @property
    def device(self) -> torch.device:
        return self.world.device

    @property
    def net(self) -> nn.Module:
        """The model itself, without its DDP wrapper (for evaluation: no collectives)."""
        return self.model.module if isinstance(self.model, DistributedDataParallel) else self.model


@dataclass
class Progress:
    """Counters of the run so far, and the running sums since the last evaluation."""

    step: int = 0
    samples_seen: int = 0
    loss_sum: torch.Tensor | float = 0.0  # summed per-sample training loss
    correct: torch.Tensor | float = 0.0
    running_samples: int = 0  # this rank's, since the last evaluation
    train_time_s: float = 0.0
    best_val_acc: float = 0.0
    records: list[dict[str, Any]] = field(default_factory=list)

    def add(self, loss_sum: torch.Tensor, correct: torch.Tensor, samples: int) -> None:
        if self.running_samples:
            self.loss_sum += loss_sum  # in place: no new tensor per step
            self.correct += correct
        else:
            self.loss_sum, self.correct = loss_sum.clone(), correct.clone()
        self.running_samples += samples

    def take_running(self, world: World) -> tuple[float, float]:
        """Mean training loss and accuracy over every micro-batch of every rank since the last call."""
        sums = world.all_reduce(torch.tensor([float(self.loss_sum), float(self.correct), self.running_samples],
                                             dtype=torch.float64, device=world.device))
        n = max(sums[2].item(), 1)
        self.loss_sum, self.correct, self.running_samples = 0.0, 0.0, 0
        return sums[0].item() / n, sums[1].item() / n


def train_step(loop: Loop, micro_batches: list[tuple[torch.Tensor, torch.Tensor]], step_samples: int):
    """Forward and backward over every micro-batch, then one optimizer step.

    Returns the summed loss and correct count of the step's samples on this rank (detached).
    """
    model, optimizer, scaler = loop.model, loop.optimizer, loop.scaler
    optimizer.zero_grad(set_to_none=True)
    step_loss = correct = 0
    last = len(micro_batches) - 1
    for i, (x, y) in enumerate(micro_batches):
        # Under DDP, gradients are all-reduced once per step: in the last micro-step's backward.
        sync = i == last or not loop.world.distributed
        with contextlib.nullcontext() if sync else model.no_sync():
            with loop.autocast():
                logits = model(x)
                # This micro-batch's share of the mean loss over the step's samples (all micro-steps,
                # all ranks); when it is the whole step, that is the plain mean.
                if len(y) == step_samples:
                    loss = F.cross_entropy(logits, y)
                else:
                    loss = F.cross_entropy(logits, y, reduction="sum") / step_samples
            scaler.scale(loss).backward()
        step_loss = step_loss + loss.detach()
        correct = correct + (logits.detach().argmax(dim=1) == y).sum()
    if loop.clip_grad_norm is not None:
        scaler.unscale_(optimizer)  # clip the true gradient of the whole step
        nn.utils.clip_grad_norm_(model.parameters(), loop.clip_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    loop.scheduler.step()
    return step_loss * step_samples, correct


@torch.no_grad()
def evaluate(loop: Loop, split: Split) -> tuple[float, float]:
    """Mean loss and accuracy over a whole split, in eval mode; each rank evaluates its shard
    and the sums are all-reduced, so every sample counts once, whatever the world size."""
    net, world = loop.net, loop.world
    was_training = net.training
    net.eval()
    world.sync_buffers(net)  # rank 0's BatchNorm statistics on every rank
    sums = torch.zeros(3, device=loop.device, dtype=torch.float64)  # loss, correct, count
    for x, y in eval_batches(shard(split, world.rank, world.size), loop.eval_batch_size, loop.device,
                             loop.splits.num_workers):
        with loop.autocast():
            logits = net(x)
        sums[0] += F.cross_entropy(logits.float(), y, reduction="sum")
        sums[1] += (logits.argmax(dim=1) == y).sum()
        sums[2] += len(y)
    net.train(was_training)
    loss, correct, count = world.all_reduce(sums).tolist()
    return loss / count, correct / count


def eval_record(loop: Loop, progress: Progress, epoch: float) -> dict[str, Any]:
    """One metrics record; train accuracy is measured like val's (eval mode, equal size)."""
    train_loss, train_batch_acc = progress.take_running(loop.world)
    train_eval_loss, train_acc = evaluate(loop, loop.splits.train_eval)
    val_loss, val_acc = evaluate(loop, loop.splits.val)
    progress.best_val_acc = max(progress.best_val_acc, val_acc)
    return {
        "epoch": round(epoch, 4),
        "step": progress.step,
        "samples_seen": progress.samples_seen,
        "train_loss": train_loss,
        "train_batch_acc": train_batch_acc,
        "train_eval_loss": train_eval_loss,
        "train_acc": train_acc,
        "val_loss": val_loss,
        "val_acc": val_acc,
        "gen_gap": train_acc - val_acc,
        "lr": loop.optimizer.param_groups[0]["lr"],
        "batch_size": loop.plan.size,
        "micro_size": loop.plan.micro_size,
        "accum_steps": loop.plan.accum_steps,
        "samples_per_s": progress.samples_seen / max(progress.train_time_s, 1e-9),
    }


def train(loop: Loop, progress: Progress) -> str:
    """Train for `loop.epochs` epochs or `hp.total_steps` steps, counting in `progress` (which
    stays valid if a step raises); returns the status."""
    plan, hp = loop.plan, loop.hp
    per_epoch = steps_per_epoch(len(loop.batches), plan, loop.drop_last)
    status = "completed"
    loop.model.train()
    for epoch in range(loop.epochs):
        remaining = hp.total_steps - progress.step
        if remaining <= 0:
            break
        show = loop.show_progress and loop.world.is_main
        bar = tqdm(total=min(per_epoch, remaining), desc=f"epoch {epoch + 1}/{loop.epochs}",
                   unit="step", leave=False, dynamic_ncols=True, disable=None if show else True)
        started = time.perf_counter()
        batches = loop.batches.steps(epoch, plan, rank=loop.world.rank, drop_last=loop.drop_last)
        for in_epoch, (micro_batches, samples) in enumerate(batches, start=1):
            loss_sum, correct = train_step(loop, micro_batches, samples)
            progress.add(loss_sum, correct, sum(len(y) for _, y in micro_batches))
            progress.step += 1
            progress.samples_seen += samples
            bar.update()
            if not bar.disable and (progress.step % 10 == 0 or bar.n == bar.total):
                _show_postfix(bar, loop, progress, progress.train_time_s + time.perf_counter() - started)
            if _eval_due(loop, progress, at_epoch_end=in_epoch == per_epoch):
                progress.train_time_s += time.perf_counter() - started
                status = _log(loop, progress, epoch + in_epoch / per_epoch)
                started = time.perf_counter()
                if status != "completed":
                    break
            if progress.step >= hp.total_steps:
                break
        progress.train_time_s += time.perf_counter() - started
        bar.close()
        if status != "completed":
            break
    return status


def _eval_due(loop: Loop, progress: Progress, at_epoch_end: bool) -> bool:
    if progress.step >= loop.hp.total_steps:
        return True
    if loop.eval_every_steps:
        return progress.step % loop.eval_every_steps == 0
    return at_epoch_end


def _log(loop: Loop, progress: Progress, epoch: float) -> str:
    record = eval_record(loop, progress, epoch)
    progress.records.append(record)
    loop.sinks.log(record)
    log.info(
        f"epoch {record['epoch']:g} step {record['step']}: train_loss {record['train_loss']:.4f} "
        f"train_acc {record['train_acc']:.4f} val_loss {record['val_loss']:.4f} "
        f"val_acc {record['val_acc']:.4f} lr {record['lr']:.4g}"
    )
    return "completed" if math.isfinite(record["train_loss"]) else "diverged"


def _show_postfix(bar: tqdm, loop: Loop, progress: Progress, train_seconds: float) -> None:
    n = max(progress.running_samples, 1)
    bar.set_postfix(
        loss=f"{float(progress.loss_sum) / n:.4f}",
        acc=f"{float(progress.correct) / n:.3f}",
        lr=f"{loop.optimizer.param_groups[0]['lr']:.3g}",
        samples_s=f"{progress.samples_seen / max(train_seconds, 1e-9):.0f}",
        refresh=False,
    )
