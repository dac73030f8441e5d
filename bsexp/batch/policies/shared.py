"""What several batch policies do alike, as plain functions they call (no base class)."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from bsexp.batch.layout import Layout
from bsexp.batch.plan import BatchPlan, make_plan, plan_for
from bsexp.batch.policies import REGISTRY
from bsexp.batch.schedule import BatchSchedule, RunSteps
from bsexp.errors import ConfigError
from bsexp.fields import at_least, choice

Policy = choice("Policy", *REGISTRY, module=__name__)


@dataclass
class BatchConfig:
    """What every batch policy's config has (each policy's own dataclass adds its keys)."""

    policy: Policy = MISSING
    size: int = at_least(1, 128)  # global: samples per optimizer step over all ranks and micro-steps
    drop_last: bool = False  # false: the last, smaller step of an epoch is kept, normalised exactly


def run_steps(cfg, schedule: BatchSchedule, n_train: int) -> RunSteps:
    """Every step of the run the config asks for (epochs, drop_last, trainer.max_steps), the
    global batch of each as `schedule` lays it out."""
    return schedule.run_steps(cfg.epochs, n_train, cfg.batch.drop_last, cfg.trainer.max_steps)


def constant_layout(
    cfg, world: int, n_train: int, size: int, first: BatchPlan | None = None, micro_size_cap: int | None = None
) -> Layout:
    """The run at one global batch `size` throughout: its first plan `first` (default: `size`
    split under `micro_size_cap`)."""
    run = run_steps(cfg, BatchSchedule(start=size, world_size=world), n_train)
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
    return make_plan(batch.size, world, batch.get("micro_size"), batch.get("accum_steps"))
