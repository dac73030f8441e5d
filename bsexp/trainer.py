"""The training loop: one `train` function calling one `train_step` per optimizer step.

Every loss is summed per sample and divided by the samples of the whole optimizer step (all
micro-steps; all ranks once there are several), so accumulation is exact even when the last
step of an epoch is smaller. Each step's global batch comes from the run's batch schedule and
is split into micro-batches by the plan in force, which an out-of-memory error may change
(halving the micro-batch, doubling the accumulation: the same global batch, LR and weight
decay). Evaluation decides its own interval.
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

from bsexp.batch_schedule import MIN_MICRO, RunSteps, micro_sizes, plan_for
from bsexp.data import Split, Splits, eval_batches, shard
from bsexp.distributed import GradSync, World
from bsexp.memory import is_oom, release
from bsexp.metrics import MetricsSink
from bsexp.noise import NoiseScale, squared_norm
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
    plan: BatchPlan  # in force for the current step
    run_steps: RunSteps  # the scheduled global batch of every step of the run
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
    micro_cap: int | None = None  # the largest micro-batch per rank known to fit (None: any)
    oom_recovery: bool = True
    oom_recoveries: int = 0
    sync_batchnorm: bool = False
    noise: NoiseScale | None = None  # the gradient noise scale, when measured (trainer.noise_scale)
    noise_split: bool = False  # always: measure a step of one micro-batch from a half computed on the side
    checkpoint: Callable[["Loop", "Progress"], None] | None = None  # saves the run (bsexp.run)
    checkpoint_every_steps: int = 0
    checkpoint_every_epoch: bool = False
    stop_signal: int = 0  # set by a SIGTERM/SIGUSR1 handler: checkpoint at the next step and stop
    check_every: int = 1  # steps between looks at the losses (and signals): each look waits for the device

    @property
    def norm_batch(self) -> int:
        """Samples a BatchNorm layer normalises over in one forward: the micro-batch, over all
        ranks with SyncBatchNorm."""
        return self.plan.micro_size * (self.plan.world_size if self.sync_batchnorm else 1)

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
    lr: float = 0.0  # the LR of the last step taken
    epoch: int = 0  # where the run is: the epoch, and the steps of it done (for a resumed run)
    in_epoch: int = 0
    last_finite_loss: float | None = None  # the mean training loss of the last step before a divergence
    diverged_at_step: int | None = None
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


def train_step(loop: Loop, x: torch.Tensor, y: torch.Tensor, step_samples: int):
    """One optimizer step on this rank's share (x, y) of a step of `step_samples` samples,
    in micro-batches of the plan in force; on an out-of-memory error in a forward or backward
    (every rank agreeing under DDP), the same data again in micro-batches half as large.

    Returns the summed loss and correct count of the step's samples on this rank (detached).
    """
    agree = loop.world.distributed and loop.oom_recovery
    side = _side_half(loop, x, y, step_samples) if loop.noise_split else None
    while True:
        outcome = _forward_backward(loop, x, y, step_samples)
        failed = outcome is None
        if agree:  # every rank learns of an OOM anywhere, so none waits in a collective alone
            failed = bool(loop.world.all_reduce(torch.tensor([float(failed)], device=loop.device), op="max"))
        if not failed:
            break
        _recover_from_oom(loop)
    optimizer, scaler = loop.optimizer, loop.scaler
    if agree:  # gradients were kept local (no_sync) until every rank had passed
        loop.world.all_reduce_gradients(loop.model.parameters(), loop.grad_sync)
    if loop.noise is not None:
        _measure_noise(loop, len(y), step_samples, outcome[2] if side is None else side)
    if loop.clip_grad_norm is not None:
        scaler.unscale_(optimizer)  # clip the true gradient of the whole step
        nn.utils.clip_grad_norm_(loop.model.parameters(), loop.clip_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    loop.scheduler.step()
    return outcome[:2]


def _forward_backward(loop: Loop, x: torch.Tensor, y: torch.Tensor, step_samples: int):
    """Forward and backward over the micro-batches; None after an OOM (when recovering)."""
    model = loop.model
    loop.optimizer.zero_grad(set_to_none=True)
    sizes = micro_sizes(len(y), step_samples, loop.plan)
    small = None  # squared norm of the first micro-batch's own mean gradient, and its size
    if loop.grad_sync is not None:
        loop.grad_sync.local_sq = None
    # Under DDP, gradients are all-reduced once per step: in the last micro-step's backward, or,
    # when recovering from OOMs, after every rank has finished its micro-steps.
    local = loop.world.distributed and loop.oom_recovery
    step_loss = correct = 0
    try:
        for i, (xm, ym) in enumerate(zip(x.split(sizes), y.split(sizes))):
            sync = not loop.world.distributed or (i == len(sizes) - 1 and not local)
            with contextlib.nullcontext() if sync else model.no_sync():
                with loop.autocast():
                    logits = model(xm)
                    # This micro-batch's share of the mean loss over the step's samples (all
                    # micro-steps, all ranks); when it is the whole step, that is the plain mean.
                    if len(ym) == step_samples:
                        loss = F.cross_entropy(logits, ym)
                    else:
                        loss = F.cross_entropy(logits, ym, reduction="sum") / step_samples
                loop.scaler.scale(loss).backward()
            if loop.noise is not None and i == 0 and len(sizes) > 1:
                # The gradient so far is this micro-batch's mean gradient x len / step_samples
                # (and still this rank's own: no_sync). No extra backward pass.
                small = (_grad_sq(loop) * (step_samples / len(ym)) ** 2, len(ym))
            step_loss = step_loss + loss.detach()
            correct = correct + (logits.detach().argmax(dim=1) == ym).sum()
    except Exception as exc:
        if not (loop.oom_recovery and is_oom(exc)):
            raise
        return None
    return step_loss * step_samples, correct, small


def _side_half(loop: Loop, x: torch.Tensor, y: torch.Tensor, step_samples: int):
    """trainer.noise_scale=always, for a step of one micro-batch in one process (where nothing is
    measured for free): the squared norm of the mean gradient over the first half of the batch,
    computed on the side — its own forward and backward (torch.autograd.grad, so no parameter's
    .grad is touched), with the random generators and every buffer (BatchNorm's running
    statistics) put back as they were. The step itself then runs on the whole batch, exactly as
    without measuring. Returns (squared norm, samples) or None where the step is not of that kind
    or the side pass does not fit in memory."""
    if loop.world.distributed or len(micro_sizes(len(y), step_samples, loop.plan)) != 1 or len(y) < 2 * MIN_MICRO:
        return None
    half = len(y) // 2
    net = loop.net
    params = [p for p in net.parameters() if p.requires_grad]
    buffers = [b.detach().clone() for b in net.buffers()]
    devices = [loop.device.index or 0] if loop.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            with loop.autocast():
                loss = F.cross_entropy(net(x[:half]), y[:half])
            grads = torch.autograd.grad(loop.scaler.scale(loss), params, allow_unused=True)
    except Exception as exc:
        if not is_oom(exc):
            raise
        release(loop.device)
        return None
    finally:
        with torch.no_grad():
            for buffer, saved in zip(net.buffers(), buffers):
                buffer.copy_(saved)
    return squared_norm([g for g in grads if g is not None]) / _loss_scale(loop) ** 2, half


def _loss_scale(loop: Loop) -> float:
    """The factor a GradScaler multiplies the loss, and so the gradients, by (1 without one)."""
    return loop.scaler.get_scale() if loop.scaler.is_enabled() else 1.0


def _grad_sq(loop: Loop) -> torch.Tensor:
    """Squared norm of the gradients now held, undoing a loss scaler's factor."""
    grads = [p.grad for p in loop.model.parameters() if p.grad is not None]
    return squared_norm(grads) / _loss_scale(loop) ** 2


def _measure_noise(loop: Loop, local: int, step_samples: int, small) -> None:
    """One noise-scale measurement from this step's gradients: the first micro-batch's (or, with
    one micro-batch a rank, this rank's share before the all-reduce, which the gradient sync kept)
    against the whole step's. Under DDP the small figure is averaged over the ranks."""
    world = loop.world
    if small is None and loop.grad_sync is not None and loop.grad_sync.local_sq is not None:
        small = (loop.grad_sync.local_sq / _loss_scale(loop) ** 2 * (step_samples / local) ** 2, local)
    if small is None:
        return
    small_sq, b_small = small
    if world.distributed:
        both = world.all_reduce(torch.stack([small_sq.double(), torch.tensor(float(b_small), dtype=torch.float64,
                                                                              device=small_sq.device)]))
        small_sq, b_small = both[0] / world.size, both[1].item() / world.size
    loop.noise.update(small_sq, b_small, _grad_sq(loop), step_samples)


def _recover_from_oom(loop: Loop) -> None:
    """Abandon the step (gradients, partial outputs, the loss scaler's step state) and halve the
    micro-batch; the global batch, and so the LR and weight decay, stay as they were."""
    plan = loop.plan
    loop.optimizer.zero_grad(set_to_none=True)
    release(loop.device)
    state = loop.scaler.state_dict()
    loop.scaler = torch.amp.GradScaler(loop.device.type, enabled=loop.scaler.is_enabled())
    if state:
        loop.scaler.load_state_dict(state)
    if plan.micro_size == 1:
        raise torch.OutOfMemoryError(f"even a micro-batch of 1 sample per rank does not fit (global batch "
                                     f"{plan.size}): nothing left to halve")
    loop.micro_cap = plan.micro_size // 2
    loop.plan = plan_for(plan.size, plan.world_size, loop.micro_cap)
    loop.oom_recoveries += 1
    log.warning("out of memory at micro-batch %d: micro-batch %d x %d accumulation steps x %d ranks from now "
                "on (global batch %d, LR and weight decay unchanged)", plan.micro_size, loop.plan.micro_size,
                loop.plan.accum_steps, plan.world_size, plan.size)


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
        "lr": progress.lr,  # with the batch and plan below: what the last step used
        "batch_size": loop.plan.size,
        "micro_size": loop.plan.micro_size,
        "accum_steps": loop.plan.accum_steps,
        "norm_batch": loop.norm_batch,
        "oom_recoveries": loop.oom_recoveries,
        "samples_per_s": progress.samples_seen / max(progress.train_time_s, 1e-9),
        **(loop.noise.record() if loop.noise is not None else {}),
    }


def train(loop: Loop, progress: Progress) -> str:
    """Train for the run's scheduled steps (`loop.run_steps`) from where `progress` stands (a
    resumed run continues mid-epoch), counting in `progress` (which stays valid if a step
    raises); returns the status: completed, diverged (a non-finite loss) or preempted (a signal:
    a checkpoint is saved first)."""
    world, run = loop.world, loop.run_steps
    status = "completed"
    pending: list[tuple[torch.Tensor, int]] = []  # the steps' losses not yet looked at
    loop.model.train()
    for epoch in range(progress.epoch, loop.epochs):
        sizes = run.epoch(epoch)
        if not sizes:
            break
        skip = progress.in_epoch if epoch == progress.epoch else 0
        show = loop.show_progress and world.is_main
        bar = tqdm(total=len(sizes), initial=skip, desc=f"epoch {epoch + 1}/{loop.epochs}", unit="step",
                   leave=False, dynamic_ncols=True, disable=None if show else True)
        started = time.perf_counter()
        batches = loop.batches.steps(epoch, sizes, world.rank, world.size, loop.drop_last, skip=skip)
        for in_epoch, (x, y, samples) in enumerate(batches, start=skip + 1):
            if loop.plan.size != run.sizes[progress.step]:  # the schedule moved on
                loop.plan = plan_for(run.sizes[progress.step], world.size, loop.micro_cap)
            progress.lr = loop.optimizer.param_groups[0]["lr"]
            loss_sum, correct = train_step(loop, x, y, samples)
            pending.append((loss_sum, len(y)))
            progress.add(loss_sum, correct, len(y))
            progress.step += 1
            progress.samples_seen += samples
            at_epoch_end = in_epoch == len(sizes)
            progress.epoch, progress.in_epoch = (epoch + 1, 0) if at_epoch_end else (epoch, in_epoch)
            bar.update()
            eval_due = _eval_due(loop, progress, at_epoch_end)
            checkpoint_due = loop.checkpoint is not None and _checkpoint_due(loop, progress, at_epoch_end)
            stop = False
            if eval_due or checkpoint_due or len(pending) >= loop.check_every:
                diverged, stop = _look(loop, progress, pending)
                if diverged:  # no evaluation, no checkpoint: the last good one stays as it was
                    progress.train_time_s += time.perf_counter() - started
                    log.error("the training loss is not finite at step %d (last finite: %s): stopping, status "
                              "diverged", progress.diverged_at_step, progress.last_finite_loss)
                    bar.close()
                    return "diverged"
            if not bar.disable and (progress.step % 10 == 0 or bar.n == bar.total):
                _show_postfix(bar, loop, progress, progress.train_time_s + time.perf_counter() - started)
            if eval_due:
                progress.train_time_s += time.perf_counter() - started
                _log(loop, progress, epoch + in_epoch / len(sizes))
                started = time.perf_counter()
            if loop.checkpoint is not None and (stop or checkpoint_due):
                progress.train_time_s += time.perf_counter() - started
                loop.checkpoint(loop, progress)
                started = time.perf_counter()
            if stop:
                log.warning("signal %d: checkpoint saved at step %d; stopping, status preempted", loop.stop_signal,
                            progress.step)
                status = "preempted"
                break
        progress.train_time_s += time.perf_counter() - started
        bar.close()
        if status != "completed":
            break
    return status


def _look(loop: Loop, progress: Progress, pending: list) -> tuple[bool, bool]:
    """Look at the losses of the steps since the last look (one wait for the device), and agree
    over the ranks: (diverged, stop) — a non-finite loss on any rank, a stop signal on any rank.
    Sets the step of the first non-finite loss and the last finite mean loss before it."""
    losses = torch.stack([loss for loss, _ in pending]).double().tolist()
    means = [loss / max(n, 1) for loss, (_, n) in zip(losses, pending)]
    first_bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), len(losses))
    diverged, stop = first_bad < len(losses), bool(loop.stop_signal)
    if loop.world.distributed:
        flags = loop.world.all_reduce(torch.tensor([float(diverged), float(stop), -float(first_bad)],
                                                   dtype=torch.float64, device=loop.device), op="max")
        diverged, stop, first_bad = bool(flags[0]), bool(flags[1]), int(-flags[2].item())
    finite = means[:first_bad]
    if finite:
        progress.last_finite_loss = finite[-1]
    if diverged:
        progress.diverged_at_step = progress.step - len(pending) + first_bad + 1
    pending.clear()
    return diverged, stop


def _checkpoint_due(loop: Loop, progress: Progress, at_epoch_end: bool) -> bool:
    every = loop.checkpoint_every_steps
    return ((every and progress.step % every == 0) or (at_epoch_end and loop.checkpoint_every_epoch)
            or progress.step >= loop.run_steps.total)


def _eval_due(loop: Loop, progress: Progress, at_epoch_end: bool) -> bool:
    if progress.step >= loop.run_steps.total:
        return True
    if loop.eval_every_steps:
        return progress.step % loop.eval_every_steps == 0
    return at_epoch_end


def _log(loop: Loop, progress: Progress, epoch: float) -> None:
    record = eval_record(loop, progress, epoch)
    progress.records.append(record)
    loop.sinks.log(record)
    log.info(
        f"epoch {record['epoch']:g} step {record['step']}: train_loss {record['train_loss']:.4f} "
        f"train_acc {record['train_acc']:.4f} val_loss {record['val_loss']:.4f} "
        f"val_acc {record['val_acc']:.4f} lr {record['lr']:.4g}"
    )


def _show_postfix(bar: tqdm, loop: Loop, progress: Progress, train_seconds: float) -> None:
    n = max(progress.running_samples, 1)
    bar.set_postfix(
        loss=f"{float(progress.loss_sum) / n:.4f}",
        acc=f"{float(progress.correct) / n:.3f}",
        lr=f"{progress.lr:.3g}",
        samples_s=f"{progress.samples_seen / max(train_seconds, 1e-9):.0f}",
        refresh=False,
    )
