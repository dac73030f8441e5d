"""The LR and weight decay a run uses, from the values stated at the reference batch, the scaling
rules and the schedule (`Rules`), and the run's layout. Pure: plain values in, plain values out.

The LR of step s is `lr × factors(s)`: warmup and the main schedule at the step's position,
counted in samples seen (so a batch that changes can neither stretch nor cut them), times the
coupling of the LR to the batch. The weight decay of each step is `Layout.weight_decays`.
"""

from __future__ import annotations

from dataclasses import dataclass

from bsexp.batch import scaling
from bsexp.batch.layout import Layout


@dataclass(frozen=True, kw_only=True)
class Rules:
    """What the config says about the LR and weight decay (`optimizer.*`, `scaling.*`, `schedule.*`)."""

    lr: float  # at ref_batch
    weight_decay: float  # at ref_batch
    ref_batch: int
    lr_rule: str = "linear"
    wd_rule: str = "sqrt"
    unit: str = "epochs"  # of warmup and milestones
    warmup: float = 0.0
    warmup_shape: str = "linear"
    start_factor: float | None = None  # None: the reference batch's LR (Goyal et al. §2.2)
    main: str = "constant"
    milestones: tuple[float, ...] = ()
    factor: float = 0.1
    final_factor: float = 0.0

    @classmethod
    def of(cls, cfg) -> Rules:
        """The rules a composed config states."""
        node = cfg.schedule
        return cls(
            lr=cfg.optimizer.lr,
            weight_decay=cfg.optimizer.weight_decay,
            ref_batch=cfg.scaling.ref_batch,
            lr_rule=str(cfg.scaling.lr_rule),
            wd_rule=str(cfg.scaling.wd_rule),
            unit=str(node.unit),
            warmup=node.warmup,
            warmup_shape=str(node.warmup_shape),
            start_factor=node.start_factor,
            main=str(node.main),
            milestones=tuple(node.milestones),
            factor=node.factor,
            final_factor=node.final_factor,
        )


def scaled(layout: Layout, rules: Rules) -> tuple[scaling.ScaledHparams, scaling.LRFactors]:
    """The LR and weight decay at the layout's base batch by the rules, and the LR's multiplier at
    every step. Lengths given in epochs or steps are the samples of the run they are counted
    against (`Layout.lr_run`)."""
    counted = layout.lr_run
    k = scaling.scale_factor(layout.base_batch, rules.ref_batch)
    lr = scaling.scaled_lr(rules.lr, k, rules.lr_rule)
    wd = scaling.scaled_weight_decay(rules.weight_decay, k, rules.wd_rule)
    if rules.unit == "steps":

        def in_samples(steps: float) -> int:
            return counted.samples_before_step(int(round(steps)))
    else:
        in_samples = counted.samples_at
    warmup = 0 if rules.warmup_shape == "none" else in_samples(rules.warmup)
    schedule = scaling.LRSchedule(
        total=counted.total_samples,
        warmup=warmup,
        warmup_shape=rules.warmup_shape,
        start_factor=scaling.warmup_start_factor(rules.start_factor, k, rules.lr_rule),
        main=rules.main,
        milestones=tuple(in_samples(m) for m in rules.milestones),
        factor=rules.factor,
        final_factor=rules.final_factor,
    )
    positions = layout.lr_samples
    factors = scaling.LRFactors(schedule, layout.lr_coupling, positions)
    peak = lr * max((factors(step) for step in range(layout.total)), default=1.0)
    warmup_steps = sum(1 for position in positions if position < warmup)
    return scaling.ScaledHparams(k, lr, peak, wd, warmup_steps, layout.total), factors
