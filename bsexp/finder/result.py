"""What the finder measured: one `Trial` per micro-batch size tried, and the `FinderResult`
(the chosen size, its plan, the trial table) that goes to finder.json, summary.json and W&B."""

from __future__ import annotations

from dataclasses import KW_ONLY, asdict, dataclass, field
from typing import Any

from bsexp.batch.plan import BatchPlan
from bsexp.finder import search
from bsexp.finder.search import Attempt
from bsexp.system import memory


@dataclass
class Trial:
    size: int
    ok: bool
    _: KW_ONLY  # the rest by name: Trial(size, ok, failed_in="train", ...)
    failed_in: str | None = None  # "train" when out of memory ("killed": the probe process died)
    peak_mb: float | None = None  # above the baseline (model, data, optimizer state), train or eval
    reserved_mb: float | None = None  # CUDA: the allocator's reserve; CPU: address space mapped
    alloc_retries: int | None = None  # CUDA: allocations retried after freeing the cache
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # the process's CPU time through the trial: its work, not the machine's load
    samples_per_s: float | None = None  # of the training steps, after the first
    train_peak_mb: float | None = None  # of the training steps alone: what grows with the size
    forward_s: float | None = None  # the last training step's parts: forward,
    backward_s: float | None = None  # backward (with the loss),
    optimizer_s: float | None = None  # optimizer step
    mapped_peak_mb: float | None = None  # CPU: address space (what the cap limits) at backward_peak_mb, when known
    room_mb: float | None = None  # CPU: address space the cap left after the trial
    backward_peak_mb: float | None = None  # through forward and backward, before the optimizer step
    probe: bool = False  # one training step, to measure the peak (fit's small sizes): a pass proves less
    error: str | None = None  # where it failed: the out-of-memory error's first line

    def attempt(self) -> Attempt:
        """What the search sees: the training step's peak, and on CPU the address space (what the
        cap limits) at the peak where measured and the room the cap left."""
        mib = lambda v: None if v is None else v * memory.MIB  # noqa: E731
        return Attempt(
            self.size,
            self.ok,
            peak_bytes=mib(self.growing_peak_mb),
            samples_per_s=self.samples_per_s,
            room_bytes=mib(self.room_mb),
            mapped_bytes=mib(self.mapped_peak_mb),
            verified=not self.probe,
        )

    @property
    def growing_peak_mb(self) -> float | None:
        """The peak that grows with the size: through forward and backward where measured."""
        return self.backward_peak_mb if self.backward_peak_mb is not None else self.train_peak_mb


@dataclass(kw_only=True)
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
    edge: int | None = None  # where the memory runs out, as the trials measured it (search.measured_edge)
    headroom_mb: float = 0.0  # left below the measured room for the kernels the trials do not run
    memory: dict[str, Any] = field(default_factory=dict)  # where the memory goes (memory_breakdown)
    startup: dict[str, float] = field(default_factory=dict)  # seconds before the first trial, by part
    checkpointing: dict[str, Any] = field(default_factory=dict)  # model.activation_checkpointing: its trade

    def summary(self) -> dict[str, Any]:
        """The short form for summary.json (finder.json holds every trial)."""
        keys = (
            "mode",
            "objective",
            "limit_gb",
            "margin",
            "budget_mb",
            "micro_size",
            "note",
            "loader_samples_per_s",
            "step_samples_per_s",
            "cached",
            "seconds",
            "noise_b_simple",
            "max_size",
            "max_size_by",
            "edge",
            "headroom_mb",
        )
        return {
            **{k: getattr(self, k) for k in keys},
            **self.memory,
            **self.startup,
            **self.checkpointing,
            "trials": len(self.trials),
            "batch_size": self.plan.size,
            "accum_steps": self.plan.accum_steps,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "memory": self.memory,
            "startup": self.startup,
            "plan": asdict(self.plan),
            "trials": [asdict(t) for t in self.trials],
        }

    def table(self) -> str:
        lines = [
            f"finder ({self.mode}, objective {self.objective}, limit {self.limit_gb:.2f} GB, margin "
            f"{100 * self.margin:.0f} %, budget above baseline {self.budget_mb:,.0f} MB, "
            f"{self.seconds:.1f} s{', from cache' if self.cached else ''}):",
            f"  {'size':>6}  {'result':<10}  {'peak MB':>9}  {'reserved MB':>11}  {'retries':>7}  "
            f"{'seconds':>7}  {'samples/s':>9}  fwd/bwd/opt s",
        ]
        for t in sorted(self.trials, key=lambda t: t.size):
            result = ("ok (probe)" if t.probe else "ok") if t.ok else f"OOM ({t.failed_in})"
            fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
            parts = "/".join(fmt(v, ".2f") for v in (t.forward_s, t.backward_s, t.optimizer_s))
            lines.append(
                f"  {t.size:>6}  {result:<10}  {fmt(t.peak_mb, '9,.1f')}  {fmt(t.reserved_mb, '11,.1f')}  "
                f"{fmt(t.alloc_retries, '7d')}  {t.seconds:7.2f}  {fmt(t.samples_per_s, '9,.0f')}  {parts}"
            )
        if self.memory:
            lines.append("  " + memory_line(self.memory))
            m = self.memory
            if m.get("eval_shown_by"):
                lines.append(
                    f"  evaluation ({m['eval_size']:,} samples a batch): no check needed, the trial at "
                    f"{m['eval_shown_by']:,} passed and a forward without gradients holds less"
                )
            elif m.get("eval_peak_mb") is not None:
                lines.append(
                    f"  evaluation ({m['eval_size']:,} samples a batch): checked, peak {m['eval_peak_mb']:,.1f} MB"
                )
        c = self.checkpointing
        if c.get("slowdown_per_sample"):
            lines.append(
                f"  activation checkpointing: {c['checkpointing_found']:,} fit with it, about "
                f"{c['plain_size_estimate'] or 0:,} without ({c['plain_per_sample_mb']:.3f} MB a sample without "
                f"it); {c['slowdown_per_sample']:.2f} x the seconds per sample (both at "
                f"{c['checkpointing_compared_at']:,})"
            )
        elif c:
            lines.append(
                f"  activation checkpointing: {c['checkpointing_found']:,} fit with it; without it "
                f"{c['checkpointing_compared_at']:,} did not"
            )
        if self.startup:
            lines.append(
                "  before the first trial: "
                + ", ".join(f"{k[:-2].replace('_', ' ')} {v:.1f} s" for k, v in self.startup.items())
            )
        if self.max_size is not None:
            lines.append(f"  sizes considered up to {self.max_size:,} per rank, set by {self.max_size_by}")
        lines.append(
            f"  chosen: micro-batch {self.micro_size}{self._chosen_by()} -> batch {self.plan.size} = "
            f"{self.plan.micro_size} x {self.plan.accum_steps} x {self.plan.world_size}. {self.note}".rstrip()
        )
        return "\n".join(lines)

    def _chosen_by(self) -> str:
        """What set the chosen size: the bound on the sizes considered (the data, where memory is
        far: the default run's), or the margin below the edge the trials measured."""
        if self.edge is None:
            passed = [t.size for t in self.trials if t.ok and not t.probe]
            if not passed or self.micro_size != max(1, int(max(passed) * (1 - self.margin))):
                return ""
            return f", {100 * self.margin:g} % below {max(passed):,}, the largest that passed (no edge measured)"
        if self.max_size is not None and self.micro_size >= self.max_size:
            edge = f"the trials put its edge near {self.edge:,}"
            return f", the largest {self.max_size_by} allows; memory is not met ({edge})"
        if self.micro_size == max(1, int(self.edge * (1 - self.margin))):
            kernels = f", {self.headroom_mb:,.1f} MB left for kernels" if self.headroom_mb else ""
            return f", {100 * self.margin:g} % below {self.edge:,}, where the trials put memory's edge{kernels}"
        return f" (the trials put memory's edge near {self.edge:,})"


# Optimizer state per parameter, in parameter-sized tensors: momentum (SGD, LARS), or the first
# and second moments (Adam, AdamW, LAMB).
STATE_SLOTS = {"SGD": 1, "Lars": 1, "Adam": 2, "AdamW": 2, "Lamb": 2}


def memory_breakdown(model: dict[str, Any], trials: list[Trial]) -> dict[str, Any]:
    """Where the memory goes, from what the trials measured: a fixed part (parameters,
    gradients, optimizer state, the step's other fixed costs) and a part per sample
    (activations), beside the analytic estimate from the parameter count (4 B a parameter for
    the parameters, 4 B for their gradients, 4 B per optimizer slot: SGD momentum 1, Adam 2)."""
    mib = memory.MIB
    param_mb, state_mb = model["param_bytes"] / mib, model["state_bytes"] / mib
    slots = STATE_SLOTS.get(model["optimizer"])
    if slots == 1 and not model["momentum"]:
        slots = 0
    analytic = None if slots is None else param_mb * (2 + slots)
    out = {
        "params": model["params"],
        "optimizer": model["optimizer"],
        "param_mb": param_mb,
        "analytic_bytes_per_param": None if slots is None else 4 * (2 + slots),
        "optimizer_state_mb": state_mb,
        "fixed_mb": None,
        "fixed_analytic_mb": analytic,
        "fixed_vs_analytic": None,
        "per_sample_mb": None,
        "eval_peak_mb": model.get("eval_peak_mb"),
        "eval_size": model.get("eval_size"),
        "eval_shown_by": model.get("eval_shown_by"),
        # CPU: what oneDNN's kernel cache will keep in the training process, left out of the
        # trials' room (bsexp.finder.probe.ChildProber)
        "kernel_cache_mb": None
        if "kernel_cache_train_bytes" not in model
        else (model["kernel_cache_train_bytes"] + model["kernel_cache_eval_bytes"]) / mib,
    }
    line = peak_line(trials)
    if line is not None:
        per_sample, at_zero = line
        # Above the baseline, which holds the parameters and the memory the first step left
        # behind (the optimizer's state), the line's value at no samples is what a step holds
        # whatever the batch (gradients, the optimizer's temporaries).
        fixed = param_mb + model["first_step_bytes"] / mib + at_zero
        out.update(per_sample_mb=per_sample, fixed_mb=fixed, fixed_vs_analytic=fixed / analytic if analytic else None)
    return out


def peak_line(trials: list[Trial]) -> tuple[float, float] | None:
    """MB per sample and MB at no samples of the training step's peak through forward and
    backward, on the line through the largest size that passed and the largest at most half of
    it (else the next largest): sizes far apart, so that a few MB of noise in a peak move the
    slope little (the two largest passes of a settled search lie a percent apart: the conv net's
    at 1,256 and 1,260 samples gave -0.26 MB a sample); None with fewer than two passes."""
    points = sorted(
        (a for a in (t.attempt() for t in trials) if a.ok and a.peak_bytes is not None), key=lambda a: a.size
    )
    if len(points) < 2:
        return None
    top = points[-1]
    low = next((a for a in reversed(points) if a.size <= top.size / 2), points[-2])
    per_sample, at_zero = search.peak_line([low, top])
    return per_sample / memory.MIB, at_zero / memory.MIB


def memory_line(m: dict[str, Any]) -> str:
    """One line of the trial table: measured beside analytic."""
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    analytic = (
        "no estimate for this optimizer"
        if m["fixed_analytic_mb"] is None
        else f"analytic {m['fixed_analytic_mb']:,.1f} MB from {m['params']:,} parameters x "
        f"{m['analytic_bytes_per_param']} B ({m['optimizer']})"
    )
    ratio = "" if m["fixed_vs_analytic"] is None else f", measured/analytic {m['fixed_vs_analytic']:.2f}"
    return (
        f"memory: fixed {fmt(m['fixed_mb'], ',.1f')} MB measured (params, grads, optimizer state "
        f"{m['optimizer_state_mb']:,.1f} MB, step overhead) vs {analytic}{ratio}; "
        f"per sample {fmt(m['per_sample_mb'], ',.3f')} MB (activations)"
        + (
            ""
            if m.get("kernel_cache_mb") is None
            else f"; oneDNN's kernel cache {m['kernel_cache_mb']:,.1f} MB, left out of the trials' room"
        )
    )
