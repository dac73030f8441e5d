"""The training loop: one `train` function calling one `train_step` per optimizer step.

Every loss is summed per sample and divided by the samples of the whole optimizer step (all
micro-steps; all ranks once there are several), so accumulation is exact even when the last
step of an epoch is smaller. Evaluation decides its own interval.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from bsexp.data import Split, Splits, eval_batches, steps_per_epoch
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
    device: torch.device
    epochs: int
    clip_grad_norm: float | None = None
    eval_every_steps: int = 0
    eval_batch_size: int = 1024
    drop_last: bool = False
    show_progress: bool = True


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

    def take_running(self) -> tuple[float, float]:
        """Mean training loss and accuracy over every micro-batch since the last call."""
        n = max(self.running_samples, 1)
        loss, acc = float(self.loss_sum) / n, float(self.correct) / n
        self.loss_sum, self.correct, self.running_samples = 0.0, 0.0, 0
        return loss, acc


def train_step(loop: Loop, micro_batches: list[tuple[torch.Tensor, torch.Tensor]], step_samples: int):
    """Forward and backward over every micro-batch, then one optimizer step.

    Returns the summed loss and correct count of the step's samples on this rank (detached).
    """
    model, optimizer, scaler = loop.model, loop.optimizer, loop.scaler
    optimizer.zero_grad(set_to_none=True)
    step_loss = correct = 0
    for x, y in micro_batches:
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
    """Mean loss and accuracy over a whole split, in eval mode."""
    was_training = loop.model.training
    loop.model.eval()
    loss_sum = torch.zeros((), device=loop.device, dtype=torch.float64)
    correct = torch.zeros((), device=loop.device, dtype=torch.long)
    count = 0
    for x, y in eval_batches(split, loop.eval_batch_size, loop.device, loop.splits.num_workers):
        with loop.autocast():
            logits = loop.model(x)
        loss_sum += F.cross_entropy(logits.float(), y, reduction="sum")
        correct += (logits.argmax(dim=1) == y).sum()
        count += len(y)
    loop.model.train(was_training)
    return float(loss_sum) / count, float(correct) / count


def eval_record(loop: Loop, progress: Progress, epoch: float) -> dict[str, Any]:
    """One metrics record; train accuracy is measured like val's (eval mode, equal size)."""
    train_loss, train_batch_acc = progress.take_running()
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
        bar = tqdm(total=min(per_epoch, remaining), desc=f"epoch {epoch + 1}/{loop.epochs}",
                   unit="step", leave=False, dynamic_ncols=True, disable=None if loop.show_progress else True)
        started = time.perf_counter()
        batches = loop.batches.steps(epoch, plan, drop_last=loop.drop_last)
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
