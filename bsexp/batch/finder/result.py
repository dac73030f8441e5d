"""What the finder measured: one `Trial` per micro-batch size tried, and the `FinderResult`
(the chosen size, its plan, the trial table) that goes to finder.json, summary.json and W&B."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bsexp import memory
from bsexp.batch.finder.search import Attempt
from bsexp.batch.plan import BatchPlan


@dataclass
class Trial:
    size: int
    ok: bool
    failed_in: str | None = None  # "train" or "eval" when out of memory
    peak_mb: float | None = None  # above the baseline (model, data, optimizer state), train or eval
    reserved_mb: float | None = None  # CUDA: the allocator's reserve; CPU: address space mapped
    alloc_retries: int | None = None  # CUDA: allocations retried after freeing the cache
    seconds: float = 0.0
    samples_per_s: float | None = None  # of the training steps, after the first
    train_peak_mb: float | None = None  # of the training steps alone: what grows with the size

    def attempt(self) -> Attempt:
        peak = None if self.train_peak_mb is None else self.train_peak_mb * memory.MIB
        return Attempt(self.size, self.ok, peak, self.samples_per_s)


@dataclass
class FinderResult:
    mode: str
    objective: str
    limit_gb: float
    margin: float
    budget_mb: float
    trials: list[Trial]
    micro_size: int  # chosen, per rank
    plan: BatchPlan
    note: str = ""
    loader_samples_per_s: float | None = None
    step_samples_per_s: float | None = None
    cached: bool = False
    world_size: int = 1
    seconds: float = 0.0  # spent probing, start of the probe process included
    noise_b_simple: float | None = None  # objective=noise_scale: the measured gradient noise scale
    max_size: int | None = None  # the largest micro-batch per rank considered
    max_size_by: str = ""  # what set it (memory aside): the data, batch.finder.max_size, ...

    def summary(self) -> dict[str, Any]:
        """The short form for summary.json (finder.json holds every trial)."""
        keys = ("mode", "objective", "limit_gb", "margin", "budget_mb", "micro_size", "note",
                "loader_samples_per_s", "step_samples_per_s", "cached", "seconds", "noise_b_simple", "max_size",
                "max_size_by")
        return {**{k: getattr(self, k) for k in keys}, "trials": len(self.trials),
                "batch_size": self.plan.size, "accum_steps": self.plan.accum_steps}

    def to_json(self) -> dict[str, Any]:
        return {**self.summary(), "plan": asdict(self.plan), "trials": [asdict(t) for t in self.trials]}

    def table(self) -> str:
        lines = [f"finder ({self.mode}, objective {self.objective}, limit {self.limit_gb:.2f} GB, margin "
                 f"{100 * self.margin:.0f} %, budget above baseline {self.budget_mb:,.0f} MB, "
                 f"{self.seconds:.1f} s{', from cache' if self.cached else ''}):",
                 f"  {'size':>6}  {'result':<10}  {'peak MB':>9}  {'reserved MB':>11}  {'retries':>7}  "
                 f"{'seconds':>7}  {'samples/s':>9}"]
        for t in sorted(self.trials, key=lambda t: t.size):
            result = "ok" if t.ok else f"OOM ({t.failed_in})"
            fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
            lines.append(f"  {t.size:>6}  {result:<10}  {fmt(t.peak_mb, '9,.1f')}  {fmt(t.reserved_mb, '11,.1f')}  "
                         f"{fmt(t.alloc_retries, '7d')}  {t.seconds:7.2f}  {fmt(t.samples_per_s, '9,.0f')}")
        if self.max_size is not None:
            lines.append(f"  sizes considered up to {self.max_size:,} per rank, set by {self.max_size_by}")
        lines.append(f"  chosen: micro-batch {self.micro_size} -> batch {self.plan.size} = {self.plan.micro_size} "
                     f"x {self.plan.accum_steps} x {self.plan.world_size}. {self.note}".rstrip())
        return "\n".join(lines)


