"""The parts of a run, each built once from the config: data, model (with SyncBatchNorm and the
DDP wrapper where the run is distributed, decided here and nowhere else), the training step's
parts, and the metrics sinks. The training loop (bsexp.train.loop) and the batch finder's trials
(bsexp.finder) both build with these, so both train the same model the same way."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bsexp.batch.scaling import ScaledHparams
from bsexp.config.checks import call_target
from bsexp.config.schema import NoiseMode
from bsexp.engine.cuda_graphs import StepGraphs, graph_mode
from bsexp.engine.datasets import Splits
from bsexp.engine.distributed import GradBuckets, GradSync, World, sum_gradients_hook
from bsexp.engine.gpt import GPT
from bsexp.engine.gradient_noise import NoiseMeter, NoiseScale
from bsexp.engine.models import checkpoint_blocks, ghost_batchnorm
from bsexp.engine.optim import build_optimizer, graph_ready
from bsexp.engine.step import Step
from bsexp.engine.syncbn import convert_sync_batchnorm
from bsexp.errors import ConfigError, one_line
from bsexp.system.metrics import JsonlSink, MlflowSink, Sinks, TensorBoardSink, WandbSink, check_packages
from bsexp.system.runtime import autocast, grad_scaler, run_speed

log = logging.getLogger(__name__)

# The name of DDP's switch changed in torch 2.15 (buffers still synchronised once, at wrapping).
_NO_FORWARD_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    else {"broadcast_buffers": False}
)


def build_data(cfg: DictConfig) -> Splits:
    splits = call_target("data", cfg.data)
    if not isinstance(splits, Splits):
        raise ConfigError(
            "data._target_", cfg.data._target_, f"must return bsexp.engine.datasets.Splits, got {type(splits).__name__}"
        )
    return splits


def build_model(cfg: DictConfig, splits: Splits) -> nn.Module:
    _check_tokens(cfg, splits)
    model = call_target(
        "model",
        cfg.model,
        input_shape=splits.input_shape,
        num_classes=splits.num_classes,
        exclude=("activation_checkpointing", "ghost_batch"),
    )
    if not isinstance(model, nn.Module):
        raise ConfigError(
            "model._target_", cfg.model._target_, f"must return a torch.nn.Module, got {type(model).__name__}"
        )
    ghost = cfg.model.get("ghost_batch")
    if ghost is not None:
        model, converted = ghost_batchnorm(model, ghost)
        if not converted:
            raise ConfigError(
                "model.ghost_batch",
                ghost,
                "the model has no BatchNorm layer to normalise over ghost "
                "batches; valid: null, or a model with model.norm=batch",
            )
    # A user's model node may lack the key (no schema): +model.activation_checkpointing=true adds it.
    if cfg.model.get("activation_checkpointing", False):
        try:
            model = checkpoint_blocks(model)
        except ValueError as exc:
            raise ConfigError(
                "model.activation_checkpointing",
                "true",
                f"{exc}; valid for mlp, cnn, cnn1d, resnet18, gpt and any nn.Sequential",
            ) from None
    return model


def _check_tokens(cfg: DictConfig, splits: Splits) -> None:
    """A language model on token sequences, a built-in classifier on anything else: said before
    either is built, as the model's own check of its input shape would say it less plainly."""
    target = str(cfg.model._target_)
    if target == f"{GPT.__module__}.{GPT.__qualname__}" and splits.tokens is None:
        raise ConfigError("data", splits.name, "model=gpt reads token sequences; valid: data=text")
    if splits.tokens is not None and target.rpartition(".")[0] == "bsexp.engine.models":
        raise ConfigError(
            "model._target_",
            target,
            "data=text holds token sequences; valid: model=gpt, or a model of your own that reads token ids",
        )


def sync_batchnorm(cfg: DictConfig, distributed: bool) -> bool:
    """BatchNorm over the ranks: by default whenever there are several (per-rank statistics, Goyal
    et al.'s recipe, only when asked for with distributed.sync_batchnorm=false), never over ghost
    batches (`model.ghost_batch`: each rank normalises its own chunks)."""
    return distributed and cfg.distributed.sync_batchnorm is not False and cfg.model.get("ghost_batch") is None


def wrap_model(
    cfg: DictConfig, model: nn.Module, device: torch.device, distributed: bool, process_group: Any = None
) -> tuple[nn.Module, GradSync | None]:
    """The model as it trains: on the device; when distributed, with synchronised BatchNorm (as
    configured) inside DDP, whose gradients are summed (not averaged) by bsexp's communication
    hook; on the fast path in channels_last and compiled (around DDP, so that its buckets are
    compiled with it). `process_group`: a group of its own (the finder's trials); None: the
    default one."""
    speed = run_speed(cfg, device, model)
    torch.backends.cudnn.benchmark = speed.cudnn_benchmark  # now that the model is known (Speed)
    if speed.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model, grad_sync = _distributed(cfg, model, device, distributed, process_group)
    return (torch.compile(model, mode=speed.compile) if speed.compile else model), grad_sync


def _distributed(
    cfg: DictConfig, model: nn.Module, device: torch.device, distributed: bool, process_group: Any
) -> tuple[nn.Module, GradSync | None]:
    if not distributed:
        return model.to(device), None
    if sync_batchnorm(cfg, True):
        model = (
            nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group)
            if device.type == "cuda"
            else convert_sync_batchnorm(model, device)
        )
    # Buffers are not broadcast at every forward (ranks may do different numbers of forwards in an
    # epoch's last step); evaluation takes rank 0's (World.sync_buffers).
    ddp = DistributedDataParallel(
        model.to(device),
        device_ids=[device.index] if device.type == "cuda" else None,
        process_group=process_group,
        **_NO_FORWARD_BUFFER_SYNC,
    )
    grad_sync = GradSync(measure=cfg.trainer.noise_scale != NoiseMode.off)
    if cfg.trainer.oom_recovery:  # bsexp's buckets (a step may fail on one rank only): GradBuckets
        grad_sync.buckets = GradBuckets(ddp.module.parameters(), grad_sync, process_group)
    else:
        ddp.register_comm_hook(grad_sync, sum_gradients_hook)
    return ddp, grad_sync


def make_step(
    cfg: DictConfig,
    model: nn.Module,
    world: World,
    distributed: bool,
    hp: ScaledHparams,
    grad_sync: GradSync | None,
    on_oom=None,
    measure_noise: bool = False,
    n_train: int | None = None,
) -> Step:
    """The training step's parts for a wrapped model. `distributed`: whether the run has several
    ranks (a trial of a DDP run has a world of one, and still reduces as training does).
    `measure_noise`: the batch policy steers by B_simple, so `auto` measures it on every step
    (on the side where the step has one micro-batch, which leaves training unchanged).
    `n_train`: the training set's size, which the noise scale's |G|² estimate is corrected for."""
    precision = str(cfg.precision)
    speed = run_speed(cfg, world.device, model)
    optimizer, graphs = _optimizer_and_graphs(cfg, model, world, distributed, hp, speed.fused_optimizer)
    noise_mode = str(cfg.trainer.noise_scale)
    if measure_noise and noise_mode == "auto":
        noise_mode = "always"
    batchnorm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if noise_mode == "always" and not distributed and batchnorm:
        log.info(
            "B_simple is measured on half of each step's batch normalised with the whole batch's statistics "
            "(BatchNorm): the halves share them, so it is the noise scale of this model at this batch, not of "
            'independent samples (docs: The noise scale and the critical batch, "BatchNorm")'
        )
    noise = (
        None
        if noise_mode == "off"
        else NoiseMeter(
            NoiseScale(decay=cfg.trainer.noise_decay, population=n_train),
            side_half=noise_mode == "always",
            grad_sync=grad_sync,
            whole_batch=batchnorm,
        )
    )
    reduce = "none" if not distributed else ("buckets" if cfg.trainer.oom_recovery else "hook")
    return Step(
        model=model,
        optimizer=optimizer,
        scaler=grad_scaler(world.device, precision),
        autocast=autocast(world.device, precision),
        world=world,
        reduce=reduce,
        channels_last=speed.channels_last,
        compiled=speed.compile is not None,
        clip_grad_norm=cfg.trainer.clip_grad_norm,
        grad_sync=grad_sync,
        noise=noise,
        on_oom=on_oom,
        graphs=None if graphs == "off" else StepGraphs(optimizer, model, world.device, capture=graphs == "capture"),
    )


def _optimizer_and_graphs(
    cfg: DictConfig, model: nn.Module, world: World, distributed: bool, hp: ScaledHparams, fused: bool
) -> tuple[torch.optim.Optimizer, str]:
    """The optimizer (capturable where a CUDA graph will hold its update), and how the step runs
    (trainer.cuda_graphs, bsexp.engine.cuda_graphs.graph_mode): "capture", "static" or "off"."""
    choice = str(cfg.trainer.cuda_graphs)
    graphs, why = graph_mode(choice, world.device, fused=fused, precision=str(cfg.precision), distributed=distributed)
    optimizer = build_optimizer(cfg, model, hp, fused=fused, capturable=graphs == "capture")
    if graphs == "capture" and (why := graph_ready(optimizer)) is not None:
        if choice == "on":
            raise ConfigError("trainer.cuda_graphs", choice, f"{why}; valid here: auto, static, off")
        graphs = "off"
    if world.device.type == "cuda" and why is not None:
        log.info("CUDA graphs off: %s", why)
    return optimizer, graphs


def build_sinks(
    cfg: DictConfig,
    run_dir: Path,
    hparams: dict[str, Any],
    keep_records: list[dict[str, Any]] | None = None,
    wandb_id: str | None = None,
) -> Sinks:
    """metrics.jsonl (resuming: the checkpoint's records, `keep_records`, then continued) and the
    loggers chosen (logger=wandb, tensorboard, mlflow, or a list of them): W&B continuing run
    `wandb_id`, TensorBoard its log directory from the last record kept, MLflow the run of this
    directory."""
    check_packages(cfg.logger)
    try:
        sinks: list = [JsonlSink(run_dir / "metrics.jsonl", records=keep_records)]
    except FileExistsError:
        raise ConfigError(
            "hydra.run.dir", str(run_dir), "already holds metrics.jsonl; choose a new directory"
        ) from None
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    config["derived"] = hparams
    resuming = keep_records is not None
    # Resuming: TensorBoard hides what was logged past the records kept (a point the run logged
    # after its checkpoint, before it stopped), as they are logged again.
    kept = keep_records or []
    purge_step = (int(kept[-1]["samples_seen"]) + 1 if kept else 0) if resuming else None
    loggers = cfg.logger
    starts = {
        "W&B": (loggers.wandb.enabled, lambda: WandbSink(loggers.wandb, run_dir, config, run_id=wandb_id)),
        "TensorBoard": (
            loggers.tensorboard.enabled,
            lambda: TensorBoardSink(Path(loggers.tensorboard.dir or run_dir / "tensorboard"), config, purge_step),
        ),
        "MLflow": (loggers.mlflow.enabled, lambda: MlflowSink(loggers.mlflow, run_dir, config, resuming=resuming)),
    }
    for name, (enabled, start) in starts.items():
        if not enabled:
            continue
        try:
            sinks.append(start())
        except Exception as exc:  # a logger is a view of the run, never a reason to lose it
            log.warning("%s could not start (%s); logging to %s without it", name, one_line(exc)[:300], run_dir)
    return Sinks(*sinks)
