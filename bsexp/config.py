"""Config schemas (registered in Hydra's ConfigStore) and the checks run before a job starts.

Each option file in `conf/<group>/` begins with `defaults: [/schema_<group>_<name>@_here_]`, so
Hydra merges it onto its dataclass: a wrong type or an unknown key fails at composition with
Hydra's own message. Checks that need more than types (a batch that divides, a positive LR)
live in `check`, which runs before Hydra writes anything into the output directory.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import pydoc
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.experimental.callback import Callback
from omegaconf import MISSING, DictConfig, OmegaConf

from bsexp.errors import ConfigError, exit_on_config_error
from bsexp.plan import BatchPlan, PlanError, make_plan
from bsexp.scaling import RULES


class _Choice(str, Enum):
    """An enum whose members compare equal to their names ("batch" == Norm.batch)."""

    def __str__(self) -> str:
        return self.value


Device = _Choice("Device", {k: k for k in ("auto", "cpu", "cuda")}, module=__name__)
Precision = _Choice("Precision", {k: k for k in ("fp32", "bf16", "fp16")}, module=__name__)
Rule = _Choice("Rule", {k: k for k in RULES}, module=__name__)
Unit = _Choice("Unit", {k: k for k in ("epochs", "steps")}, module=__name__)
WarmupShape = _Choice("WarmupShape", {k: k for k in ("linear", "constant", "none")}, module=__name__)
MainSchedule = _Choice("MainSchedule", {k: k for k in ("cosine", "step", "constant")}, module=__name__)
NORMS = ("batch", "group", "layer", "none")
Norm = _Choice("Norm", {k: k for k in NORMS}, module=__name__)
Policy = _Choice("Policy", {k: k for k in ("fixed", "accumulation", "finder", "scheduled")}, module=__name__)
ScheduleKind = _Choice("ScheduleKind", {k: k for k in ("step", "linear", "exponential", "list")}, module=__name__)
FinderMode = _Choice("FinderMode", {k: k for k in ("fit", "power", "binsearch")}, module=__name__)
FinderObjective = _Choice("FinderObjective", {k: k for k in ("max", "throughput", "noise_scale")}, module=__name__)
DistributedKind = _Choice("DistributedKind", {k: k for k in ("none", "ddp")}, module=__name__)
Backend = _Choice("Backend", {k: k for k in ("auto", "gloo", "nccl")}, module=__name__)
NoiseMode = _Choice("NoiseMode", {k: k for k in ("auto", "off", "always")}, module=__name__)
LoggerKind = _Choice("LoggerKind", {k: k for k in ("wandb", "none")}, module=__name__)
WandbMode = _Choice("WandbMode", {k: k for k in ("offline", "online", "disabled")}, module=__name__)
# The torchvision sets bsexp knows: name -> (torchvision class, number of classes).
VISION_SETS = {"mnist": ("MNIST", 10), "fashion_mnist": ("FashionMNIST", 10),
               "cifar10": ("CIFAR10", 10), "cifar100": ("CIFAR100", 100)}
VisionSet = _Choice("VisionSet", {k: k for k in VISION_SETS}, module=__name__)

DATA_ROOT = "${oc.env:BSEXP_DATA,data}"

# ---------------------------------------------------------------------------- data


@dataclass
class DataConfig:
    _target_: str = MISSING
    seed: int = 42  # generates and splits the data; the run's `seed` does not change it
    val_size: int = 500  # samples held out of the training split for validation


@dataclass
class MNIST1DData(DataConfig):
    _target_: str = "bsexp.data.mnist1d"
    root: str = DATA_ROOT
    num_samples: int = 5000  # train + test; 5000 with train_split 0.8 is the published split
    train_split: float = 0.8


@dataclass
class DigitsData(DataConfig):
    _target_: str = "bsexp.data.digits"
    val_size: int = 360


@dataclass
class TorchvisionData(DataConfig):
    _target_: str = "bsexp.data.torchvision_dataset"
    name: VisionSet = MISSING
    root: str = DATA_ROOT
    download: bool = False
    val_size: int = 5000
    augment: bool = True
    crop_padding: int = 4
    hflip: bool = False
    in_memory: bool = True  # false: read through a DataLoader with workers
    num_workers: int = 2


@dataclass
class SyntheticData(DataConfig):
    _target_: str = "bsexp.data.synthetic"
    shape: List[int] = field(default_factory=lambda: [1, 40])
    num_classes: int = 10
    num_samples: int = 4096
    val_size: int = 512
    test_size: int = 512
    noise: float = 1.0
    in_memory: bool = True
    num_workers: int = 0


# ---------------------------------------------------------------------------- models


@dataclass
class ModelConfig:
    _target_: str = MISSING
    norm: Norm = Norm.batch


@dataclass
class MLPModel(ModelConfig):
    _target_: str = "bsexp.models.MLP"
    hidden: List[int] = field(default_factory=lambda: [256, 256])
    dropout: float = 0.0


@dataclass
class CNN1dModel(ModelConfig):
    _target_: str = "bsexp.models.CNN1d"
    width: int = 32


@dataclass
class CNNModel(ModelConfig):
    _target_: str = "bsexp.models.CNN"
    width: int = 32


@dataclass
class ResNet18Model(ModelConfig):
    _target_: str = "bsexp.models.resnet18"
    cifar_stem: bool = True


# ---------------------------------------------------------------------------- optimizers


@dataclass
class OptimizerConfig:
    _target_: str = MISSING
    lr: float = MISSING  # at scaling.ref_batch
    weight_decay: float = 0.0  # at scaling.ref_batch
    decay_norm_and_bias: bool = False  # weight decay on biases and norm parameters too


@dataclass
class SGDOptimizer(OptimizerConfig):
    _target_: str = "torch.optim.SGD"
    lr: float = 0.1
    weight_decay: float = 5e-4
    momentum: float = 0.9
    nesterov: bool = False


@dataclass
class AdamWOptimizer(OptimizerConfig):
    _target_: str = "torch.optim.AdamW"
    lr: float = 1e-3
    weight_decay: float = 0.05
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8


@dataclass
class LarsOptimizer(OptimizerConfig):
    _target_: str = "timm.optim.Lars"
    lr: float = 0.1
    weight_decay: float = 5e-4
    momentum: float = 0.9
    nesterov: bool = False
    trust_coeff: float = 0.001
    eps: float = 1e-8


@dataclass
class LambOptimizer(OptimizerConfig):
    _target_: str = "timm.optim.Lamb"
    lr: float = 2e-3
    weight_decay: float = 0.01
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-6
    max_grad_norm: Optional[float] = None  # bsexp clips with trainer.clip_grad_norm


# ---------------------------------------------------------------------------- batch, world, logs


@dataclass
class BatchConfig:
    policy: Policy = MISSING
    size: int = 128  # global: samples per optimizer step over all ranks and micro-steps
    drop_last: bool = False  # false: the last, smaller step of an epoch is kept, normalised exactly


@dataclass
class FixedBatch(BatchConfig):
    policy: Policy = Policy.fixed


@dataclass
class AccumulationBatch(BatchConfig):
    policy: Policy = Policy.accumulation
    size: int = 512
    micro_size: Optional[int] = None  # per rank; give this or accum_steps (or both, consistent)
    accum_steps: Optional[int] = None


@dataclass
class FinderConfig:
    mode: FinderMode = FinderMode.fit  # fit: measure memory at two sizes, predict, confirm
    objective: FinderObjective = FinderObjective.max
    init: int = 8  # the first micro-batch tried
    max_trials: int = 12
    steps_per_trial: int = 2  # training steps per trial (the first one after warm-up allocates)
    max_size: Optional[int] = None  # largest micro-batch considered (also: the training set per rank)
    margin: float = 0.05  # headroom: trials run under memory_limit x (1 - margin)
    memory_limit_gb: Optional[float] = None  # null: the GPU's memory, or what the machine has free
    throughput_tolerance: float = 0.05  # objective=throughput: within this fraction of the best
    noise_steps: int = 100  # objective=noise_scale: training steps that measure the gradient noise scale
    noise_batch: int = 256  # objective=noise_scale: the batch they use (at most what fits)
    cache: bool = False  # reuse results for the same model, input, precision, device and limit
    cache_dir: str = "${oc.env:BSEXP_CACHE,'~/.cache/bsexp'}/finder"


@dataclass
class FinderBatch(BatchConfig):
    policy: Policy = Policy.finder
    size: Optional[int] = None  # null: the found micro-batch x world size becomes the global batch
    finder: FinderConfig = field(default_factory=FinderConfig)


@dataclass
class BatchScheduleConfig:
    kind: ScheduleKind = ScheduleKind.step
    unit: Unit = Unit.epochs  # of `milestones`
    milestones: List[float] = field(default_factory=lambda: [8.0, 14.0])  # step: batch x factor at each
    factor: float = 5.0  # step (Smith et al. 2018 grow the batch x5 where the LR would drop /5)
    end: Optional[int] = None  # linear / exponential: the batch of the last epoch
    points: List[List[int]] = field(default_factory=list)  # list: [[epoch, batch], ...] from epoch 0
    round_to: int = 8  # linear / exponential: batches are multiples of round_to x world size
    couple_lr: bool = True  # the LR follows the batch through scaling.lr_rule; false: held fixed
    ramp_steps: int = 0  # ramp an LR change over this many steps


@dataclass
class ScheduledBatch(BatchConfig):
    policy: Policy = Policy.scheduled
    size: int = 32  # the global batch the schedule starts from
    micro_size: Optional[int] = None  # per rank: larger scheduled batches accumulate micro-batches
    find_micro_size: bool = False  # run the batch finder for the micro-batch that fits
    finder: FinderConfig = field(default_factory=FinderConfig)
    schedule: BatchScheduleConfig = field(default_factory=BatchScheduleConfig)


@dataclass
class DistributedConfig:
    kind: DistributedKind = DistributedKind.none
    backend: Backend = Backend.auto  # auto: NCCL on CUDA, gloo on CPU
    nproc_per_node: int = 1  # workers bsexp launches itself when torchrun did not start it
    sync_batchnorm: Optional[bool] = None  # null: true when there is more than one rank
    timeout_s: float = 300.0  # for collectives; a failed rank ends the job sooner (the launcher sees it)


@dataclass
class WandbConfig:
    project: str = "bsexp"
    entity: Optional[str] = None
    group: Optional[str] = None
    name: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    mode: Optional[WandbMode] = None  # null: $WANDB_MODE if set, else offline
    dir: Optional[str] = None  # null: the run's output directory


@dataclass
class LoggerConfig:
    kind: LoggerKind = MISSING
    wandb: WandbConfig = field(default_factory=WandbConfig)


# ---------------------------------------------------------------------------- top level


@dataclass
class ScalingConfig:
    ref_batch: int = 128  # the batch at which optimizer.lr and optimizer.weight_decay were tuned
    lr_rule: Rule = Rule.linear
    wd_rule: Rule = Rule.sqrt


@dataclass
class ScheduleConfig:
    unit: Unit = Unit.epochs  # of `warmup` and `milestones`
    warmup: float = 2.0
    warmup_shape: WarmupShape = WarmupShape.linear
    start_factor: Optional[float] = None  # null: 1/k, the unscaled LR (Goyal et al. 2017)
    main: MainSchedule = MainSchedule.cosine
    milestones: List[float] = field(default_factory=list)  # for main=step
    factor: float = 0.1  # for main=step: LR multiplied by this at each milestone
    final_factor: float = 0.0  # for main=cosine: the LR ends at this fraction of its peak


@dataclass
class TrainerConfig:
    clip_grad_norm: Optional[float] = None
    eval_every_steps: int = 0  # 0: evaluate at the end of every epoch
    eval_batch_size: int = 1024
    max_steps: Optional[int] = None  # stop after this many optimizer steps
    progress: bool = True  # progress bars (off anyway when output is not a terminal)
    deterministic: bool = True
    threads: Optional[int] = None  # torch CPU threads; null: torch's default
    memory_limit_gb: Optional[float] = None  # train as on a smaller machine: a real cap on memory
    oom_recovery: bool = True  # on OOM: halve the micro-batch, accumulate, retry the same data
    # Gradient noise scale: auto measures it where it is free (accumulation, several ranks);
    # always also splits a single micro-batch in two to measure it; off never.
    noise_scale: NoiseMode = NoiseMode.auto
    noise_decay: float = 0.99  # of the moving averages of |G|^2 and tr(Sigma)


@dataclass
class CheckpointConfig:
    every_steps: int = 0  # 0: only at epoch ends (every_epoch)
    every_epoch: bool = True
    keep: int = 2  # the newest K are kept
    allow_mismatch: bool = False  # resume from a checkpoint of another model or global batch anyway


@dataclass
class Config:
    data: Any = MISSING
    model: Any = MISSING
    optimizer: Any = MISSING
    batch: Any = MISSING
    distributed: Any = MISSING
    logger: Any = MISSING
    seed: int = 0
    epochs: int = 20
    device: Device = Device.auto
    precision: Precision = Precision.fp32
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: Optional[str] = None  # auto: the newest readable checkpoint of the run directory; or a path


SCHEMAS = {
    "bsexp_config": Config,
    "schema_data_mnist1d": MNIST1DData,
    "schema_data_digits": DigitsData,
    "schema_data_torchvision": TorchvisionData,
    "schema_data_synthetic": SyntheticData,
    "schema_model_mlp": MLPModel,
    "schema_model_cnn1d": CNN1dModel,
    "schema_model_cnn": CNNModel,
    "schema_model_resnet18": ResNet18Model,
    "schema_optimizer": OptimizerConfig,  # for optimizers of your own
    "schema_optimizer_sgd": SGDOptimizer,
    "schema_optimizer_adamw": AdamWOptimizer,
    "schema_optimizer_lars": LarsOptimizer,
    "schema_optimizer_lamb": LambOptimizer,
    "schema_batch_fixed": FixedBatch,
    "schema_batch_accumulation": AccumulationBatch,
    "schema_batch_finder": FinderBatch,
    "schema_batch_scheduled": ScheduledBatch,
    "schema_distributed": DistributedConfig,
    "schema_logger": LoggerConfig,
}


def register_configs() -> None:
    """Schemas are stored outside any group, so `--help` lists only the real options."""
    from bsexp.sweep import register_resolvers

    store = ConfigStore.instance()
    for name, node in SCHEMAS.items():
        store.store(name=name, node=node)
    register_resolvers()  # ${bsexp_job_dir:}, the name of a sweep point's directory


# ---------------------------------------------------------------------------- checks

# Bounds of the keys bsexp defines, checked wherever the key exists (a user's own model or
# dataset node may lack them). (low, high, what): low/high None for no bound; NaN never passes.
BOUNDS: dict[str, tuple[float | None, float | None, str]] = {
    "seed": (0, None, ">= 0"),
    "epochs": (1, None, ">= 1"),
    "scaling.ref_batch": (1, None, ">= 1"),
    "optimizer.weight_decay": (0, None, ">= 0"),
    "optimizer.momentum": (0, 1, "in [0, 1]"),
    "optimizer.eps": (0, None, ">= 0"),
    "optimizer.trust_coeff": (0, None, ">= 0"),
    "schedule.warmup": (0, None, ">= 0"),
    "schedule.start_factor": (0, None, ">= 0"),
    "schedule.final_factor": (0, 1, "in [0, 1]"),
    "trainer.eval_every_steps": (0, None, ">= 0"),
    "trainer.eval_batch_size": (1, None, ">= 1"),
    "trainer.max_steps": (1, None, ">= 1"),
    "trainer.threads": (1, None, ">= 1"),
    "distributed.nproc_per_node": (1, None, ">= 1"),
    "batch.size": (1, None, ">= 1"),
    "batch.finder.init": (2, None, ">= 2 (BatchNorm needs two samples)"),
    "batch.finder.max_trials": (2, None, ">= 2"),
    "batch.finder.steps_per_trial": (1, None, ">= 1"),
    "batch.finder.max_size": (2, None, ">= 2"),
    "batch.finder.margin": (0, 0.9, "in [0, 0.9]"),
    "batch.finder.throughput_tolerance": (0, 0.5, "in [0, 0.5]"),
    "batch.finder.noise_steps": (1, None, ">= 1"),
    "batch.finder.noise_batch": (4, None, ">= 4"),
    "batch.micro_size": (1, None, ">= 1"),
    "trainer.noise_decay": (0, 0.999999, "in [0, 1)"),
    "checkpoint.every_steps": (0, None, ">= 0"),
    "checkpoint.keep": (1, None, ">= 1"),
    "batch.schedule.round_to": (1, None, ">= 1"),
    "batch.schedule.ramp_steps": (0, None, ">= 0"),
    "batch.schedule.end": (1, None, ">= 1"),
    "distributed.timeout_s": (1, None, ">= 1"),
    "data.val_size": (1, None, ">= 1"),
    "data.num_samples": (1, None, ">= 1"),
    "data.test_size": (0, None, ">= 0"),
    "data.num_classes": (2, None, ">= 2"),
    "data.noise": (0, None, ">= 0"),
    "data.num_workers": (0, None, ">= 0"),
    "data.crop_padding": (0, None, ">= 0"),
    "model.width": (1, None, ">= 1"),
    "model.dropout": (0, 0.999999, "in [0, 1)"),
}
POSITIVE = ("optimizer.lr", "schedule.factor", "trainer.clip_grad_norm", "data.train_split", "batch.schedule.factor",
            "batch.finder.memory_limit_gb", "trainer.memory_limit_gb")
AT_MOST_ONE = ("schedule.factor",)
BELOW_ONE = ("data.train_split",)
POSITIVE_LISTS = ("model.hidden", "data.shape")


def under_torchrun() -> bool:
    """True in a worker that torchrun (or torch's elastic agent) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ


def env_rank() -> int:
    return int(os.environ["RANK"]) if under_torchrun() else 0


def world_size(cfg: DictConfig) -> int:
    """Ranks of the run: torchrun's WORLD_SIZE when it started us, else the workers bsexp launches."""
    if under_torchrun():
        if cfg.distributed.kind != DistributedKind.ddp:
            raise ConfigError("distributed", str(cfg.distributed.kind),
                              f"torchrun started {os.environ['WORLD_SIZE']} ranks; add distributed=ddp")
        return int(os.environ["WORLD_SIZE"])
    return cfg.distributed.nproc_per_node if cfg.distributed.kind == DistributedKind.ddp else 1


def batch_plan(cfg: DictConfig) -> BatchPlan | None:
    """The plan the batch policy asks for (None: the finder decides it), or a ConfigError
    naming the key at fault."""
    batch = cfg.batch
    if batch.policy == Policy.finder:
        if batch.size is not None and batch.size % world_size(cfg):
            raise ConfigError("batch.size", batch.size, f"must be divisible by the world size {world_size(cfg)}")
        return None
    if batch.policy == Policy.scheduled:
        return _scheduled_plan(cfg)
    micro = accum = None
    if batch.policy == Policy.accumulation:
        micro, accum = batch.micro_size, batch.accum_steps
        if micro is None and accum is None:
            raise ConfigError("batch.micro_size", None,
                              "batch=accumulation needs batch.micro_size (per rank) or batch.accum_steps")
    try:
        return make_plan(batch.size, world_size(cfg), micro, accum)
    except PlanError as exc:
        raise ConfigError(exc.key, exc.value, exc.expected) from None


def batch_schedule(cfg: DictConfig, start: int | None = None) -> "BatchSchedule":
    """The run's batch schedule: the `batch=scheduled` settings, or a constant batch."""
    from bsexp.batch_schedule import BatchSchedule

    world = world_size(cfg)
    if cfg.batch.policy != Policy.scheduled:
        return BatchSchedule(start=start, world_size=world)
    node = cfg.batch.schedule
    return BatchSchedule(
        start=cfg.batch.size, world_size=world, kind=str(node.kind), unit=str(node.unit),
        milestones=tuple(node.milestones), factor=node.factor, end=node.end, epochs=cfg.epochs,
        points=tuple((p[0], p[1]) for p in node.points), round_to=node.round_to,
    )


def _scheduled_plan(cfg: DictConfig) -> BatchPlan:
    """Every batch the schedule reaches must split over the ranks; the plan for the first."""
    from bsexp.batch_schedule import MIN_MICRO, plan_for

    node, world = cfg.batch.schedule, world_size(cfg)
    milestones = list(node.milestones)
    if milestones != sorted(milestones) or any(not _within(m, 0, None) for m in milestones):
        raise ConfigError("batch.schedule.milestones", milestones, "must be non-negative and increasing")
    if node.kind in (ScheduleKind.linear, ScheduleKind.exponential) and node.end is None:
        raise ConfigError("batch.schedule.end", None, f"batch.schedule.kind={node.kind} needs the final batch")
    if node.kind == ScheduleKind.list:
        points = [list(p) for p in node.points]
        if not points or any(len(p) != 2 for p in points) or points[0][0] != 0 or \
                [p[0] for p in points] != sorted(p[0] for p in points):
            raise ConfigError("batch.schedule.points", points, "must be [[0, batch], [epoch, batch], ...] in epoch order")
        if points[0][1] != cfg.batch.size:
            raise ConfigError("batch.schedule.points", points, f"must start at batch.size ([0, {cfg.batch.size}])")
    try:
        sizes = batch_schedule(cfg).sizes(cfg.epochs)
    except PlanError as exc:
        raise ConfigError(exc.key, exc.value, exc.expected) from None
    for size in sizes:
        if size < world * MIN_MICRO or size % world:
            key = "batch.schedule" if size != cfg.batch.size else "batch.size"
            raise ConfigError(key, size, f"every scheduled batch must be a multiple of the world size {world} and "
                                         f"at least {world * MIN_MICRO} ({MIN_MICRO} samples a rank); the schedule "
                                         f"reaches {sizes}")
    try:
        return plan_for(cfg.batch.size, world, cfg.batch.micro_size)
    except PlanError as exc:
        raise ConfigError(exc.key, exc.value, exc.expected) from None


def check(cfg: DictConfig) -> BatchPlan | None:
    """Every check that needs no data: raises ConfigError on the first problem found."""
    _check_known_keys(cfg)
    for key in ("lr", "weight_decay", "decay_norm_and_bias"):
        if key not in cfg.optimizer:
            raise ConfigError(f"optimizer.{key}", None, "must be set (an optimizer config of your own can "
                              "start with `defaults: [/schema_optimizer@_here_]`)")
    for key, (low, high, what) in BOUNDS.items():
        value = _schema_value(cfg, key)
        if value is not None and not _within(value, low, high):
            raise ConfigError(key, value, f"must be {what}")
    for key in POSITIVE:
        value = _schema_value(cfg, key)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(key, value, "must be a finite number > 0")
        if value is not None and key in AT_MOST_ONE and value > 1:
            raise ConfigError(key, value, "must be in (0, 1]")
        if value is not None and key in BELOW_ONE and value >= 1:
            raise ConfigError(key, value, "must be in (0, 1)")
    for key in POSITIVE_LISTS:  # model.hidden may be empty: a linear (logistic regression) model
        value = _schema_value(cfg, key)
        empty_ok = key == "model.hidden"
        if value is not None and ((len(value) == 0 and not empty_ok) or min(value, default=1) < 1):
            raise ConfigError(key, list(value), f"must be a {'' if empty_ok else 'non-empty '}list of sizes >= 1")
    if "betas" in cfg.optimizer:
        betas = list(cfg.optimizer.betas)
        if len(betas) != 2 or not all(_within(b, 0, 0.999999) for b in betas):
            raise ConfigError("optimizer.betas", betas, "must be two values in [0, 1), e.g. [0.9,0.999]")
    _check_schedule(cfg.schedule)
    if cfg.device == Device.cuda:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("device", "cuda", "CUDA is not available here; valid: auto, cpu")
    for group in ("data", "model", "optimizer"):
        locate(group, cfg[group].get("_target_"))
    return batch_plan(cfg)


def _schema_value(cfg: DictConfig, key: str) -> Any:
    """The value at `key` if a bsexp schema defines it there (a user's own node may use the same
    name for something else), else None."""
    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    cls = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    if not (dataclasses.is_dataclass(cls) and cls.__module__ == __name__) or name not in node:
        return None
    return node[name]


def _within(value: float, low: float | None, high: float | None) -> bool:
    """False for NaN and infinities unless a side is unbounded."""
    if value != value:  # NaN
        return False
    return (low is None or value >= low) and (high is None or value <= high)


def _check_known_keys(cfg: DictConfig, prefix: str = "") -> None:
    """Hydra's `+key=value` adds keys past the schema; refuse any a schema does not define."""
    for key in cfg:
        if prefix == "" and key == "hydra":
            continue
        node = cfg._get_node(key)
        cls = OmegaConf.get_type(cfg)
        if dataclasses.is_dataclass(cls) and key not in {f.name for f in dataclasses.fields(cls)}:
            full = f"{prefix}{key}"
            valid = ", ".join(f.name for f in dataclasses.fields(cls))
            raise ConfigError(full, cfg[key], f"not a key of {prefix.rstrip('.') or 'the config'}; valid: {valid}")
        if isinstance(node, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(node)):
            _check_known_keys(node, f"{prefix}{key}.")


def _check_schedule(schedule: DictConfig) -> None:
    milestones = list(schedule.milestones)
    if any(not _within(m, 0, None) for m in milestones) or milestones != sorted(milestones):
        raise ConfigError("schedule.milestones", milestones, "must be non-negative and increasing")
    if schedule.main == MainSchedule.step and not milestones:
        raise ConfigError("schedule.milestones", milestones, "schedule.main=step needs at least one milestone")


def locate(group: str, target: Any) -> Any:
    """The callable a `_target_` names, or a ConfigError naming `<group>._target_`."""
    if not isinstance(target, str) or not target:
        raise ConfigError(f"{group}._target_", target, "must name an importable callable")
    try:
        obj = pydoc.locate(target)
    except pydoc.ErrorDuringImport as exc:
        raise ConfigError(f"{group}._target_", target, f"failed to import ({exc.value})") from None
    if obj is None:
        raise ConfigError(f"{group}._target_", target, "cannot be imported: no module or attribute of that name")
    if not callable(obj):
        raise ConfigError(f"{group}._target_", target, "is not callable")
    return obj


def call_target(group: str, node: DictConfig, *args: Any, exclude: tuple[str, ...] = (), **given: Any) -> Any:
    """Call `node._target_` with the node's keys (less `exclude`) plus `given`, naming any key it
    rejects. Enum values arrive as plain strings, as a user's callable expects."""
    kwargs = OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    target = kwargs.pop("_target_")
    for key in exclude:
        kwargs.pop(key, None)
    fn = locate(group, target)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins may have no signature: let the call decide
        params = {}
    if params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        for key, value in kwargs.items():
            if key not in params:
                valid = ", ".join(p for p in list(params)[len(args):] if p not in given)
                raise ConfigError(f"{group}.{key}", value, f"not an option of {target}; valid: {valid}")
    try:
        return fn(*args, **kwargs, **given)
    except (TypeError, ValueError, RuntimeError) as exc:
        reason = " ".join(str(exc).split())
        raise ConfigError(f"{group}._target_", target, f"rejected the options in {group}.* ({reason})") from None


RESULTS = ("summary.json", "metrics.jsonl")


def check_output_dir(key: str, path: str) -> None:
    """The output directory (of a run, or of a sweep's jobs) must be creatable and must not
    already hold a run's results."""
    directory = Path(path)
    for name in RESULTS:
        found = next(iter(directory.glob(f"**/{name}")), None) if directory.is_dir() else None
        if found is not None:
            raise ConfigError(key, path, f"already holds a run's results ({found.relative_to(directory)}); "
                                         f"choose a new directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(key, path, f"cannot be created ({exc.strerror})") from None
    if not os.access(directory, os.W_OK):
        raise ConfigError(key, path, "is not writable")


class Preflight(Callback):
    """Runs `check` before Hydra creates the job's directory, so a bad config writes nothing.

    Hydra turns exceptions from callbacks into warnings and carries on, so a failed check
    exits here (SystemExit passes through Hydra untouched).
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        with exit_on_config_error():
            check(config)
            from bsexp.checkpoint import restarted

            resuming = config.get("resume") is not None or restarted()  # into the directory it left
            if env_rank() == 0 and not resuming:  # other ranks of a torchrun job write nothing (bsexp.train)
                check_output_dir("hydra.run.dir", config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # The config without the swept values: what is wrong here is wrong for every job.
        with exit_on_config_error():
            if under_torchrun():
                raise ConfigError("--multirun", True, "under torchrun every rank would run the sweep; sweep "
                                  "with distributed=ddp distributed.nproc_per_node=N instead")
            check(config)
            check_output_dir("hydra.sweep.dir", config.hydra.sweep.dir)
