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
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from bsexp.batch.policies import REGISTRY, config_of
from bsexp.batch.policies.branch import BranchConfig
from bsexp.batch.scaling import MOMENTUM_RULES, RULES
from bsexp.config.comparison import ComparisonConfig
from bsexp.errors import add_key_hint
from bsexp.fields import Bound, Unit, at_least, bounded, choice, positive  # noqa: F401 (Bound: for the checks)

Device = choice("Device", "auto", "cpu", "cuda", module=__name__)
Precision = choice("Precision", "fp32", "bf16", "fp16", module=__name__)
Rule = choice("Rule", *RULES, module=__name__)
MomentumRule = choice("MomentumRule", *MOMENTUM_RULES, module=__name__)
WarmupShape = choice("WarmupShape", "linear", "constant", "none", module=__name__)
MainSchedule = choice("MainSchedule", "cosine", "step", "constant", module=__name__)
NORMS = ("batch", "group", "layer", "none")
Norm = choice("Norm", *NORMS, module=__name__)
DistributedKind = choice("DistributedKind", "none", "ddp", module=__name__)
Backend = choice("Backend", "auto", "gloo", "nccl", module=__name__)
NoiseMode = choice("NoiseMode", "auto", "off", "always", module=__name__)
Speed = choice("Speed", "auto", "fast", "reproducible", module=__name__)
CudaGraphs = choice("CudaGraphs", "auto", "on", "static", "off", module=__name__)
WandbMode = choice("WandbMode", "offline", "online", "disabled", module=__name__)
# The metrics a target can name (trainer.stop_at, trainer.ladder), as the metrics records name them;
# the losses (nats per sample, or per token for a language model; val_bpb: bits per byte of text) are
# better lower, the accuracies higher.
LadderMetric = choice("LadderMetric", "val_acc", "val_loss", "train_acc", "train_loss", "val_bpb", module=__name__)
LOWER_IS_BETTER = ("val_loss", "train_loss", "val_bpb", "test_loss")  # test_loss: the sweep report's --metric
TextSource = choice("TextSource", "auto", "markov", "files", "shards", "hf", module=__name__)
# The torchvision sets bsexp knows: name -> (torchvision class, number of classes).
VISION_SETS = {
    "mnist": ("MNIST", 10),
    "fashion_mnist": ("FashionMNIST", 10),
    "cifar10": ("CIFAR10", 10),
    "cifar100": ("CIFAR100", 100),
}
VisionSet = choice("VisionSet", *VISION_SETS, module=__name__)

DATA_ROOT = "${oc.env:BSEXP_DATA,data}"


# ---------------------------------------------------------------------------- data


@dataclass
class DataConfig:
    _target_: str = MISSING
    seed: int = at_least(0, 42)  # generates and splits the data; the run's `seed` does not change it
    val_size: int = at_least(1, 500)  # samples held out of the training split for validation


@dataclass
class MNIST1DData(DataConfig):
    _target_: str = "bsexp.engine.datasets.mnist1d"
    root: str = DATA_ROOT
    num_samples: int = at_least(1, 5000)  # train + test; 5000 with train_split 0.8 is the published split
    train_split: float = bounded(0.8, low=0, high=1, open_low=True, open_high=True)


@dataclass
class DigitsData(DataConfig):
    _target_: str = "bsexp.engine.datasets.digits"
    val_size: int = at_least(1, 360)


@dataclass
class TorchvisionData(DataConfig):
    _target_: str = "bsexp.engine.datasets.torchvision_dataset"
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
    _target_: str = "bsexp.engine.datasets.synthetic"
    shape: List[int] = bounded(low=1, nonempty=True, factory=lambda: [1, 40])
    num_classes: int = at_least(2, 10)
    num_samples: int = at_least(1, 4096)
    val_size: int = at_least(1, 512)
    test_size: int = at_least(0, 512)
    noise: float = at_least(0, 1.0)
    in_memory: bool = True
    num_workers: int = at_least(0, 0)


@dataclass
class TextData(DataConfig):
    """A language model's data (bsexp.engine.text): sequences of `context` tokens, next tokens as targets."""

    _target_: str = "bsexp.engine.text.text"
    # auto: markov without data.path; shards where data.path holds .bin files; else files
    source: TextSource = TextSource.auto
    path: Optional[str] = None  # a text file or a folder of them (files), or a folder of token shards (shards)
    context: int = at_least(1, 16)  # tokens per sequence (one sample); tokens per step = batch.size x this
    val_size: int = at_least(1, 1024)  # validation sequences (the first of the held-out tokens)
    val_fraction: float = bounded(0.1, low=0, high=1, open_low=True, open_high=True)  # of files' and hf's bytes
    train_tokens: int = at_least(1, 262_144)  # markov: training tokens generated (in sequences of context)
    order: int = bounded(2, low=1, high=8)  # markov: the symbols a next one depends on
    symbols: int = bounded(16, low=2, high=256)  # markov: the alphabet (bytes a, b, c, ... up to 26)
    branching: int = at_least(1, 4)  # markov: the possible next symbols of each context
    # null: 256 for bytes, 50257 (GPT-2's) for shards; markov: 256 or more (a tokenizer's size: the model's cost)
    vocab: Optional[int] = at_least(2, None)
    name: Optional[str] = None  # hf: the dataset, e.g. roneneldan/TinyStories (pip install -e '.[text]')
    max_bytes: int = at_least(1, 16_000_000)  # hf: the bytes of text read


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
    dropout: float = bounded(
        0.0, low=0, high=1, open_high=True
    )  # before the classifier (the MLP: after every hidden layer)


@dataclass
class MLPModel(ModelConfig):
    _target_: str = "bsexp.engine.models.MLP"
    hidden: List[int] = bounded(low=1, factory=lambda: [256, 256])  # empty: logistic regression


@dataclass
class CNN1dModel(ModelConfig):
    _target_: str = "bsexp.engine.models.CNN1d"
    width: int = at_least(1, 32)


@dataclass
class CNNModel(ModelConfig):
    _target_: str = "bsexp.engine.models.CNN"
    width: int = at_least(1, 32)


@dataclass
class GPTModel(ModelConfig):
    """A decoder-only transformer (bsexp.engine.gpt): its context is data.context, its vocabulary the data's."""

    _target_: str = "bsexp.engine.gpt.GPT"
    norm: Norm = Norm.layer  # layer (pre-LayerNorm, GPT-2's) or none
    layers: int = at_least(1, 2)
    heads: int = at_least(1, 4)
    width: int = at_least(1, 64)  # features per token; a multiple of model.heads


@dataclass
class ResNet18Model(ModelConfig):
    _target_: str = "bsexp.engine.models.resnet18"
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
    # null: $MLFLOW_TRACKING_URI if set, else MLflow's SQLite store <run dir>/mlflow.db (a sweep's
    # points: <sweep dir>/mlflow.db); or any URI MLflow takes (sqlite:////abs/mlflow.db, http://host:5000)
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
    dropout_rule: Rule = Rule.none  # every dropout layer's rate x sqrt(k) or x k ("a larger batch, more dropout")
    dropout_max: float = bounded(0.5, low=0, high=1, open_high=True)  # the dropout rule's cap
    # BatchNorm's momentum at k: 1 - (1 - m)^k (per_sample: the same forgetting per sample), m / k
    # (inverse: the newest batch's weight per sample; forgetting k^2 x slower per sample), m / sqrt(k)
    bn_momentum_rule: MomentumRule = MomentumRule.none
    bn_momentum_min: float = bounded(0.001, low=0, high=1, open_low=True)  # the momentum rule's floor


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
    # Besides: evaluate at steps growing by this fraction (0.04: 1, 2, ..., 25, 26, 28, 30, 32, ...), so
    # that the step a run reached a target is resolved to about that fraction, at any batch size
    eval_growth: Optional[float] = positive(None)
    # End the run once trainer.stop_metric reaches this (steps to result): an accuracy at or above it (a
    # fraction), a loss at or below it (nats per token for a language model, or bits per byte: val_bpb)
    stop_at: Optional[float] = bounded(None, low=0)
    stop_metric: LadderMetric = LadderMetric.val_acc
    # Targets of trainer.ladder_metric, easiest first (a loss's falling): summary.json's `ladder` holds
    # the step, samples and LR at which the run first reached each (a comparison's rungs)
    ladder: List[float] = bounded(low=0, factory=list)
    ladder_metric: LadderMetric = LadderMetric.val_acc  # accuracies are reached at or above a rung, losses below
    ladder_stop: bool = False  # end the run once it reaches the ladder's top rung
    eval_batch_size: int = at_least(1, 1024)
    # PreciseBN (Wu & Johnson 2021): before each evaluation, BatchNorm's running statistics recomputed
    # as the plain average over this many training samples (a seeded subset, not augmented), in batches
    # of the step's micro-batch, with the weights as they are. null: the running average of training
    precise_bn: Optional[int] = at_least(1, None)
    # stop after this many optimizer steps (batch=adaptive: a budget of the samples that many steps
    # of its first batch take; the run ends when it has taken them)
    max_steps: Optional[int] = at_least(1, None)
    progress: bool = True  # progress bars (off anyway when output is not a terminal)
    # fast: cuDNN's autotuner and TF32, channels_last for image models, fused optimizer kernels, and
    # torch.compile where trainer.compile_mode asks (eager else); reproducible: bit for bit the
    # same run again (what the equivalence tests hold), its CPU threads pinned at torch's default;
    # auto: fast on CUDA, reproducible's computation on the CPU with its threads shared with the
    # machine's other bsexp runs (docs: GPUs)
    speed: Speed = Speed.auto
    # torch.compile's mode when fast: none (null: eager), default or max-autotune-no-cudagraphs; no CUDA graphs
    compile_mode: Optional[str] = None
    # The whole step as one CUDA graph per shape, gradients kept in place so accumulation stays exact
    # (docs: GPUs): auto where it applies (CUDA, fast path, fp32/bf16, one process), else eager; on:
    # refused where it cannot; static: the same step without the capture, on any device; off (the
    # default until a GPU has run tests/gpu's graphed cases: scripts/gpu_check.sh): eager
    cuda_graphs: CudaGraphs = CudaGraphs.off
    deterministic: bool = True  # the reproducible path: torch's deterministic algorithms
    # torch CPU threads, pinned; null: a share of the cores beside the machine's other bsexp runs
    # (torch's default alone), moved while training as they come and go (docs: Sweeps and the report)
    threads: Optional[int] = at_least(1, None)
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
class TuneConfig:
    """Steps to result (python -m bsexp.tune, experiment=steps_to_result): the learning rate tuned at
    each batch size by a quasi-random search (bsexp.runs.quasi_random), then the best of each rerun over seeds.
    A config takes its values with `optimizer.lr: ${bsexp_tuned:lr}`."""

    trial: Optional[int] = at_least(0, None)  # this run's point of the search; null: no search
    trials: int = at_least(1, 16)  # points of the search at every batch size (the budget)
    lr_min: float = positive(0.001)  # the LR is searched log-uniformly in [lr_min, lr_max]
    lr_max: float = positive(10.0)
    momentum: bool = False  # search SGD's momentum too (1 - momentum log-uniform in [0.01, 0.5])
    warmup_max: Optional[float] = positive(None)  # search a linear warmup too, uniform in [0, this] (schedule.unit)
    search_seed: int = at_least(0, 0)  # scrambles the Sobol sequence
    # what a run's steps are counted to: tune.metric reaching tune.target (an accuracy at or above it, a
    # fraction; a loss at or below it: nats per token for a language model, or bits per byte: val_bpb)
    target: float = bounded(0.9, low=0)
    metric: LadderMetric = LadderMetric.val_acc
    seeds: int = at_least(0, 3)  # reruns of each batch size's best trial, seeds 1 to this
    best: Optional[str] = None  # the best trials (best.json): their values, for the reruns
    arm: Optional[str] = None  # a comparison's arm this run belongs to (comparison.arms); its trial searches its space
    around: Optional[str] = None  # the search's best per arm (search_best.json): trials drawn around it (refinement)


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
    tune: TuneConfig = field(default_factory=TuneConfig)
    comparison: ComparisonConfig = field(default_factory=ComparisonConfig)
    resume: Optional[str] = None  # auto: the newest readable checkpoint of the run directory; or a path


SCHEMAS = {
    "bsexp_config": Config,
    "schema_data_mnist1d": MNIST1DData,
    "schema_data_digits": DigitsData,
    "schema_data_torchvision": TorchvisionData,
    "schema_data_synthetic": SyntheticData,
    "schema_data_text": TextData,
    "schema_model_mlp": MLPModel,
    "schema_model_cnn1d": CNN1dModel,
    "schema_model_cnn": CNNModel,
    "schema_model_resnet18": ResNet18Model,
    "schema_model_gpt": GPTModel,
    "schema_optimizer": OptimizerConfig,  # for optimizers of your own
    "schema_optimizer_sgd": SGDOptimizer,
    "schema_optimizer_adamw": AdamWOptimizer,
    "schema_optimizer_lars": LarsOptimizer,
    "schema_optimizer_lamb": LambOptimizer,
    **{f"schema_batch_{name}": config_of(name) for name in REGISTRY},  # each beside its policy
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
    """Schemas are stored outside any group, so `--help` lists only the real options. The runs'
    own interpolations (${bsexp_job_dir:}, ${bsexp_tuned:lr}) are registered beside this by each
    entry point (bsexp.runs.sweep.register_resolvers): they belong to the floor above."""
    store = ConfigStore.instance()
    for name, node in SCHEMAS.items():
        store.store(name=name, node=node)
