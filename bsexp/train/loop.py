"""The training loop: `build_loop` puts a run's parts together once; `train` reads top to bottom,
one `train_step` per optimizer step, the batch policy saying which plan each step uses.

Evaluation and checkpointing are components called after every step that decide their own
interval (as torchtitan's checkpointer does); the watch looks at the losses (divergence) and at
stop signals, every step on a CPU and every 16 on a GPU so as not to stall it. Everything the
loop counts is in `TrainState`, which stays valid if a step raises; everything else is built
once and not replaced.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, open_dict
from tqdm import tqdm

from bsexp.batch.control import BatchControl
from bsexp.batch.hparams import Rules, scaled
from bsexp.batch.policies import Hooks, Probe, policy_for
from bsexp.batch.scaling import ScaledHparams
from bsexp.config import schema
from bsexp.config.checks import check
from bsexp.engine.build import build_data, build_model, make_step, sync_batchnorm, wrap_model
from bsexp.engine.datasets import Splits
from bsexp.engine.distributed import World
from bsexp.engine.evaluate import Evaluator
from bsexp.engine.feed import train_feed
from bsexp.engine.optim import Hyperparameters
from bsexp.engine.regularisers import RegulariserRules, Regularisers
from bsexp.engine.step import Step, train_step
from bsexp.errors import ConfigError
from bsexp.finder import server
from bsexp.finder.find import find_plan
from bsexp.runs.checkpoint import Checkpointer
from bsexp.runs.ladder import Ladder
from bsexp.system.cores import Threads
from bsexp.system.metrics import Sinks
from bsexp.system.runtime import compiled_graphs, preserved_rng, resolve_device, run_speed, seed_everything

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class TrainState:
    """Counters of the run so far, and the running sums since the last evaluation."""

    step: int = 0
    samples_seen: int = 0
    loss_sum: torch.Tensor | float = 0.0  # summed per-sample training loss
    correct: torch.Tensor | float = 0.0
    running_samples: int = 0  # this rank's, since the last evaluation
    train_time_s: float = 0.0
    wall_time_before: float = 0.0  # the processes' wall time before this one's (a resumed run), to their checkpoints
    started: float = field(default_factory=time.perf_counter)  # when this process began the run
    best_val_acc: float = 0.0
    lr: float = 0.0  # the LR of the last step taken
    epoch: int = 0  # where the run is: the epoch, and the steps of it done (for a resumed run)
    in_epoch: int = 0
    samples_before: int = 0  # samples seen before this run's own training (a branch: the trunk's)
    last_finite_loss: float | None = None  # the mean training loss of the last step before a divergence
    diverged_at_step: int | None = None
    stopped_at: int | None = None  # the step the run reached trainer.stop_at (or its ladder's top) and ended
    records: list[dict[str, Any]] = field(default_factory=list)
    # What the run started with (bsexp.train.summary.hyperparameters): a resumed run's are its start's,
    # not those of where it resumed (an adaptive or scheduled batch has moved by then)
    hparams: dict[str, Any] | None = None

    @property
    def wall_time_s(self) -> float:
        """The run's wall time: this process's so far, after those it resumed from."""
        return self.wall_time_before + time.perf_counter() - self.started

    def add(self, loss_sum: torch.Tensor, correct: torch.Tensor, samples: int) -> None:
        if self.running_samples:
            self.loss_sum += loss_sum  # in place: no new tensor per step
            self.correct += correct
        else:
            self.loss_sum, self.correct = loss_sum.clone(), correct.clone()
        self.running_samples += samples

    def take_running(self, world: World) -> tuple[float, float]:
        """Mean training loss and accuracy over every micro-batch of every rank since the last call."""
        sums = world.all_reduce(
            torch.tensor(
                [float(self.loss_sum), float(self.correct), self.running_samples],
                dtype=torch.float64,
                device=world.device,
            )
        )
        n = max(sums[2].item(), 1)
        self.loss_sum, self.correct, self.running_samples = 0.0, 0.0, 0
        return sums[0].item() / n, sums[1].item() / n


class Watch:
    """Looks at the losses of the steps since its last look (one wait for the device) and at stop
    signals, agreeing over the ranks: a non-finite loss on any rank, a signal on any rank."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.pending: list[tuple[torch.Tensor, int]] = []
        self.stop_signal = 0  # set by a SIGTERM/SIGUSR1/SIGINT handler (bsexp.train.job)

    def add(self, loss_sum: torch.Tensor, samples: int) -> None:
        self.pending.append((loss_sum, samples))

    @property
    def ready(self) -> bool:
        return len(self.pending) >= self.every

    def look(self, world: World, state: TrainState) -> tuple[bool, bool]:
        """(diverged, stop). Sets the step of the first non-finite loss and the last finite mean
        loss before it."""
        losses = torch.stack([loss for loss, _ in self.pending]).double().tolist()
        means = [loss / max(n, 1) for loss, (_, n) in zip(losses, self.pending)]
        first_bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), len(losses))
        diverged, stop = first_bad < len(losses), bool(self.stop_signal)
        if world.distributed:
            flags = world.all_reduce(
                torch.tensor(
                    [float(diverged), float(stop), -float(first_bad)], dtype=torch.float64, device=world.device
                ),
                op="max",
            )
            diverged, stop, first_bad = bool(flags[0]), bool(flags[1]), int(-flags[2].item())
        finite = means[:first_bad]
        if finite:
            state.last_finite_loss = finite[-1]
        if diverged:
            state.diverged_at_step = state.step - len(self.pending) + first_bad + 1
        self.pending.clear()
        return diverged, stop


@dataclass(frozen=True, kw_only=True)
class Loop:
    """A run's parts, built once by `build_loop`."""

    step: Step
    batch_control: BatchControl  # the batch policy's layout in force, and the plan of every step
    hyperparameters: Hyperparameters  # writes each step's LR and weight decay
    regularisers: Regularisers  # dropout rates and BatchNorm momenta, where a rule moves them with the batch
    splits: Splits
    feed: Any  # TensorBatches or LoaderBatches: a split's samples, one step at a time
    hp: ScaledHparams
    drop_last: bool
    evaluator: Evaluator
    watch: Watch
    sinks: Sinks  # filled by the job (bsexp.train.job) on rank 0; empty elsewhere
    sync_batchnorm: bool = False
    ghost_batch: int | None = None
    checkpointer: Checkpointer | None = None
    show_progress: bool = True
    graphs_before: int = 0  # graphs torch.compile had compiled in this process before this run
    # End the run once it reaches trainer.stop_at (a ladder of that one rung of trainer.stop_metric)
    stop_at: Ladder | None = None
    stop_ladder: Ladder | None = None  # end the run once it reaches this ladder's top rung (trainer.ladder_stop)
    threads: Threads  # the CPU threads: pinned, or a share of the cores moved between steps (bsexp.system.cores)

    @property
    def world(self) -> World:
        return self.step.world

    @property
    def norm_batch(self) -> int:
        """Samples a BatchNorm layer normalises over in one forward: the micro-batch, over all
        ranks with SyncBatchNorm; with ghost batches, the smallest of the micro-batch's chunks."""
        plan = self.batch_control.current
        chunks = plan.micro_size // self.ghost_batch if self.ghost_batch else 1
        if chunks >= 2:
            return plan.micro_size // chunks
        return plan.micro_size * (plan.world_size if self.sync_batchnorm else 1)


def build_loop(
    cfg: DictConfig,
    world: World | None = None,
    run_dir: Path | None = None,
    resumed: dict | None = None,
    trunk: dict | None = None,
    threads: Threads | None = None,
) -> Loop:
    """Check the config, seed, build data and model, let the batch policy lay the run out (the
    finder measures here, leaving every random generator as it was), then the step's parts.
    Every rank builds the same model from the same seed. `run_dir`: checkpoints go there.
    `resumed`: a checkpoint's state, whose batch policy is taken instead of resolved afresh.
    `trunk`: where a branch starts (bsexp.runs.trunk.find). `threads`: the run's share of the cores
    (bsexp.train.job), else the count torch has."""
    check(cfg)
    world = world or World(device=resolve_device(str(cfg.device)))
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    splits, model, batch_control = _lay_out(cfg, world, None if resumed is None else resumed["policy"], trunk)
    model, grad_sync = wrap_model(cfg, model, world.device, world.distributed)
    rules = Rules.of(cfg)
    hp, _ = scaled(batch_control.layout, rules)
    on_oom = batch_control.after_oom if cfg.trainer.oom_recovery else None
    step = make_step(
        cfg,
        model,
        world,
        world.distributed,
        hp,
        grad_sync,
        on_oom=on_oom,
        measure_noise=batch_control.hooks.measures_noise,
        n_train=len(splits.train),
    )
    sinks = Sinks()
    return Loop(
        step=step,
        batch_control=batch_control,
        # With graphs the LR is a device tensor written in place, and the step gathers its own rows.
        hyperparameters=Hyperparameters(
            step.optimizer, rules, batch_control.layout, lr_device=None if step.graphs is None else world.device
        ),
        regularisers=Regularisers(step.net, RegulariserRules.of(cfg)),
        splits=splits,
        feed=train_feed(splits, cfg.seed, world.device, deferred=step.graphs is not None),
        hp=hp,
        drop_last=cfg.batch.drop_last,
        evaluator=_evaluator(cfg, sinks, batch_control),
        stop_at=_stop_target(cfg, splits),
        stop_ladder=Ladder.of(cfg.trainer) if cfg.trainer.get("ladder_stop") else None,
        watch=Watch(every=1 if world.device.type == "cpu" else 16),
        sinks=sinks,
        sync_batchnorm=sync_batchnorm(cfg, world.distributed),
        ghost_batch=cfg.model.get("ghost_batch"),
        checkpointer=None if run_dir is None else Checkpointer.of(cfg, run_dir),
        show_progress=cfg.trainer.progress,
        graphs_before=compiled_graphs(),
        threads=threads or Threads(threads=torch.get_num_threads()),
    )


def _evaluator(cfg: DictConfig, sinks: Sinks, batch_control: BatchControl) -> Evaluator:
    """When the run evaluates (every so many steps, or at steps growing by `trainer.eval_growth`)."""
    return Evaluator(
        cfg.trainer.eval_every_steps,
        cfg.trainer.eval_batch_size,
        sinks,
        batch_control.layout.eval_steps,
        growth=cfg.trainer.get("eval_growth"),
        precise_bn=None if cfg.trainer.get("precise_bn") is None else (cfg.trainer.precise_bn, cfg.seed),
    )


def _stop_target(cfg: DictConfig, splits: Splits) -> Ladder | None:
    """trainer.stop_at, a ladder of one rung of trainer.stop_metric (its bounds checked with the
    config); bits per byte only where the data has them (text whose tokens' bytes are known)."""
    has_bpb = splits.tokens is not None and splits.tokens.bytes_per_token is not None
    for key in ("stop_metric", "ladder_metric"):
        if str(cfg.trainer[key]) == "val_bpb" and not has_bpb:
            raise ConfigError(
                f"trainer.{key}", "val_bpb", f"data {splits.name} has no bits per byte; valid: val_loss, val_acc"
            )
    if cfg.trainer.get("stop_at") is None:
        return None
    return Ladder(str(cfg.trainer.stop_metric), (float(cfg.trainer.stop_at),))


def _lay_out(cfg: DictConfig, world: World, state: dict | None, trunk: dict | None):
    """Seed, build the data and the model, and let the batch policy lay the run out, measuring
    with the finder and the noise scale where it asks (or, resuming, from its `state`). The data,
    the unwrapped model and the run's BatchControl."""
    policy = policy_for(cfg, world.size, trunk)
    hooks = Hooks(policy)
    policy.check()
    # The CPU finder's probe processes fork from a server that imports torch and bsexp while this
    # process builds the data and the model; it is stopped once the policy has laid the run out.
    with server.running(state is None and world.device.type == "cpu" and hooks.searches()):
        seed_everything(cfg.seed, cfg.trainer.deterministic, run_speed(cfg, world.device))
        splits = build_data(cfg).to(world.device)
        n_train = len(splits.train)
        hooks.check_data(n_train, splits.name)
        model = build_model(cfg, splits)
        probe = Probe(
            n_train,
            splits.name,
            world,
            find=lambda **bounds: find_plan(cfg, world, splits, model.to(world.device), **bounds),
            measure_noise=lambda batch, steps: _measure_noise(cfg, world, n_train, batch, steps),
        )
        batch_control = BatchControl(policy, policy.lay_out(probe, state))
    if state is not None:
        batch_control.load_state_dict(state)
    return splits, model, batch_control


def _measure_noise(cfg: DictConfig, world: World, n_train: int, batch: int, steps: int) -> float | None:
    """B_simple from a copy of the run trained `steps` steps at `batch` with the noise measured
    on every step (trainer.noise_scale=always); every random generator is left as it was."""
    probe = copy.deepcopy(cfg)
    with open_dict(probe):
        probe.batch = {"policy": "fixed", "size": batch, "drop_last": cfg.batch.drop_last}
        probe.trainer.max_steps, probe.trainer.noise_scale = steps, schema.NoiseMode.always
        probe.trainer.progress, probe.trainer.eval_every_steps = False, 0
        probe.epochs = max(cfg.epochs, math.ceil(steps * batch / n_train))
    with preserved_rng():
        loop = build_loop(probe, world)
        train(loop, TrainState())
    return loop.step.noise.scale.summary()["noise_b_simple"]


def train(loop: Loop, state: TrainState) -> str:
    """Train for the run's steps from where `state` stands (a resumed run continues mid-epoch);
    returns the status: completed, diverged (a non-finite loss) or preempted (a signal: a
    checkpoint is saved first)."""
    world, batch_control = loop.world, loop.batch_control
    loop.step.model.train()
    if loop.checkpointer is not None:
        loop.checkpointer.start(loop, state)
    epoch = state.epoch
    while epoch < len(batch_control.layout.run.epoch_starts):  # as laid out now: AdaScale's run grows or shrinks
        sizes = batch_control.epoch_sizes(epoch)  # read step by step: a closed-loop policy changes the steps ahead
        if not len(sizes):
            break
        skip = state.in_epoch if epoch == state.epoch else 0
        bar = EpochBar.of(loop, epoch, len(sizes), skip)
        clock = _Clock(state)
        batches = loop.feed.steps(epoch, sizes, world.rank, world.size, loop.drop_last, skip=skip)
        for in_epoch, (x, y, samples) in enumerate(batches, start=skip + 1):
            loop.threads.between_steps(state.step)  # a share of the cores moved since the last step
            state.lr = loop.hyperparameters.apply(state.step, batch_control.layout)
            plan = batch_control.plan(state.step)
            loop.regularisers.apply(plan.size)
            loss_sum, correct, _ = train_step(loop.step, x, y, samples, plan)
            state.add(loss_sum, correct, len(y))
            state.step, state.samples_seen = state.step + 1, state.samples_seen + samples
            batch_control.adapt(state.step, world, loop.step.noise)
            at_epoch_end = in_epoch == len(sizes)
            state.epoch, state.in_epoch = (epoch + 1, 0) if at_epoch_end else (epoch, in_epoch)
            bar.total = len(sizes)
            bar.update()
            loop.watch.add(loss_sum, len(y))
            status = _after_step(loop, state, at_epoch_end, bar, clock)
            if status is not None:
                clock.stop()
                bar.close()
                return status
        clock.stop()
        bar.close()
        epoch += 1
    return "completed"


def _after_step(loop: Loop, state: TrainState, at_epoch_end: bool, bar: tqdm, clock: _Clock) -> str | None:
    """What is due after a step: a look at the losses and signals, the progress bar, an evaluation,
    a checkpoint. The status where the run must stop (diverged, preempted), else None."""
    total = loop.batch_control.layout.total
    eval_due = loop.evaluator.due(state.step, at_epoch_end, total)
    save_due = loop.checkpointer is not None and loop.checkpointer.due(
        state.step, at_epoch_end, total, state.samples_seen
    )
    diverged = stop = False
    if eval_due or save_due or loop.watch.ready:
        diverged, stop = loop.watch.look(loop.world, state)
    if diverged:  # no evaluation, no checkpoint: the last good one stays as it was
        log.error(
            "the training loss is not finite at step %d (last finite: %s): stopping, status diverged",
            state.diverged_at_step,
            state.last_finite_loss,
        )
        return "diverged"
    if not bar.disable and (state.step % 10 == 0 or bar.n == bar.total):
        _show_postfix(bar, state, clock.seconds())
    reached = None
    if eval_due:
        with clock.paused():
            loop.evaluator.log(loop, state, loop.batch_control.epochs_done(state))
        reached = _target_reached(loop, state.records[-1])
    if reached:  # steps to result: the run has what it was for (every rank saw the same record)
        state.stopped_at = state.step
        log.info("%s at step %d: the run ends here", reached, state.step)
        save_due = True
    if loop.checkpointer is not None and (stop or save_due):
        with clock.paused():
            loop.checkpointer.save(loop, state)
    if stop:
        log.warning(
            "signal %d: checkpoint saved at step %d; stopping, status preempted", loop.watch.stop_signal, state.step
        )
        return "preempted"
    return "completed" if reached else None


def _target_reached(loop: Loop, record: dict[str, Any]) -> str | None:
    """What the run was for, where this evaluation reached it: trainer.stop_at, or the top rung of
    its ladder (trainer.ladder_stop); None where it goes on."""
    if loop.stop_at is not None and loop.stop_at.top_reached(record):
        metric = loop.stop_at.metric
        return f"{metric} {record[metric]:.4f} reached trainer.stop_at={loop.stop_at.top:g}"
    ladder = loop.stop_ladder
    if ladder is not None and ladder.top_reached(record):
        return f"{ladder.metric} {record[ladder.metric]:.4f} reached the ladder's top rung {ladder.top:g}"
    return None


class EpochBar(tqdm):
    """tqdm without its monitor thread, which every bar would start even when disabled: a thread's
    stack is 8 MB of address space, room a run under `trainer.memory_limit_gb` would lose to it
    and the finder's trials would not see. The monitor only lowers `miniters` for bars that
    print too rarely; an epoch's bar updates every step."""

    monitor_interval = 0

    @classmethod
    def of(cls, loop: Loop, epoch: int, steps: int, done: int) -> EpochBar:
        """The bar of `epoch` (`steps` steps, `done` of them already), shown on rank 0 only."""
        return cls(
            total=steps,
            initial=done,
            desc=f"epoch {epoch + 1}/{len(loop.batch_control.layout.run.epoch_starts)}",
            unit="step",
            leave=False,
            dynamic_ncols=True,
            disable=None if loop.show_progress and loop.world.is_main else True,
        )


class _Clock:
    """Training time into `state.train_time_s`, paused while evaluating or saving."""

    def __init__(self, state: TrainState) -> None:
        self.state, self.started = state, time.perf_counter()

    def seconds(self) -> float:
        return self.state.train_time_s + time.perf_counter() - self.started

    def stop(self) -> None:
        self.state.train_time_s += time.perf_counter() - self.started
        self.started = time.perf_counter()

    @contextlib.contextmanager
    def paused(self):
        self.stop()
        yield
        self.started = time.perf_counter()


def _show_postfix(bar: tqdm, state: TrainState, train_seconds: float) -> None:
    n = max(state.running_samples, 1)
    bar.set_postfix(
        loss=f"{float(state.loss_sum) / n:.4f}",
        acc=f"{float(state.correct) / n:.3f}",
        lr=f"{state.lr:.3g}",
        samples_s=f"{state.samples_seen / max(train_seconds, 1e-9):.0f}",
        refresh=False,
    )
