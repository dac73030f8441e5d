"""What the batch policies share: the keys every policy's config has, what every policy is made
from beside it (`RunSpec`) and measures with (`Probe`), and what several do alike, as plain
functions they call (no base class)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from bsexp.batch.hparams import Rules
from bsexp.batch.layout import Layout
from bsexp.batch.plan import BatchPlan, make_plan, plan_for
from bsexp.batch.schedule import BatchSchedule, RunSteps
from bsexp.errors import ConfigError
from bsexp.fields import at_least, choice

# batch.policy's choices: each names a class in bsexp.batch.policies.REGISTRY (a test holds them equal).
POLICIES = ("fixed", "accumulation", "finder", "scheduled", "adaptive")
Policy = choice("Policy", *POLICIES, module=__name__)


@dataclass
class BatchConfig:
    """What every batch policy's config has (each policy's own dataclass adds its keys)."""

    policy: Policy = MISSING
    size: int = at_least(1, 128)  # global: samples per optimizer step over all ranks and micro-steps
    drop_last: bool = False  # false: the last, smaller step of an epoch is kept, normalised exactly


@dataclass(frozen=True)
class Probe:
    """What a policy may measure with when it lays the run out: the training set's size and name,
    the world (its ranks agree through it), the batch finder (`find(keep_size=..., largest=...)`
    -> bsexp.finder.FinderResult) and the gradient noise scale (`measure_noise(batch,
    steps)`: B_simple after training a copy of the run `steps` steps at `batch`)."""

    n_train: int
    data: str = "the data"
    world: Any = None
    find: Callable[..., Any] | None = None
    measure_noise: Callable[[int, int], float | None] | None = None


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """What a policy may read of the run beyond its own config, each from the key named beside
    it (bsexp.batch.policies.run_spec reads them). The defaults are bsexp's, but for `rules`:
    Rules' own (a constant LR, no warmup) at the SGD default's LR and weight decay at batch 128."""

    epochs: int  # epochs
    world_size: int = 1  # ranks the global batch is split over
    max_steps: int | None = None  # trainer.max_steps: the run's step budget (None: none)
    drop_last: bool = False  # batch.drop_last
    # optimizer.lr and .weight_decay, scaling.ref_batch, .lr_rule and .wd_rule, schedule.*
    rules: Rules = field(default_factory=lambda: Rules(lr=0.1, weight_decay=5e-4, ref_batch=128))
    noise_scale: str = "auto"  # trainer.noise_scale
    data_in_memory: bool = True  # data.in_memory
    trunk: Mapping[str, Any] | None = None  # the trunk's checkpoint: batch, step, samples, ... (bsexp.runs.trunk.find)


def run_steps(spec: RunSpec, schedule: BatchSchedule, n_train: int) -> RunSteps:
    """Every step of the run the spec asks for (epochs, drop_last, trainer.max_steps), the
    global batch of each as `schedule` lays it out."""
    return schedule.run_steps(spec.epochs, n_train, spec.drop_last, spec.max_steps)


def constant_layout(
    spec: RunSpec, n_train: int, size: int, first: BatchPlan | None = None, micro_size_cap: int | None = None
) -> Layout:
    """The run at one global batch `size` throughout: its first plan `first` (default: `size`
    split under `micro_size_cap`)."""
    world = spec.world_size
    run = run_steps(spec, BatchSchedule(start=size, world_size=world), n_train)
    return Layout(run, world, first or plan_for(size, world, micro_size_cap), micro_size_cap=micro_size_cap)


def fits_data(sizes: list[int] | tuple[int, ...], n_train: int, data: str, key: str | None = None) -> None:
    """Every batch in `sizes` within the `n_train` training samples of `data`: the error names
    batch.size for one batch, batch.schedule for several (or `key`)."""
    if max(sizes) > n_train:
        one = len(sizes) == 1
        raise ConfigError(
            key or ("batch.size" if one else "batch.schedule"),
            sizes[0] if one else list(sizes),
            f"{'exceeds' if one else 'grows past'} the {n_train} training samples of {data}",
        )


def given_plan(batch, world: int) -> BatchPlan:
    """batch.size in micro-batches of batch.micro_size (or batch.accum_steps of them) a rank."""
    return make_plan(batch.size, world, getattr(batch, "micro_size", None), getattr(batch, "accum_steps", None))
