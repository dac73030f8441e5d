"""Config schemas, registered in Hydra's ConfigStore: every key, its type, its default and its
bounds, in one place.

Each option file in `conf/<group>/` begins with `defaults: [/schema_<group>_<name>@_here_]`, so
Hydra merges it onto its dataclass: a wrong type or an unknown key fails at composition with
Hydra's own message. A field's bounds stand beside it (`bounded(...)`) and are checked by one
validator (`bsexp.config.checks`), before Hydra writes anything into the output directory.
`conf/config.yaml` holds only the defaults list and Hydra's own settings: every default is here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from bsexp.batch.scaling import RULES
from bsexp.errors import add_key_hint


class _Choice(str, Enum):
    """An enum whose members compare equal to their names ("batch" == Norm.batch)."""

    def __str__(self) -> str:
        return self.value


def _choice(name: str, *values: str) -> type[_Choice]:
    return _Choice(name, {v: v for v in values}, module=__name__)


Device = _choice("Device", "auto", "cpu", "cuda")
Precision = _choice("Precision", "fp32", "bf16", "fp16")
Rule = _choice("Rule", *RULES)
Unit = _choice("Unit", "epochs", "steps")
WarmupShape = _choice("WarmupShape", "linear", "constant", "none")
MainSchedule = _choice("MainSchedule", "cosine", "step", "constant")
NORMS = ("batch", "group", "layer", "none")
Norm = _choice("Norm", *NORMS)
POLICIES = ("fixed", "accumulation", "finder", "scheduled", "adaptive")
Policy = _choice("Policy", *POLICIES)
ScheduleKind = _choice("ScheduleKind", "step", "linear", "exponential", "list", "seesaw")
AdaptiveObjective = _choice("AdaptiveObjective", "noise", "goodput")
AdaptiveLR = _choice("AdaptiveLR", "rule", "adascale")
FinderMode = _choice("FinderMode", "fit", "power", "binsearch")
FinderObjective = _choice("FinderObjective", "max", "throughput", "noise_scale")
DistributedKind = _choice("DistributedKind", "none", "ddp")
Backend = _choice("Backend", "auto", "gloo", "nccl")
NoiseMode = _choice("NoiseMode", "auto", "off", "always")
WandbMode = _choice("WandbMode", "offline", "online", "disabled")
# The torchvision sets bsexp knows: name -> (torchvision class, number of classes).
VISION_SETS = {
    "mnist": ("MNIST", 10),
    "fashion_mnist": ("FashionMNIST", 10),
    "cifar10": ("CIFAR10", 10),
    "cifar100": ("CIFAR100", 100),
}
VisionSet = _choice("VisionSet", *VISION_SETS)

DATA_ROOT = "${oc.env:BSEXP_DATA,data}"


# ---------------------------------------------------------------------------- bounds


@dataclass(frozen=True)
class Bound:
    """What a number (or every number of a list) must be: within [low, high], an end left out
    when `open_low`/`open_high`; always finite. `nonempty`: a list must hold at least one."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    nonempty: bool = False

    def holds(self, value: float) -> bool:
        if value != value or value in (float("inf"), float("-inf")):  # NaN, infinities
            return False
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or (value < self.high if self.open_high else value <= self.high)

    @property
    def text(self) -> str:
        """'>= 1', '> 0', 'in [0, 1)', ... as the error message says it."""
        fmt = lambda v: format(v, "g")  # noqa: E731
        if self.high is None:
            return f"{'>' if self.open_low else '>='} {fmt(self.low)}"
        if self.low is None:
            return f"{'<' if self.open_high else '<='} {fmt(self.high)}"
        return f"in {'(' if self.open_low else '['}{fmt(self.low)}, {fmt(self.high)}{')' if self.open_high else ']'}"


def bounded(
    default: Any = MISSING,
    *,
    low: float | None = None,
    high: float | None = None,
    open_low: bool = False,
    open_high: bool = False,
    nonempty: bool = False,
    factory: Any = None,
    why: str = "",
) -> Any:
    """A dataclass field with its bound beside it (`why` is added to the error message)."""
    meta = {"bound": Bound(low, high, open_low, open_high, nonempty), "why": why}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def positive(default: Any = MISSING) -> Any:
    return bounded(default, low=0, open_low=True)


def at_least(low: float, default: Any = MISSING, why: str = "") -> Any:
    return bounded(default, low=low, why=why)


# ---------------------------------------------------------------------------- data


@dataclass
class DataConfig:
    _target_: str = MISSING
    seed: int = at_least(0, 42)  # generates and splits the data; the run's `seed` does not change it
    val_size: int = at_least(1, 500)  # samples held out of the training split for validation


@dataclass
class MNIST1DData(DataConfig):
    _target_: str = "bsexp.data.mnist1d"
    root: str = DATA_ROOT
    num_samples: int = at_least(1, 5000)  # train + test; 5000 with train_split 0.8 is the published split
    train_split: float = bounded(0.8, low=0, high=1, open_low=True, open_high=True)


@dataclass
class DigitsData(DataConfig):
    _target_: str = "bsexp.data.digits"
    val_size: int = at_least(1, 360)


@dataclass
class TorchvisionData(DataConfig):
    _target_: str = "bsexp.data.torchvision_dataset"
    name: VisionSet = MISSING
    root: str = DATA_ROOT
    download: bool = False
    val_size: int = at_least(1, 5000)
    augment: bool = True
    crop_padding: int = at_least(0, 4)
    hflip: bool = False
    in_memory: bool = True  # false: read through a DataLoader with workers
    num_workers: int = at_least(0, 2)


@dataclass
class SyntheticData(DataConfig):
    _target_: str = "bsexp.data.synthetic"
    shape: List[int] = bounded(low=1, nonempty=True, factory=lambda: [1, 40])
    num_classes: int = at_least(2, 10)
    num_samples: int = at_least(1, 4096)
    val_size: int = at_least(1, 512)
    test_size: int = at_least(0, 512)
    noise: float = at_least(0, 1.0)
    in_memory: bool = True
    num_workers: int = at_least(0, 0)


# ---------------------------------------------------------------------------- models


@dataclass
class ModelConfig:
    _target_: str = MISSING
    norm: Norm = Norm.batch
    # Recompute each block's activations in the backward pass (torch.utils.checkpoint): a larger
    # micro-batch fits, for a second forward. Built-in models and any nn.Sequential.
    activation_checkpointing: bool = False
    # BatchNorm over ghost batches of this many samples in training (Hoffer et al. 2017), whatever
    # the batch: a large batch normalised as small ones are. null: over the whole (micro-)batch.
    ghost_batch: Optional[int] = at_least(2, None)


@dataclass
class MLPModel(ModelConfig):
    _target_: str = "bsexp.models.MLP"
    hidden: List[int] = bounded(low=1, factory=lambda: [256, 256])  # empty: logistic regression
    dropout: float = bounded(0.0, low=0, high=1, open_high=True)


@dataclass
class CNN1dModel(ModelConfig):
    _target_: str = "bsexp.models.CNN1d"
    width: int = at_least(1, 32)


@dataclass
class CNNModel(ModelConfig):
    _target_: str = "bsexp.models.CNN"
    width: int = at_least(1, 32)


@dataclass
class ResNet18Model(ModelConfig):
    _target_: str = "bsexp.models.resnet18"
    cifar_stem: bool = True


# ---------------------------------------------------------------------------- optimizers


@dataclass
class OptimizerConfig:
    _target_: str = MISSING
    lr: float = positive()  # at scaling.ref_batch
    weight_decay: float = at_least(0, 0.0)  # at scaling.ref_batch
    decay_norm_and_bias: bool = False  # weight decay on biases and norm parameters too


@dataclass
class SGDOptimizer(OptimizerConfig):
    _target_: str = "torch.optim.SGD"
    lr: float = positive(0.1)
    weight_decay: float = at_least(0, 5e-4)
    momentum: float = bounded(0.9, low=0, high=1)
    nesterov: bool = False


@dataclass
class AdamWOptimizer(OptimizerConfig):
    _target_: str = "torch.optim.AdamW"
    lr: float = positive(1e-3)
    weight_decay: float = at_least(0, 0.05)
    betas: List[float] = bounded(low=0, high=1, open_high=True, factory=lambda: [0.9, 0.999])
    eps: float = at_least(0, 1e-8)


@dataclass
class LarsOptimizer(OptimizerConfig):
    _target_: str = "timm.optim.Lars"
    lr: float = positive(0.1)
    weight_decay: float = at_least(0, 5e-4)
    momentum: float = bounded(0.9, low=0, high=1)
    nesterov: bool = False
    trust_coeff: float = at_least(0, 0.001)
    eps: float = at_least(0, 1e-8)


@dataclass
class LambOptimizer(OptimizerConfig):
    _target_: str = "timm.optim.Lamb"
    lr: float = positive(2e-3)
    weight_decay: float = at_least(0, 0.01)
    betas: List[float] = bounded(low=0, high=1, open_high=True, factory=lambda: [0.9, 0.999])
    eps: float = at_least(0, 1e-6)
    max_grad_norm: Optional[float] = None  # bsexp clips with trainer.clip_grad_norm


# ---------------------------------------------------------------------------- batch policies


@dataclass
class BatchConfig:
    policy: Policy = MISSING
    size: int = at_least(1, 128)  # global: samples per optimizer step over all ranks and micro-steps
    drop_last: bool = False  # false: the last, smaller step of an epoch is kept, normalised exactly


@dataclass
class FixedBatch(BatchConfig):
    policy: Policy = Policy.fixed


@dataclass
class AccumulationBatch(BatchConfig):
    policy: Policy = Policy.accumulation
    size: int = at_least(1, 512)
    micro_size: Optional[int] = at_least(1, None)  # per rank; give this or accum_steps (or both, consistent)
    accum_steps: Optional[int] = at_least(1, None)


@dataclass
class FinderConfig:
    mode: FinderMode = FinderMode.fit  # fit: measure memory at two sizes, predict, confirm
    objective: FinderObjective = FinderObjective.max
    init: int = at_least(2, 8, why="(BatchNorm needs two samples)")  # the first micro-batch tried
    max_trials: int = at_least(2, 12)
    steps_per_trial: int = at_least(1, 2)  # training steps per trial (the first one after warm-up allocates)
    max_size: Optional[int] = at_least(2, None)  # largest micro-batch considered (also: the training set per rank)
    # The found global batch is at most this fraction of the training set, unless batch.size is
    # given (McCandlish et al. 2018, Smith et al. 2018: the useful batch lies well below N);
    # null: only memory bounds it.
    data_fraction: Optional[float] = bounded(0.1, low=0, high=1, open_low=True)
    margin: float = bounded(0.05, low=0, high=0.9)  # headroom: the answer is this fraction below the largest that fit
    memory_limit_gb: Optional[float] = positive(None)  # null: the GPU's memory, or what the machine has free
    throughput_tolerance: float = bounded(0.05, low=0, high=0.5)  # objective=throughput: within this of the best
    noise_steps: int = at_least(1, 100)  # objective=noise_scale: training steps that measure B_simple
    noise_batch: int = at_least(4, 256)  # objective=noise_scale: the batch they use (at most what fits)
    cache: bool = False  # reuse results for the same model, input, precision, device and limit
    cache_dir: str = "${oc.env:BSEXP_CACHE,'~/.cache/bsexp'}/finder"


@dataclass
class FinderBatch(BatchConfig):
    policy: Policy = Policy.finder
    size: Optional[int] = at_least(1, None)  # null: the found micro-batch x world size becomes the global batch
    finder: FinderConfig = field(default_factory=FinderConfig)


@dataclass
class BatchScheduleConfig:
    kind: ScheduleKind = ScheduleKind.step
    unit: Unit = Unit.epochs  # of `milestones`
    milestones: List[float] = bounded(low=0, factory=lambda: [8.0, 14.0])  # step: batch x factor at each
    factor: float = positive(5.0)  # step (Smith et al. 2018 grow the batch x5 where the LR would drop /5)
    end: Optional[int] = at_least(1, None)  # linear / exponential: the batch of the last epoch
    points: List[List[int]] = field(default_factory=list)  # list: [[epoch, batch], ...] from epoch 0
    round_to: int = at_least(1, 8)  # linear / exponential: batches are multiples of round_to x world size
    couple_lr: bool = True  # the LR follows the batch through scaling.lr_rule; false: held fixed
    ramp_steps: int = at_least(0, 0)  # ramp an LR change over this many steps


@dataclass
class ScheduledBatch(BatchConfig):
    policy: Policy = Policy.scheduled
    size: int = at_least(1, 32)  # the global batch the schedule starts from
    micro_size: Optional[int] = at_least(1, None)  # per rank: larger scheduled batches accumulate micro-batches
    find_micro_size: bool = False  # run the batch finder for the micro-batch that fits
    finder: FinderConfig = field(default_factory=FinderConfig)
    schedule: BatchScheduleConfig = field(default_factory=BatchScheduleConfig)


@dataclass
class AdaptiveConfig:
    interval: int = at_least(1, 25)  # optimizer steps between the controller's decisions
    objective: AdaptiveObjective = AdaptiveObjective.noise  # noise: c x B_simple; goodput: Pollux
    c: float = positive(1.0)  # objective=noise: the batch aimed at is c x B_simple (x batch.size^(1-power))
    # objective=noise: B_simple^power; 0.5 is McCandlish et al.'s fewest steps for the samples (B ∝ √B_noise)
    power: float = bounded(1.0, low=0, high=1, open_low=True)
    min_size: Optional[int] = at_least(1, None)  # null: batch.size
    max_size: Optional[int] = at_least(1, None)  # null: the training set
    max_growth: float = at_least(1.0, 2.0)  # at most x this per decision (and / this when shrinking)
    shrink: bool = False  # let the batch fall when B_simple does
    lr: AdaptiveLR = AdaptiveLR.rule  # rule: scaling.lr_rule follows the batch; adascale: the gain ratio


@dataclass
class AdaptiveBatch(BatchConfig):
    policy: Policy = Policy.adaptive
    size: int = at_least(1, 32)  # the first steps' global batch, until the noise scale is measured
    micro_size: Optional[int] = at_least(1, None)  # per rank: larger batches accumulate micro-batches
    find_micro_size: bool = True  # run the batch finder for the micro-batch that fits (and its throughput)
    finder: FinderConfig = field(default_factory=FinderConfig)
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)


# ---------------------------------------------------------------------------- world, logs


@dataclass
class DistributedConfig:
    kind: DistributedKind = DistributedKind.none
    backend: Backend = Backend.auto  # auto: NCCL on CUDA, gloo on CPU
    nproc_per_node: int = at_least(1, 1)  # workers bsexp launches itself when torchrun did not start it
    sync_batchnorm: Optional[bool] = None  # null: true when there is more than one rank
    timeout_s: float = at_least(1, 300.0)  # for collectives; a failed rank ends the job sooner


# Loggers: one schema (Config.logger), whose keys every option of conf/logger/ shares; each option
# turns its own logger on (`enabled`), so several compose (logger=[wandb,tensorboard], Hydra's list
# of options from one group); logger=none turns none on. metrics.jsonl and summary.json are written
# whatever is chosen.


@dataclass
class WandbConfig:
    enabled: bool = False  # logger=wandb (the default) sets it
    project: str = "bsexp"
    entity: Optional[str] = None
    group: Optional[str] = None
    name: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    mode: Optional[WandbMode] = None  # null: $WANDB_MODE if set, else offline
    dir: Optional[str] = None  # null: the run's output directory


@dataclass
class TensorboardConfig:
    enabled: bool = False  # logger=tensorboard sets it
    dir: Optional[str] = None  # null: <run dir>/tensorboard


@dataclass
class MlflowConfig:
    enabled: bool = False  # logger=mlflow sets it
    # null: $MLFLOW_TRACKING_URI if set, else a local file store in <run dir>/mlruns; or any URI
    # MLflow takes (file:/abs/mlruns shared by a sweep, sqlite:///abs/mlflow.db, http://host:5000)
    tracking_uri: Optional[str] = None
    experiment: str = "bsexp"
    run_name: Optional[str] = None  # null: the run directory's name


@dataclass
class LoggerConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)
    tensorboard: TensorboardConfig = field(default_factory=TensorboardConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)


# ---------------------------------------------------------------------------- top level


@dataclass
class ScalingConfig:
    ref_batch: int = at_least(1, 128)  # the batch at which optimizer.lr and optimizer.weight_decay were tuned
    lr_rule: Rule = Rule.linear  # k = batch.size / ref_batch: LR x k (linear), x sqrt(k) (sqrt), x 1 (none)
    wd_rule: Rule = Rule.sqrt  # weight decay x sqrt(k) (Loshchilov & Hutter's normalised decay), x k, x 1


@dataclass
class ScheduleConfig:
    unit: Unit = Unit.epochs  # of `warmup` and `milestones`
    warmup: float = at_least(0, 2.0)
    warmup_shape: WarmupShape = WarmupShape.linear  # linear (gradual) | constant | none
    start_factor: Optional[float] = at_least(0, None)  # null: base LR / scaled LR, the reference batch's LR
    main: MainSchedule = MainSchedule.cosine
    milestones: List[float] = bounded(low=0, factory=list)  # for main=step
    factor: float = bounded(0.1, low=0, high=1, open_low=True)  # for main=step: LR x this at each milestone
    final_factor: float = bounded(0.0, low=0, high=1)  # for main=cosine: the LR ends at this fraction of its peak


@dataclass
class TrainerConfig:
    clip_grad_norm: Optional[float] = positive(None)
    eval_every_steps: int = at_least(0, 0)  # 0: evaluate at the end of every epoch
    eval_batch_size: int = at_least(1, 1024)
    # stop after this many optimizer steps (batch=adaptive: a budget of the samples that many steps
    # of its first batch take; the run ends when it has taken them)
    max_steps: Optional[int] = at_least(1, None)
    progress: bool = True  # progress bars (off anyway when output is not a terminal)
    deterministic: bool = True
    threads: Optional[int] = at_least(1, None)  # torch CPU threads; null: torch's default
    memory_limit_gb: Optional[float] = positive(None)  # train as on a smaller machine: a real cap on memory
    oom_recovery: bool = True  # on OOM: halve the micro-batch, accumulate, retry the same data
    # Gradient noise scale: auto measures it where it is free (accumulation, several ranks);
    # always also measures a single micro-batch from a half computed on the side; off never.
    noise_scale: NoiseMode = NoiseMode.auto
    noise_decay: float = bounded(0.99, low=0, high=1, open_high=True)  # of the moving averages of |G|^2, tr(Sigma)


@dataclass
class CheckpointConfig:
    every_steps: int = at_least(0, 0)  # 0: only at epoch ends (every_epoch)
    every_epoch: bool = True
    keep: int = at_least(1, 2)  # the newest K are kept
    allow_mismatch: bool = False  # resume from a checkpoint of another model or global batch anyway
    # Also save (and keep, whatever `keep` says) at the first step at or past each of these samples
    # seen, as checkpoints/samples-<n>.pt; 0: before the first step. Trunks of branches (branch.*).
    at_samples: List[int] = bounded(low=0, factory=list)


@dataclass
class BranchConfig:
    """A branch: the run continued from another run's (the trunk's) checkpoint with its own global
    batch (batch.*; LR and weight decay by scaling.*), on the same data stream, for `samples`
    samples. Every other key must equal the trunk's. Merrill et al. 2025's branched training."""

    trunk: Optional[str] = None  # the trunk: a run directory, or a sweep directory (the job of this seed)
    at_samples: Optional[int] = at_least(
        0, None
    )  # the trunk's checkpoint at these samples seen (checkpoint.at_samples)
    samples: Optional[int] = at_least(1, None)  # samples the branch trains on
    evals: int = at_least(1, 4)  # evaluations along the branch, evenly in samples (and one at its start)


@dataclass
class Config:
    data: Any = MISSING
    model: Any = MISSING
    optimizer: Any = MISSING
    batch: Any = MISSING
    distributed: Any = MISSING
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = at_least(0, 0)
    epochs: int = at_least(1, 20)
    device: Device = Device.auto
    precision: Precision = Precision.fp32
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    branch: BranchConfig = field(default_factory=BranchConfig)
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
    "schema_batch_adaptive": AdaptiveBatch,
    "schema_distributed": DistributedConfig,
    "schema_logger": LoggerConfig,
}


GROUPS = ("data", "model", "optimizer", "batch", "distributed", "logger")


def where_defined(name: str, parent: str) -> tuple[list[str], list[str]]:
    """For a key `parent.name` the config does not have: the full keys of that name elsewhere in
    the top-level schema (`lr` -> optimizer.lr; from the top level only), and the group options
    whose schema defines `name` under `parent` (`batch.micro_size` -> batch=accumulation)."""
    from dataclasses import MISSING as NO_DEFAULT
    from dataclasses import fields, is_dataclass

    full: list[str] = []
    if not parent:
        for f in fields(Config):
            default = f.default_factory() if f.default_factory is not NO_DEFAULT else None
            if is_dataclass(default) and name in {g.name for g in fields(default)}:
                full.append(f"{f.name}.{name}")
        for group in GROUPS:
            if (
                any(
                    name in {g.name for g in fields(cls)}
                    for key, cls in SCHEMAS.items()
                    if key.startswith(f"schema_{group}")
                )
                and f"{group}.{name}" not in full
            ):
                full.append(f"{group}.{name}")
    options = []
    if parent in GROUPS:
        for key, cls in SCHEMAS.items():
            option = key.removeprefix(f"schema_{parent}_")
            if key.startswith(f"schema_{parent}_") and name in {g.name for g in fields(cls)}:
                names = "|".join(VISION_SETS) if option == "torchvision" else option
                options.append(f"{parent}={names}")
    return full, options


def key_hint(key: str) -> str:
    """For an unknown key: the full key of that name (`lr` -> optimizer.lr), or the group options
    whose schema defines it (batch.micro_size -> batch=accumulation)."""
    parent, _, name = key.rpartition(".")
    full, options = where_defined(name, parent)
    if full:
        return f" (did you mean {' or '.join(full)}?)"
    if options:
        return f" (it is a key of {' or '.join(options)})"
    return ""


add_key_hint(key_hint)


def register_configs() -> None:
    """Schemas are stored outside any group, so `--help` lists only the real options."""
    from bsexp.sweep import register_resolvers

    store = ConfigStore.instance()
    for name, node in SCHEMAS.items():
        store.store(name=name, node=node)
    register_resolvers()  # ${bsexp_job_dir:}, the name of a sweep point's directory
