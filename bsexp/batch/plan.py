"""Batch plans: how a global batch is split over ranks and micro-steps.

Pure arithmetic, no torch. Every batch policy (bsexp.batch.policies) ends in `BatchPlan`s; the
training loop consumes plans and never derives batch math of its own. `plan_for` splits a global
batch into micro-batches no larger than the micro-batch known to fit, accumulating the rest, so
the global batch is kept exactly; `micro_sizes` says how one step's samples are cut.
"""

from __future__ import annotations

from dataclasses import dataclass

from bsexp.errors import ConfigError

MIN_MICRO = 2  # samples: BatchNorm cannot normalise a single sample in training


class PlanError(ConfigError, ValueError):
    """An impossible batch plan: a configuration error (one line naming the key, exit code 2)."""

    def __reduce__(self):
        return PlanError, (self.key, self.value, self.expected)


@dataclass(frozen=True)
class BatchPlan:
    """`size` samples per optimizer step, summed over `world_size` ranks and `accum_steps`
    micro-steps of `micro_size` samples each (per rank)."""

    size: int
    micro_size: int
    accum_steps: int
    world_size: int

    def __post_init__(self) -> None:
        for key in ("size", "micro_size", "accum_steps", "world_size"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PlanError(f"batch.{key}", value, "must be an integer >= 1")
        if self.size != self.micro_size * self.accum_steps * self.world_size:
            raise PlanError(
                "batch.size",
                self.size,
                f"must equal micro_size * accum_steps * world_size "
                f"= {self.micro_size} * {self.accum_steps} * {self.world_size} "
                f"= {self.micro_size * self.accum_steps * self.world_size}",
            )

    @property
    def per_rank(self) -> int:
        """Samples one rank contributes to one optimizer step."""
        return self.micro_size * self.accum_steps


def make_plan(
    size: int,
    world_size: int = 1,
    micro_size: int | None = None,
    accum_steps: int | None = None,
) -> BatchPlan:
    """The plan for a global batch `size` on `world_size` ranks.

    Give `micro_size`, `accum_steps`, both (checked) or neither (one micro-step per rank).
    """
    if size < 1:
        raise PlanError("batch.size", size, "must be an integer >= 1")
    if world_size < 1:
        raise PlanError("distributed.world_size", world_size, "must be an integer >= 1")
    if size % world_size:
        raise PlanError("batch.size", size, f"must be divisible by the world size {world_size}")
    per_rank = size // world_size
    if micro_size is None and accum_steps is None:
        return BatchPlan(size, per_rank, 1, world_size)
    if micro_size is not None:
        if micro_size < 1:
            raise PlanError("batch.micro_size", micro_size, "must be an integer >= 1")
        if micro_size > per_rank:
            raise PlanError(
                "batch.micro_size",
                micro_size,
                f"must be at most batch.size / world_size = {per_rank}",
            )
        if per_rank % micro_size:
            raise PlanError(
                "batch.micro_size",
                micro_size,
                f"must divide batch.size / world_size = {per_rank} (divisors: {_divisors_text(per_rank)})",
            )
        if accum_steps is not None and accum_steps != per_rank // micro_size:
            raise PlanError(
                "batch.accum_steps",
                accum_steps,
                f"must be batch.size / (micro_size * world_size) = {per_rank // micro_size}, or left unset",
            )
        return BatchPlan(size, micro_size, per_rank // micro_size, world_size)
    assert accum_steps is not None
    if accum_steps < 1:
        raise PlanError("batch.accum_steps", accum_steps, "must be an integer >= 1")
    if per_rank % accum_steps:
        raise PlanError(
            "batch.accum_steps",
            accum_steps,
            f"must divide batch.size / world_size = {per_rank} (divisors: {_divisors_text(per_rank)})",
        )
    return BatchPlan(size, per_rank // accum_steps, accum_steps, world_size)


def _divisors_text(n: int, limit: int = 12) -> str:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    shown = ", ".join(map(str, divisors[:limit]))
    return shown + (", ..." if len(divisors) > limit else "")


def keep_final(samples: int, world_size: int, drop_last: bool) -> bool:
    """Whether an epoch's last, smaller step is trained on: not with drop_last, nor when a rank
    would get fewer than MIN_MICRO samples of it."""
    return not drop_last and samples // world_size >= MIN_MICRO


def plan_for(size: int, world_size: int, micro_size_cap: int | None) -> BatchPlan:
    """The plan for a global batch with micro-batches of at most `micro_size_cap` per rank: the
    largest micro-batch under the cap that divides the rank's share, accumulating the rest."""
    if size % world_size:
        raise PlanError("batch.size", size, f"must be divisible by the world size {world_size}")
    per_rank = size // world_size
    if micro_size_cap is None or per_rank <= micro_size_cap:
        return make_plan(size, world_size)
    micro = max(d for d in range(1, micro_size_cap + 1) if per_rank % d == 0)
    return make_plan(size, world_size, micro_size=micro)


def micro_sizes(local: int, samples: int, plan: BatchPlan) -> list[int]:
    """This rank's micro-batch sizes for a step of `samples` global samples (`local` of them on
    this rank). A full step: accum_steps of micro_size. A smaller last step: the same number of
    micro-batches on every rank (SyncBatchNorm and DDP expect it), as many as the largest share
    needs but none below MIN_MICRO samples, sizes differing by at most one."""
    if samples == plan.size:
        return [plan.micro_size] * plan.accum_steps
    largest, smallest = -(-samples // plan.world_size), samples // plan.world_size
    count = max(1, min(-(-largest // plan.micro_size), smallest // MIN_MICRO))
    return [local // count + (1 if i < local % count else 0) for i in range(count)]
