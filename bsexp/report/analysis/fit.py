"""The critical batch fitted to steps to a target (McCandlish et al. 2018): (S/S_min - 1)(E/E_min
- 1) = 1 fitted to the steps S and samples E each batch of a family took to reach one target,
B_crit = E_min / S_min; and what any batch schedule could gain over a fixed batch in that model
(pure). Not the critical batch measured by branches (Merrill et al. 2025): that is
`bsexp.report.critical`'s `BranchedCritical`."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from bsexp.report.analysis.points import TRAINED_ABOVE, Row
from bsexp.report.analysis.to_target import TARGET_BY, Reach, Target, choose_target, reach_row, share

# What the report advises where steps to the target are first-evaluation bounds: evaluations at
# steps this fraction apart (trainer.eval_growth), each step to a target then read to about 5 %.
EVAL_GROWTH = 0.05


@dataclass(frozen=True)
class Fit:
    """(S/S_min - 1)(E/E_min - 1) = 1 fitted to steps S and samples E; B_crit = E_min / S_min."""

    s_min: float | None = None
    e_min: float | None = None
    rms: float | None = None  # root mean square of the relative residuals of S
    refused: str | None = None

    @property
    def b_crit(self) -> float | None:
        return None if self.refused else self.e_min / self.s_min


def fit_steps_samples(steps: Sequence[float], samples: Sequence[float], min_batches: int = 3) -> Fit:
    """McCandlish et al. 2018: (S/S_min - 1)(E/E_min - 1) = 1 is, with B = E / S the samples per
    step actually taken, S = S_min + E_min / B: a straight line in 1/B. Least squares on the
    relative residual of S (weights 1/S^2: steps vary over orders of magnitude across batches).
    Refused for fewer than `min_batches` distinct batches (two parameters from two points fit
    exactly and say nothing) or a degenerate fit (S_min or E_min not positive)."""
    points = [(s, e) for s, e in zip(steps, samples) if s > 0 and e > 0]
    inverse = [s / e for s, e in points]  # 1 / B
    distinct = len({round(x, 12) for x in inverse})
    if distinct < min_batches:
        return Fit(
            refused=f"fewer than {min_batches} batch sizes ({distinct}): a fit of S_min and E_min needs at "
            f"least {min_batches}"
        )
    w = [1 / s**2 for s, _ in points]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, inverse))
    sxx = sum(wi * x * x for wi, x in zip(w, inverse))
    sy = sum(wi * s for wi, (s, _) in zip(w, points))
    sxy = sum(wi * x * s for wi, x, (s, _) in zip(w, inverse, points))
    det = sw * sxx - sx * sx
    s_min, e_min = (sxx * sy - sx * sxy) / det, (sw * sxy - sx * sy) / det
    if s_min <= 0:
        return Fit(
            s_min,
            e_min,
            refused=f"S_min = {s_min:,.1f} steps is not positive: steps fell as fast as 1/batch "
            f"(or faster) all the way, so B_crit lies above the largest batch swept",
        )
    if e_min <= 0:
        return Fit(
            s_min,
            e_min,
            refused=f"E_min = {e_min:,.0f} samples is not positive: steps did not fall as the "
            f"batch grew, so B_crit lies below the smallest batch swept",
        )
    rms = math.sqrt(statistics.fmean(((s_min + e_min * x - s) / s) ** 2 for x, (s, _) in zip(inverse, points)))
    return Fit(s_min, e_min, rms)


def fit_critical_batch(batches: Sequence[float], steps: Sequence[float]) -> tuple[float, float, float] | None:
    """(S_min, E_min, B_crit) from steps at batches of samples actually taken per step (E = B S);
    None where `fit_steps_samples` refuses."""
    fit = fit_steps_samples(steps, [b * s for b, s in zip(batches, steps)])
    return None if fit.refused else (fit.s_min, fit.e_min, fit.b_crit)


@dataclass(frozen=True)
class ScheduleBound:
    """What any batch schedule could gain over a fixed batch at the same samples, in McCandlish et
    al.'s model, from (S_min, E_min) fitted at a rising ladder of targets (`schedule_bound`)."""

    s_min: float
    e_min: float
    ratio: float  # r: a schedule's least steps above S_min over a fixed batch's, at equal samples

    def steps(self, samples: float) -> tuple[float, float] | None:
        """(a fixed batch's steps, the best schedule's steps) to the last target with `samples`
        samples in all; None at or below E_min, which no batch reaches the target with."""
        if samples <= self.e_min:
            return None
        excess = self.s_min * self.e_min / (samples - self.e_min)  # a fixed batch's steps above S_min
        return self.s_min + excess, self.s_min + self.ratio * excess


def schedule_bound(ladder: Sequence[tuple[float, float]]) -> ScheduleBound | None:
    """In McCandlish et al.'s model (2018, section 2; their appendix D varies the batch in it) a step
    at batch B makes 1 / (1 + B_noise/B) of a noiseless step's progress, B_noise depending on the
    progress p made so far. A schedule B(p) then takes S = ∫(1 + B_noise/B) dp steps and E =
    ∫(B + B_noise) dp samples, with S_min = ∫dp and E_min = ∫B_noise dp. At a given E the fewest
    steps are at B ∝ √B_noise (a Lagrange condition), where (S - S_min)(E - E_min) =
    (∫√B_noise dp)²; every fixed batch has S_min E_min there, and so does B = c B_noise (it is no
    better than the fixed batch c E_min/S_min). So at equal samples the least steps above S_min any
    schedule needs are r = (∫√B_noise dp)² / (S_min E_min) <= 1 (Cauchy-Schwarz) times a fixed
    batch's: r = 1 when B_noise is constant.

    `ladder`: (S_min, E_min) fitted to the fixed batches at rising targets, the last the target of
    interest. Between two rungs B_noise ≈ ΔE_min / ΔS_min, so ∫√B_noise dp ≈ Σ √(ΔS_min ΔE_min).
    Fitted rungs make r an estimate, not a bound: on each stretch √(ΔS ΔE) is at least ∫√B_noise
    (Cauchy-Schwarz), so coarse rungs overstate r, while a rung below an earlier one (the fits'
    noise) adds nothing, which lowers it."""
    if not ladder:
        return None
    root, s_top, e_top = 0.0, 0.0, 0.0
    for s, e in ladder:
        root += math.sqrt(max(s - s_top, 0.0) * max(e - e_top, 0.0))
        s_top, e_top = max(s_top, s), max(e_top, e)
    s_min, e_min = ladder[-1]
    if s_min <= 0 or e_min <= 0:
        return None
    return ScheduleBound(s_min, e_min, min(root**2 / (s_min * e_min), 1.0))


@dataclass
class StepsCritical:
    """One family's critical batch from steps to a target (McCandlish et al.): the steps and samples
    each batch needed to reach a target, and the fit of (S/S_min - 1)(E/E_min - 1) = 1 to them (or
    why there is none)."""

    family: tuple[str, ...]
    target: Target
    reached: list[tuple[Row, Reach]] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # rows not in the fit, and why
    fit: Fit | None = None
    refused: str | None = None

    @property
    def b_crit(self) -> float | None:
        return self.fit.b_crit if self.fit is not None else None

    @property
    def batches(self) -> list[int]:
        return [row.batch for row, _ in self.reached]


def steps_critical_batch(
    members: Sequence[Row], metric: str, target: float | None = None, higher: bool = True
) -> StepsCritical:
    """The critical batch of a family of rows that differ by batch: each row's steps and samples to
    `target` (default: `choose_target`), fitted; a target accuracy is reached at or above it, a
    target loss (`higher` false) at or below it. Rows that did not train are left out, and say so."""
    family = members[0].family if members else ()
    trained, left_out = [], []
    for row in members:
        if not row.done:
            left_out.append(f"batch {row.batch}: no completed point")
        elif row.did_not_train(metric, higher):
            left_out.append(f"batch {row.batch}: did not train")
        else:
            trained.append(row)
    chosen = Target(target, "given (--target)") if target is not None else choose_target(trained, metric, higher)
    critical = StepsCritical(family, chosen, left_out=left_out)
    if len({r.batch for r in trained}) < 3:
        critical.refused = (
            f"fewer than 3 batch sizes trained ({', '.join(str(r.batch) for r in trained) or 'none'}): "
            f"a fit of S_min and E_min needs at least 3"
        )
        return critical
    if chosen.value is None:
        critical.refused = chosen.refused
        return critical
    chance = next((r.chance for r in trained if r.chance is not None), None) if higher else None  # an accuracy's
    if chance is not None and chosen.value < chance + TRAINED_ABOVE * (1 - chance):
        critical.refused = (
            f"the target, {metric} {100 * chosen.value:.2f} %, is at chance level "
            f"({100 * chance:.2f} %): the points "
            f"had not trained within the first {share(TARGET_BY)} of their samples (train longer)"
        )
        return critical
    bounds = []  # reached by the first evaluation: steps and samples only bounded from above
    for row in trained:
        got = reach_row(row, metric, chosen.value, higher)
        if got is None:
            critical.left_out.append(f"batch {row.batch}: a seed never reached the target")
        elif got.at_first_eval:
            bounds.append((row, got))
            critical.left_out.append(
                f"batch {row.batch}: reached the target by its first evaluation (step "
                f"{got.steps:,.0f}), so its steps to target are only an upper bound"
            )
        else:
            critical.reached.append((row, got))
    if bounds and len({row.batch for row, _ in critical.reached}) < 3:
        critical.refused = first_evaluation_bounds(bounds)
        return critical
    critical.fit = fit_steps_samples([r.steps for _, r in critical.reached], [r.samples for _, r in critical.reached])
    critical.refused = critical.fit.refused
    return critical


def first_evaluation_bounds(bounds: Sequence[tuple[Row, Reach]]) -> str:
    """Why steps to target that are first-evaluation bounds cannot be fitted, and what resolves
    them: evaluations at steps EVAL_GROWTH apart from the first (trainer.eval_growth), which read
    steps to any target to about that fraction at a cost that grows with the log of the steps (an
    interval fixed at a tenth of the fewest steps is "every 1 step" for a batch that gets there in
    a few: every step for the small batches' thousands); where the target came by the first step,
    only a target reached later does."""
    batches = ", ".join(str(row.batch) for row, _ in bounds)
    fewest = min(got.steps for _, got in bounds)
    head = (
        f"the steps to the target of batch{'es' if len(bounds) > 1 else ''} {batches} are upper bounds: each "
        f"reached it by its first evaluation (step {fewest:,.0f} for the earliest), so a fit would be forced by "
        f"when the runs were evaluated, not by when they got there; "
    )
    if fewest <= 1:
        return head + "name a target they reach later (--target)"
    return head + (
        f"evaluate at steps {100 * EVAL_GROWTH:g} % apart from the first (trainer.eval_growth={EVAL_GROWTH:g}) to "
        f"resolve them, or name a target they reach later (--target)"
    )
