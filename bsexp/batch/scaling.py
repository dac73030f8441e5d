"""The large-batch rules as pure functions (no torch), each checkable against its paper.

`optimizer.lr` and `optimizer.weight_decay` are the values tuned at `scaling.ref_batch`;
`k = batch.size / ref_batch` converts them to the values used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RULES = ("linear", "sqrt", "none")


def scale_factor(size: int, ref_batch: int) -> float:
    """k = size / ref_batch (Goyal et al. 2017 write the global batch as k·n)."""
    return size / ref_batch


def rule_multiplier(rule: str, k: float) -> float:
    """How much a value tuned at ref_batch grows when the batch grows by k."""
    if rule == "linear":  # Goyal et al. 2017 §2.1: batch × k -> LR × k
        return k
    if rule == "sqrt":  # Hoffer et al. 2017 (SGD), Malladi et al. 2022 (Adam): × √k
        return math.sqrt(k)
    if rule == "none":
        return 1.0
    raise ValueError(f"unknown scaling rule {rule!r}; valid: {', '.join(RULES)}")


MOMENTUM_RULES = ("per_sample", "inverse", "inverse_sqrt", "none")


def scaled_dropout(base: float, k: float, rule: str, cap: float) -> float:
    """A dropout rate at batch k × ref_batch: the practitioners' rule "a larger batch, more dropout"
    (dropout ∝ √batch, or ∝ batch), never above `cap` (0.5 by default: beyond it most units are
    dropped) nor below the rate tuned at ref_batch where k < 1 takes it down."""
    return min(cap, base * rule_multiplier(rule, k)) if base else 0.0


def scaled_bn_momentum(base: float, k: float, rule: str, floor: float) -> float:
    """A BatchNorm momentum at batch k × ref_batch, never below `floor` nor above 1. torch keeps
    running = (1 − m)·running + m·batch_statistic, so after s steps an old statistic keeps the
    weight (1 − m)^s (SCIENCE.md, "BatchNorm momentum and the batch"). What each rule keeps:

    - `per_sample`: m' = 1 − (1 − m)^k keeps the forgetting per sample: after the same samples
      seen an old statistic keeps the same weight as at ref_batch (0.1 → 0.344 at k = 4, 0.718 at
      k = 12), so the running statistics average over as many samples, with the same noise;
    - `none`: keeps the forgetting per step, so the statistics average over k× the samples;
    - `inverse` (m / k, the folk rule "a larger batch, slower running statistics"): keeps only
      m'·k, no property of the statistics: their forgetting is k× slower per step and k²× slower
      per sample (they average over k× the steps, each of k× the samples);
    - `inverse_sqrt` (m / √k): forgetting √k× slower per step, k^1.5× slower per sample.

    `inverse` and `inverse_sqrt` stay to reproduce the folk rule's results
    (experiment=batch_regularisers), not as rules that keep the statistics as they were."""
    if rule == "per_sample":
        return min(1.0, max(floor, 1.0 - (1.0 - base) ** k))
    divisor = {"inverse": k, "inverse_sqrt": math.sqrt(k), "none": 1.0}.get(rule)
    if divisor is None:
        raise ValueError(f"unknown momentum rule {rule!r}; valid: {', '.join(MOMENTUM_RULES)}")
    return min(1.0, max(floor, base / divisor))


def scaled_lr(base_lr: float, k: float, rule: str) -> float:
    return base_lr * rule_multiplier(rule, k)


def scaled_weight_decay(base_wd: float, k: float, rule: str) -> float:
    """Weight decay at batch k × ref_batch.

    `sqrt` (λ × √k, the default) is Loshchilov & Hutter's normalised weight decay (2019, "Decoupled
    Weight Decay Regularization", App. B.1: λ = λ_norm·√(b/(B·T)) for batch b, B training samples,
    T epochs), which keeps λ_norm fixed when only the batch changes. What it does to the decay
    per epoch depends on the LR rule: SGD's update shrinks weights by η·λ a step, N/B steps an
    epoch, so the per-epoch decay η·λ·N/B (the inverse of the timescale B/(η·λ·N)) is
      - unchanged under the sqrt LR rule (η × √k, λ × √k, B × k);
      - × √k under the linear LR rule (η × k, λ × √k, B × k): weights decay faster per epoch at
        larger batches. `wd_rule=none` keeps it fixed under the linear LR rule (Goyal et al.'s
        recipe leaves λ unchanged).
    """
    return base_wd * rule_multiplier(rule, k)


@dataclass(frozen=True, kw_only=True)
class LRSchedule:
    """Multiplier of the scaled LR at a position of the run: warmup, then the main schedule.

    Positions and lengths are in one unit, whatever the caller counts in; bsexp counts samples
    seen, so that a change of batch can neither stretch nor cut the warmup or the decay.
    `start_factor` is the warmup's first multiplier (Goyal et al. §2.2 ramp from the reference
    batch's LR: base LR / scaled LR).
    """

    total: int
    warmup: int = 0
    warmup_shape: str = "linear"  # linear | constant | none
    start_factor: float = 1.0
    main: str = "constant"  # cosine | step | constant
    milestones: tuple[int, ...] = ()  # positions at which `step` multiplies by `factor`
    factor: float = 0.1
    final_factor: float = 0.0  # cosine ends at final_factor × the peak

    def __call__(self, position: float) -> float:
        if self.warmup_shape != "none" and position < self.warmup:
            if self.warmup_shape == "constant":  # low LR, then a jump (Goyal's ablation)
                return self.start_factor
            return self.start_factor + (1.0 - self.start_factor) * position / self.warmup
        if self.main == "cosine":
            begin = self.warmup if self.warmup_shape != "none" else 0
            span = max(1, self.total - begin)
            progress = min(1.0, (position - begin) / span)
            cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
            return self.final_factor + (1.0 - self.final_factor) * cosine
        if self.main == "step":
            return self.factor ** sum(position >= m for m in self.milestones)
        return 1.0


def warmup_start_factor(start_factor: float | None, k: float, rule: str) -> float:
    """None means Goyal et al.'s choice (§2.2): begin at the LR the reference batch would use,
    base LR / scaled LR = 1 / rule_multiplier(rule, k) (1/k under the linear rule, 1/√k under
    sqrt, 1 under none), never above the target."""
    if start_factor is None:
        return min(1.0, 1.0 / rule_multiplier(rule, k))
    return start_factor


def lr_coupling(sizes: tuple[int, ...], ref_batch: int, rule: str, couple: bool, ramp_steps: int) -> list[float]:
    """Per step, the LR multiplier that makes the LR follow the batch through the scaling rule,
    relative to the first step's batch; a change is ramped over `ramp_steps` steps."""
    if not sizes or not couple:
        return [1.0] * len(sizes)
    base = rule_multiplier(rule, sizes[0] / ref_batch)
    target = [rule_multiplier(rule, s / ref_batch) / base for s in sizes]
    factors, previous, changed_at = [], target[0], 0
    for step, value in enumerate(target):
        if step and sizes[step] != sizes[step - 1]:
            previous, changed_at = factors[-1], step
        if ramp_steps and step - changed_at < ramp_steps and value != previous:
            value = previous + (value - previous) * (step - changed_at + 1) / ramp_steps
        factors.append(value)
    return factors


@dataclass(frozen=True)
class ScaledHparams:
    k: float  # batch.size / scaling.ref_batch, at the first step
    lr: float  # the target LR at the first step's batch, reached when warmup ends
    lr_peak: float  # the highest LR applied within the run (below lr if warmup never ends)
    weight_decay: float
    warmup_steps: int
    total_steps: int


@dataclass(frozen=True)
class LRFactors:
    """The multiplier of the first step's LR at each step: warmup and main schedule at the
    step's position (`positions[step]`, samples seen before it; the step itself without them),
    times the coupling of the LR to a scheduled batch (1 when the batch is constant)."""

    schedule: LRSchedule
    coupling: tuple[float, ...] = ()
    positions: tuple[int, ...] = ()

    def __call__(self, step: int) -> float:
        couple = self.coupling[min(step, len(self.coupling) - 1)] if self.coupling else 1.0
        if self.positions:
            position = self.positions[step] if step < len(self.positions) else self.schedule.total
        else:
            position = step
        return self.schedule(position) * couple


FEW_STEPS = 8  # optimizer steps an epoch below which a batch is called large for its data
LARGEST_VERIFIED_K = 32  # Goyal et al. 2017 trained up to 8k = 32 x 256 with no loss of accuracy
STALE_STATISTICS = 0.05  # the weight BatchNorm's running statistics may keep on their initial values


def _stale_statistics(momentum: float | None, total_steps: int) -> list[tuple[str, str]]:
    """The running statistics evaluation normalises with, still near their initial values at the
    run's end: each step keeps 1 - momentum of them."""
    if momentum is None or (1 - momentum) ** total_steps <= STALE_STATISTICS:
        return []
    what = (
        f"BatchNorm's momentum {momentum:.3g} leaves its running statistics "
        f"{100 * (1 - momentum) ** total_steps:.0f} % of their initial values after the run's "
        f"{total_steps} steps: evaluation normalises with stale statistics (at chance, measured: "
        f"docs/results/experiments.md#the-regularisers-a-batch-size-moves); raise scaling.bn_momentum_min "
        f"(its floor) or train longer"
    )
    return [("scaling.bn_momentum_rule", what)]


def cautions(
    lr_multiplier: float,
    warmup_shape: str,
    warmup_steps: int,
    total_steps: int,
    steps_per_epoch: int,
    peak_fraction: float = 1.0,
    moved_bn_momentum: float | None = None,
) -> list[tuple[str, str]]:
    """(key, what) for each way the run's set-up is likely to train badly: a batch that leaves
    few steps an epoch, an LR scaled past what the warmup can carry (or past what Goyal et al.
    verified), a warmup that takes the whole run, a BatchNorm momentum a rule slowed too far
    (`moved_bn_momentum`: the momentum a rule gave, None where no rule moved it)."""
    found = _stale_statistics(moved_bn_momentum, total_steps)
    if steps_per_epoch < FEW_STEPS:
        found.append(
            (
                "batch.size",
                f"the batch leaves {steps_per_epoch} optimizer step(s) an epoch (fewer than "
                f"{FEW_STEPS}): few updates, and a batch near the training set's size is far "
                f"above the useful (critical) batch",
            )
        )
    if lr_multiplier > LARGEST_VERIFIED_K:
        found.append(
            (
                "scaling.lr_rule",
                f"the LR is scaled x{lr_multiplier:.3g}, beyond the largest factor Goyal et "
                f"al. trained without loss (x{LARGEST_VERIFIED_K})",
            )
        )
    if warmup_shape == "linear" and lr_multiplier > 1 and warmup_steps < lr_multiplier - 1:
        found.append(
            (
                "schedule.warmup",
                f"a warmup of {warmup_steps} step(s) raises the LR x{lr_multiplier:.3g}, "
                f"more than the reference LR in each step; lengthen it",
            )
        )
    if warmup_shape != "none" and warmup_steps and warmup_steps >= total_steps:
        peak = f"; the LR peaks at {100 * peak_fraction:.0f} % of its target" if peak_fraction < 1 - 1e-9 else ""
        found.append(
            (
                "schedule.warmup",
                f"the warmup ({warmup_steps} steps) takes the whole run ({total_steps} "
                f"steps): the LR never follows schedule.main{peak}; shorten the warmup "
                f"or train longer",
            )
        )
    return found
