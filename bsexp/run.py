"""One training job: build the parts from the config, train, evaluate, write `summary.json`."""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import math
from dataclasses import asdict
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf, open_dict
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.contrib.logging import logging_redirect_tqdm

from bsexp import checkpoint as ckpt
from bsexp import config as schema
from bsexp.batch_schedule import plan_for
from bsexp.data import Splits, train_batches
from bsexp.finder import find_plan
from bsexp.distributed import GradSync, World, close_world, init_world, sum_gradients_hook
from bsexp.errors import ConfigError
from bsexp.metrics import JsonlSink, NullSink, Sinks, WandbSink
from bsexp.noise import NoiseScale
from bsexp.optim import build_optimizer, build_scheduler, scaled_hparams
from bsexp.plan import BatchPlan, make_plan
from bsexp.runtime import (autocast, grad_scaler, limit_memory, peak_memory_mb, provenance, reset_peak_memory,
                           resolve_device, seed_everything)
from bsexp.syncbn import convert_sync_batchnorm
from bsexp.trainer import Loop, Progress, evaluate, train

log = logging.getLogger(__name__)


def build_data(cfg: DictConfig) -> Splits:
    splits = schema.call_target("data", cfg.data)
    if not isinstance(splits, Splits):
        raise ConfigError("data._target_", cfg.data._target_, f"must return bsexp.data.Splits, got {type(splits).__name__}")
    return splits


def build_model(cfg: DictConfig, splits: Splits) -> nn.Module:
    model = schema.call_target("model", cfg.model, input_shape=splits.input_shape, num_classes=splits.num_classes)
    if not isinstance(model, nn.Module):
        raise ConfigError("model._target_", cfg.model._target_, f"must return a torch.nn.Module, got {type(model).__name__}")
    return model


def build_sinks(cfg: DictConfig, run_dir: Path, hparams: dict[str, Any], keep_records: int | None = None,
                wandb_id: str | None = None):
    """metrics.jsonl (continued after its first `keep_records` lines when resuming) and W&B
    (continuing run `wandb_id` when resuming)."""
    try:
        sinks: list = [JsonlSink(run_dir / "metrics.jsonl", keep=keep_records)]
    except FileExistsError:
        raise ConfigError("hydra.run.dir", str(run_dir), "already holds metrics.jsonl; choose a new directory") from None
    if cfg.logger.kind == schema.LoggerKind.wandb:
        config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
        config["derived"] = hparams
        try:
            sinks.append(WandbSink(cfg.logger.wandb, run_dir, config, run_id=wandb_id))
        except Exception as exc:  # W&B is a view of the run, never a reason to lose it
            log.warning("W&B could not start (%s); logging locally to %s only", exc, run_dir)
    return Sinks(*sinks)


def build_loop(cfg: DictConfig, plan: BatchPlan | None, world: World | None = None) -> Loop:
    """Seed, then build data, model, optimizer and schedule for `plan` on `world` (one process
    if not given; sinks are set later). Every rank builds the same model from the same seed.
    With `plan` None the batch finder decides it, leaving every random generator untouched."""
    world = world or World(device=resolve_device(str(cfg.device)))
    device = world.device
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    seed_everything(cfg.seed, cfg.trainer.deterministic)
    splits = build_data(cfg).to(device)
    size = plan.size if plan is not None else cfg.batch.size
    if size is not None and size > len(splits.train):
        raise ConfigError("batch.size", size, f"exceeds the {len(splits.train)} training samples of {splits.name}")
    model = build_model(cfg, splits)
    found, micro_cap = None, None if plan is None else plan.micro_size
    if plan is None:  # batch=finder
        found = find_plan(cfg, world, splits, model.to(device), keep_size=cfg.batch.size)
        plan, micro_cap = found.plan, found.plan.micro_size
        if str(cfg.batch.finder.objective) == "noise_scale":
            plan = noise_scale_plan(cfg, world, found, len(splits.train))
    schedule = schema.batch_schedule(cfg, start=plan.size)
    scheduled_sizes = schedule.sizes(cfg.epochs)
    if max(scheduled_sizes) > len(splits.train):
        raise ConfigError("batch.schedule", scheduled_sizes,
                          f"grows past the {len(splits.train)} training samples of {splits.name}")
    if cfg.batch.policy == schema.Policy.scheduled:
        micro_cap = cfg.batch.micro_size
        if cfg.batch.find_micro_size:  # the largest micro-batch that fits bounds them all
            largest = max(scheduled_sizes) // world.size
            found = find_plan(cfg, world, splits, model.to(device), largest=largest)
            micro_cap = found.micro_size if micro_cap is None else min(micro_cap, found.micro_size)
        plan = plan_for(plan.size, world.size, micro_cap)
    if world.distributed:
        sync_bn = cfg.distributed.sync_batchnorm
        if sync_bn or sync_bn is None:  # per-rank statistics (Goyal et al.'s recipe) only when asked
            model = convert_sync_batchnorm(model, device)
        model = model.to(device)
        # Buffers are not broadcast at every forward (ranks may do different numbers of forwards
        # in an epoch's last step); evaluation takes rank 0's (World.sync_buffers).
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                        **_NO_FORWARD_BUFFER_SYNC)
        grad_sync = GradSync()
        model.register_comm_hook(grad_sync, sum_gradients_hook)
    else:
        model, grad_sync = model.to(device), None
    run_steps = schedule.run_steps(cfg.epochs, len(splits.train), cfg.batch.drop_last, cfg.trainer.max_steps)
    hp, lr_factors = scaled_hparams(cfg, plan, run_steps)
    optimizer = build_optimizer(cfg, model, hp)
    precision = str(cfg.precision)
    noise_mode = str(cfg.trainer.noise_scale)
    if grad_sync is not None:
        grad_sync.measure = noise_mode != "off"
    return Loop(
        model=model, optimizer=optimizer, scheduler=build_scheduler(optimizer, lr_factors),
        scaler=grad_scaler(device, precision), autocast=autocast(device, precision),
        batches=train_batches(splits, cfg.seed, device), splits=splits, plan=plan, run_steps=run_steps, hp=hp,
        sinks=NullSink(), world=world, epochs=cfg.epochs, clip_grad_norm=cfg.trainer.clip_grad_norm,
        eval_every_steps=cfg.trainer.eval_every_steps, eval_batch_size=cfg.trainer.eval_batch_size,
        drop_last=cfg.batch.drop_last, show_progress=cfg.trainer.progress, grad_sync=grad_sync, finder=found,
        micro_cap=micro_cap, oom_recovery=cfg.trainer.oom_recovery,
        sync_batchnorm=world.distributed and cfg.distributed.sync_batchnorm is not False,
        noise=None if noise_mode == "off" else NoiseScale(decay=cfg.trainer.noise_decay),
        noise_split=noise_mode == "always",
        check_every=1 if device.type == "cpu" else 16,  # on a GPU, look without stalling it every step
    )


def noise_scale_plan(cfg: DictConfig, world: World, found, n_train: int) -> BatchPlan:
    """batch.finder.objective=noise_scale: train a copy of the run for batch.finder.noise_steps
    steps at batch.finder.noise_batch (at most what fits), measuring the gradient noise scale
    B_simple (McCandlish et al. 2018), then take the batch nearest it that fits in memory and
    divides over the ranks. Every random generator is as before: the run then trains exactly as
    batch=fixed at that batch would."""
    from bsexp.batch_schedule import MIN_MICRO
    from bsexp.finder import preserved_rng

    node, quantum = cfg.batch.finder, 2 * world.size  # two halves on every rank
    fits = found.micro_size * world.size
    measure = max(quantum * MIN_MICRO, min(node.noise_batch, fits, n_train) // quantum * quantum)
    probe = copy.deepcopy(cfg)
    with open_dict(probe):
        probe.batch.policy, probe.batch.size = schema.Policy.fixed, measure
        probe.trainer.max_steps, probe.trainer.noise_scale = node.noise_steps, schema.NoiseMode.always
        probe.trainer.progress, probe.trainer.eval_every_steps = False, 0
        probe.epochs = max(cfg.epochs, math.ceil(node.noise_steps * measure / n_train))
    with preserved_rng():
        loop = build_loop(probe, schema.batch_plan(probe), world)
        train(loop, Progress())
    b_simple = loop.noise.summary()["noise_b_simple"]
    if b_simple is None:
        raise ConfigError("batch.finder.noise_steps", node.noise_steps, "too few to estimate the gradient noise "
                          "scale (|G|^2 not yet positive); measure for more steps")
    target = min(max(b_simple, world.size * MIN_MICRO), fits, n_train)
    size = max(world.size * MIN_MICRO, round(target / world.size) * world.size)
    if size > fits:
        size -= world.size
    found.noise_b_simple = b_simple
    found.note = (f"Noise-scale objective: B_simple = {b_simple:,.0f} measured over {node.noise_steps} steps at "
                  f"batch {measure}; the nearest batch that fits (at most {fits}) and divides over {world.size} "
                  f"rank(s) is {size}.")
    found.plan = make_plan(size, world.size)
    log.info("gradient noise scale B_simple = %.0f (measured over %d steps at batch %d): training at batch %d",
             b_simple, node.noise_steps, measure, size)
    return found.plan


# The name of DDP's switch changed in torch 2.15 (buffers still synchronised once, at wrapping).
_NO_FORWARD_BUFFER_SYNC = ({"forward_sync_buffers": False}
                           if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                           else {"broadcast_buffers": False})


def run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """The whole job on this rank; rank 0 writes `summary.json` whatever the outcome and always
    finishes the W&B run."""
    started = time.perf_counter()
    plan = schema.check(cfg)
    world = init_world(str(cfg.device), str(cfg.distributed.backend), cfg.distributed.timeout_s)
    run_dir = Path(world.broadcast_object(str(run_dir)))  # rank 0's, where ranks disagree
    summary = _run_on(world, cfg, plan, run_dir, started)
    # Only after a clean run: tearing the group down while a failed rank's peers still wait in a
    # collective aborts the process before its error is reported; the process ends anyway.
    close_world(world)
    return summary


def _run_on(world: World, cfg: DictConfig, plan: BatchPlan, run_dir: Path, started: float) -> dict[str, Any]:
    resumed = ckpt.find(cfg.resume, run_dir)
    if resumed is not None and plan is None:  # batch=finder: the plan found before, not a new search
        plan = BatchPlan(**resumed[1]["finder_plan"])
    loop = build_loop(cfg, plan, world)
    progress = Progress()
    wandb_id = None
    if resumed is not None:
        wandb_id = restore(cfg, loop, progress, *resumed)
    hparams = hyperparameters(cfg, loop)
    if world.is_main:
        _announce(cfg, loop, hparams)
        loop.sinks = build_sinks(cfg, run_dir, hparams, keep_records=len(progress.records) if resumed else None,
                                 wandb_id=wandb_id)
        if loop.finder is not None:
            log.info(loop.finder.table())
            write_json(run_dir / "finder.json", loop.finder.to_json())
            loop.sinks.table("finder/trials", [asdict(t) for t in loop.finder.trials])
    node = cfg.checkpoint
    loop.checkpoint = lambda lp, pr: save_checkpoint(cfg, lp, pr, run_dir)
    loop.checkpoint_every_steps, loop.checkpoint_every_epoch = node.every_steps, node.every_epoch
    if cfg.trainer.memory_limit_gb is not None:
        limit_memory(loop.device, int(cfg.trainer.memory_limit_gb * 2**30))
    status, test = "failed", None
    reset_peak_memory(loop.device)
    try:
        with logging_redirect_tqdm(), _stop_on_signals(loop):
            status = train(loop, progress)
        if loop.splits.test is not None and status == "completed":
            test = evaluate(loop, loop.splits.test)
    except KeyboardInterrupt:
        status = "preempted"
        raise
    finally:
        summary = make_summary(cfg, status, loop, hparams, progress, test, time.perf_counter() - started)
        summary["resumed_from"] = str(resumed[0]) if resumed is not None else None
        if status == "preempted" and loop.stop_signal:
            summary["preempted_by"] = signal.Signals(loop.stop_signal).name
        if world.is_main:
            write_json(run_dir / "summary.json", summary)
            loop.sinks.summary(summary)
            loop.sinks.close(status)
    if world.is_main:
        print_summary(summary, run_dir)
    return summary


@contextlib.contextmanager
def _stop_on_signals(loop: Loop):
    """SIGTERM (a scheduler's preemption, torchrun's shutdown) and SIGUSR1 (SLURM's warning before
    the time limit) ask the loop to save a checkpoint at the next step boundary and stop."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = (signal.SIGTERM, signal.SIGUSR1)
    previous = {s: signal.getsignal(s) for s in wanted}

    def ask_to_stop(signum, frame):
        loop.stop_signal = signum

    for s in wanted:
        signal.signal(s, ask_to_stop)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        # A handler that was there before (submitit's, which requeues a SLURM job on SIGUSR1)
        # still gets the signal, once the checkpoint is saved: the requeued job resumes from it.
        chained = previous.get(loop.stop_signal)
        if loop.stop_signal and callable(chained) and chained is not signal.default_int_handler:
            chained(loop.stop_signal, None)


def identity(cfg: DictConfig, loop: Loop) -> dict[str, Any]:
    """What a checkpoint must share with the run that resumes from it."""
    return {"model": cfg.model._target_, "batch_size": loop.run_steps.sizes[0] if loop.run_steps.sizes else None,
            "world_size": loop.world.size,
            "shapes": {k: list(v.shape) for k, v in loop.net.state_dict().items()}}


def save_checkpoint(cfg: DictConfig, loop: Loop, progress: Progress, run_dir: Path) -> None:
    """Every rank hands its random generators and running sums to rank 0, which writes."""
    mine = {"rng": ckpt.rng_state(), "running": (float(progress.loss_sum), float(progress.correct),
                                                 progress.running_samples)}
    ranks = loop.world.gather_object(mine)
    if not loop.world.is_main:
        return
    state = {
        "step": progress.step, "epoch": progress.epoch, "in_epoch": progress.in_epoch,
        "samples_seen": progress.samples_seen, "train_time_s": progress.train_time_s,
        "best_val_acc": progress.best_val_acc, "records": progress.records, "lr": progress.lr,
        "last_finite_loss": progress.last_finite_loss,
        "model": loop.net.state_dict(), "optimizer": loop.optimizer.state_dict(),
        "scheduler": loop.scheduler.state_dict(), "scaler": loop.scaler.state_dict(),
        "plan": asdict(loop.plan), "finder_plan": asdict(loop.finder.plan) if loop.finder is not None else None,
        "micro_cap": loop.micro_cap, "oom_recoveries": loop.oom_recoveries,
        "noise": asdict(loop.noise) if loop.noise is not None else None,
        "ranks": ranks, "identity": identity(cfg, loop), "wandb_id": loop.sinks.wandb_id(),
    }
    path = ckpt.save(run_dir, state, cfg.checkpoint.keep)
    log.debug("checkpoint %s", path)


def restore(cfg: DictConfig, loop: Loop, progress: Progress, path: Path, state: dict[str, Any]) -> str | None:
    """Put a freshly built run where the checkpoint left it; returns the W&B run id to continue."""
    different = ckpt.mismatches(state, identity(cfg, loop))
    if different and not cfg.checkpoint.allow_mismatch:
        raise ConfigError("resume", str(path), f"was written by another run: {'; '.join(different)}; set "
                                               f"checkpoint.allow_mismatch=true to load it anyway")
    ranks = state["ranks"]
    if len(ranks) != loop.world.size:
        raise ConfigError("resume", str(path), f"holds {len(ranks)} rank(s), this run has {loop.world.size}")
    loop.net.load_state_dict(state["model"])
    loop.optimizer.load_state_dict(state["optimizer"])
    loop.scheduler.load_state_dict(state["scheduler"])
    if state["scaler"]:
        loop.scaler.load_state_dict(state["scaler"])
    loop.plan, loop.micro_cap, loop.oom_recoveries = BatchPlan(**state["plan"]), state["micro_cap"], state["oom_recoveries"]
    if loop.noise is not None and state["noise"] is not None:
        loop.noise = NoiseScale(**state["noise"])
    for key in ("step", "epoch", "in_epoch", "samples_seen", "train_time_s", "best_val_acc", "records", "lr",
                "last_finite_loss"):
        setattr(progress, key, state[key])
    mine = ranks[loop.world.rank]
    progress.loss_sum, progress.correct, progress.running_samples = mine["running"]
    ckpt.set_rng_state(mine["rng"])
    log.info("resumed from %s: epoch %d, step %d of %d", path, progress.epoch, progress.step, loop.run_steps.total)
    return state["wandb_id"]


def hyperparameters(cfg: DictConfig, loop: Loop) -> dict[str, Any]:
    """What the plan and the scaling rules made of the config: logged, and in summary.json."""
    plan, hp = loop.plan, loop.hp
    return {
        "batch_size": plan.size, "micro_size": plan.micro_size, "accum_steps": plan.accum_steps,
        "world_size": plan.world_size, "ref_batch": cfg.scaling.ref_batch, "k": hp.k,
        "lr_rule": str(cfg.scaling.lr_rule), "wd_rule": str(cfg.scaling.wd_rule),
        "base_lr": cfg.optimizer.lr, "base_weight_decay": cfg.optimizer.weight_decay,
        "lr": hp.lr, "lr_peak": hp.lr_peak, "weight_decay": hp.weight_decay,
        "warmup_steps": hp.warmup_steps, "total_steps": hp.total_steps,
    }


def _announce(cfg: DictConfig, loop: Loop, hparams: dict[str, Any]) -> None:
    splits, h = loop.splits, hparams
    params = sum(p.numel() for p in loop.model.parameters())
    log.info("data %s: %d train / %d val / %s test, input %s, %d classes", splits.name, len(splits.train),
             len(splits.val), len(splits.test) if splits.test is not None else "no", splits.input_shape,
             splits.num_classes)
    log.info("model %s: %s parameters, on %s, %s", cfg.model._target_, f"{params:,}", loop.device, cfg.precision)
    log.info("batch %d = micro %d x accum %d x world %d; k = %d/%d = %g", h["batch_size"], h["micro_size"],
             h["accum_steps"], h["world_size"], h["batch_size"], h["ref_batch"], h["k"])
    log.info("lr %.4g (%s rule from %g), weight decay %.4g (%s rule from %g), warmup %d of %d steps",
             h["lr"], h["lr_rule"], h["base_lr"], h["weight_decay"], h["wd_rule"], h["base_weight_decay"],
             h["warmup_steps"], h["total_steps"])
    if h["lr_peak"] < h["lr"] * (1 - 1e-9):
        log.warning("schedule.warmup: the warmup (%d steps) does not end within the run (%d steps): the LR "
                    "peaks at %.4g, below the target %.4g", h["warmup_steps"], h["total_steps"], h["lr_peak"], h["lr"])


def make_summary(cfg: DictConfig, status: str, loop: Loop, hparams: dict[str, Any], progress: Progress,
                 test: tuple[float, float] | None, wall_time_s: float) -> dict[str, Any]:
    last = progress.records[-1] if progress.records else {}
    return {
        "status": status,
        **hparams,
        "diverged_at_step": progress.diverged_at_step,
        "last_finite_loss": progress.last_finite_loss,
        "final_batch_size": loop.plan.size,  # where a batch schedule ended
        "final_micro_size": loop.plan.micro_size,  # after any OOM recovery
        "oom_recoveries": loop.oom_recoveries,
        "epochs": last.get("epoch", 0),  # completed, as a fraction where the run stopped mid-epoch
        "steps": progress.step,
        "samples_seen": progress.samples_seen,
        **{key: last.get(key) for key in ("train_loss", "train_acc", "val_loss", "val_acc", "gen_gap")},
        "best_val_acc": progress.best_val_acc if progress.records else None,
        "test_loss": test[0] if test else None,
        "test_acc": test[1] if test else None,
        "wall_time_s": wall_time_s,
        "train_time_s": progress.train_time_s,
        "samples_per_s": progress.samples_seen / progress.train_time_s if progress.train_time_s else None,
        # After a failure a collective could meet a peer stuck in another one: this rank's figure.
        "peak_memory_mb": (peak_memory_mb(loop.device) if status in ("failed", "preempted")
                           else _max_over_ranks(loop.world, peak_memory_mb(loop.device))),
        "seed": cfg.seed,
        "data": loop.splits.name,
        "model": cfg.model._target_,
        "parameters": sum(p.numel() for p in loop.model.parameters()),
        "optimizer": cfg.optimizer._target_,
        "precision": str(cfg.precision),
        "device": str(loop.device),
        "threads": torch.get_num_threads(),
        "finder": loop.finder.summary() if loop.finder is not None else None,
        **(loop.noise or NoiseScale()).summary(),
        "provenance": provenance(),
    }


def _max_over_ranks(world: World, value: float) -> float:
    return world.all_reduce(torch.tensor([value], dtype=torch.float64, device=world.device), op="max").item()


def write_json(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def _changes(summary: dict[str, Any]) -> str:
    """How the batch moved during the run: the schedule's last batch, OOM recoveries."""
    notes = []
    if summary["final_batch_size"] != summary["batch_size"]:
        notes.append(f"grew to {summary['final_batch_size']}")
    if summary["oom_recoveries"]:
        notes.append(f"{summary['oom_recoveries']} OOM recoveries, final micro {summary['final_micro_size']}")
    return f" ({'; '.join(notes)})" if notes else ""


def print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    pct = lambda v: "-" if v is None else f"{100 * v:.2f} %"  # noqa: E731
    rows = [
        ("status", summary["status"]),
        ("data / model", f"{summary['data']} / {summary['model'].rsplit('.', 1)[-1]} "
                         f"({summary['parameters']:,} parameters)"),
        ("batch", f"{summary['batch_size']} = {summary['micro_size']} micro x {summary['accum_steps']} "
                  f"accum x {summary['world_size']} ranks" + _changes(summary)),
        ("lr / weight decay", f"{summary['lr']:.4g} ({summary['lr_rule']}, k={summary['k']:g}) / "
                              f"{summary['weight_decay']:.4g} ({summary['wd_rule']})"),
        ("epochs / steps", f"{summary['epochs']:g} / {summary['steps']}"),
        ("train acc", pct(summary["train_acc"])),
        ("val acc (best)", f"{pct(summary['val_acc'])} ({pct(summary['best_val_acc'])})"),
        ("test acc", pct(summary["test_acc"])),
        ("generalisation gap", pct(summary["gen_gap"])),
        ("train time", f"{summary['train_time_s']:.1f} s ({summary['samples_per_s'] or 0:,.0f} samples/s)"),
        ("peak memory", f"{summary['peak_memory_mb']:,.0f} MB"),
        ("outputs", str(run_dir)),
    ]
    width = max(len(name) for name, _ in rows)
    print("\n".join(f"  {name:<{width}}  {value}" for name, value in rows), flush=True)
