"""A comparison as plain data (pure: no files, no plotting): each arm's best, chosen on the tuning
seeds; then, on the held-out seeds only, every arm against the best tuned fixed batch at every rung
(steps and samples ratios with paired-bootstrap intervals and the verdicts they give), the final
value's difference against the declared margin, and the fixed batches' steps-samples frontier S(E)
at each rung with S_min, E_min, B_crit and the regions' boundaries, bootstrapped over the seeds.

A verdict at a rung needs the arm and the baseline each to reach it on comparison.min_reached of
the held-out seeds (0.8: 8 of 10), and at least MIN_PAIRS seeds on which both did; the ratio is
then over those seeds. Where fewer reach, the table says how many and gives no verdict: a ratio
over the lucky seeds of an arm that mostly fails would flatter it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bsexp.report.analysis.fit import Fit, fit_steps_samples
from bsexp.report.compare.intervals import (
    MIN_PAIRS,
    Interval,
    mean_difference,
    non_inferiority,
    over_seeds,
    ratio_of_means,
    ratio_verdict,
)
from bsexp.report.compare.load import Run, mean
from bsexp.report.compare.plan import HELD_OUT, Plan
from bsexp.report.compare.selection import Candidate, baseline_at, best_of, candidates, edges
from bsexp.report.steps.analysis import REGION
from bsexp.runs.ladder import decayed


@dataclass
class Versus:
    """One arm against the baseline at one rung, on the held-out seeds."""

    arm: str
    rung: str
    baseline: str | None
    seeds: int  # held-out seeds the arm ran (finished)
    reached: int
    base_reached: int = 0
    pairs: int = 0  # seeds both reached the rung on
    steps: float | None = None  # the arm's mean over the seeds it reached the rung on
    samples: float | None = None
    steps_ratio: Interval | None = None
    samples_ratio: Interval | None = None
    why_none: str | None = None  # why no verdict
    decayed: int = 0  # seeds that reached the rung with the LR below half its peak
    batches: tuple[int, int] | None = None  # the smallest and largest batch the seeds reached the rung at
    changed: int = 0  # seeds whose batch then was not the one they started at

    def verdict(self, ratio: Interval | None) -> str:
        return ratio_verdict(ratio) if ratio is not None else "-"


@dataclass
class Final:
    arm: str
    seeds: int
    mean: float | None
    difference: Interval | None = None  # the arm's less the baseline's, in the direction of better
    verdict: str = "-"
    why_none: str | None = None


@dataclass
class Frontier:
    """The fixed batches at one rung: (arm, batch, mean steps, mean samples, seeds reached), the fit
    through them and its intervals over the seeds."""

    rung: str
    points: list[tuple[str, int, float, float, int]] = field(default_factory=list)
    fit: Fit | None = None
    intervals: dict[str, Interval | None] = field(default_factory=dict)
    refused_share: float = 0.0


@dataclass
class Comparison:
    plan: Plan
    configs: dict[str, list[Candidate]]
    best: dict[str, Candidate]
    edges: dict[str, dict[str, str]]
    baselines: dict[str, str | None]  # rung -> the best tuned fixed batch there
    versus: list[Versus]
    finals: list[Final]
    frontiers: list[Frontier]
    held_out: dict[str, list[Run]]  # arm -> its finished held-out runs
    context: int | None = None  # a language model's tokens per sample: the tables say the tokens too
    against: str | None = None  # an arm named after the runs as every rung's baseline (post hoc), else None


def held_out_runs(plan: Plan, runs: Sequence[Run]) -> dict[str, list[Run]]:
    return {arm: [r for r in runs if r.stage == HELD_OUT and r.arm == arm and r.finished] for arm in plan.arms}


def analyse(
    plan: Plan, runs: Sequence[Run], centres: dict[str, dict[str, float]], against: str | None = None
) -> Comparison:
    """The comparison as declared; with `against`, every arm against that arm at every rung and in the
    final value instead of the baseline the tuning seeds chose — a reading chosen after seeing the
    held-out runs (post hoc), not the protocol's verdict."""
    if against is not None and against not in plan.arms:
        raise ValueError(f"--against={against}: not an arm of comparison {plan.name}; its arms: {', '.join(plan.arms)}")
    configs = candidates(plan, runs, centres)
    best = {arm: c for arm, cs in configs.items() if (c := best_of(plan, cs)) is not None}
    held = held_out_runs(plan, runs)
    baselines = {rung: against or baseline_at(plan, best, rung) for rung in plan.rungs}
    versus = [_versus(plan, arm, rung, baselines[rung], held) for rung in plan.rungs for arm in plan.arms]
    base = baselines.get(format(plan.select_rung, "g"))
    return Comparison(
        plan=plan,
        configs=configs,
        best=best,
        edges={arm: edges(plan, arm, c.values) for arm, c in best.items()},
        baselines=baselines,
        versus=versus,
        finals=[_final(plan, arm, base, held) for arm in plan.arms],
        frontiers=[frontier(plan, rung, held) for rung in plan.rungs],
        held_out=held,
        context=next((r.context for r in runs if r.context), None),
        against=against,
    )


def _by_seed(runs: Sequence[Run], rung: str, measure: str) -> dict[int, float]:
    return {r.seed: r.reaches[rung][measure] for r in runs if rung in r.reaches}


def _batches_at(runs: Sequence[Run], rung: str) -> tuple[tuple[int, int] | None, int]:
    """The range of the batch the runs reached `rung` at, and how many had changed it from their
    first: an adaptive or scheduled arm that reached it at its start batch was, up to the rung, a
    fixed batch with its own tuning."""
    at = [(r.batch, r.reaches[rung].get("batch")) for r in runs if rung in r.reaches]
    known = [b for _, b in at if b is not None]
    changed = sum(1 for start, b in at if start is not None and b is not None and b != start)
    return ((min(known), max(known)) if known else None), changed


def _versus(plan: Plan, arm: str, rung: str, baseline: str | None, held: dict[str, list[Run]]) -> Versus:
    own = held[arm]
    steps, samples = _by_seed(own, rung, "step"), _by_seed(own, rung, "samples")
    row = Versus(arm, rung, baseline, len(own), len(steps), steps=mean([*steps.values()]))
    row.samples = mean([*samples.values()])
    row.decayed = sum(decayed(r.reaches[rung]) for r in own if rung in r.reaches)
    row.batches, row.changed = _batches_at(own, rung)
    if baseline is None:
        row.why_none = "no fixed batch reached this rung on every tuning seed"
        return row
    base = held[baseline]
    base_steps, base_samples = _by_seed(base, rung, "step"), _by_seed(base, rung, "samples")
    row.base_reached, pairs = len(base_steps), sorted(set(steps) & set(base_steps))
    row.pairs = len(pairs)
    need = plan.seeds_needed
    if arm == baseline:
        row.why_none = "the baseline"
    elif row.reached < need or row.base_reached < need or row.pairs < MIN_PAIRS:
        row.why_none = (
            f"too few seeds reach it (the arm {row.reached}, the baseline {row.base_reached} of "
            f"{len(plan.held_out_seeds)}; a verdict needs {need} each and {MIN_PAIRS} in common)"
        )
    else:
        row.steps_ratio = ratio_of_means([steps[s] for s in pairs], [base_steps[s] for s in pairs])
        row.samples_ratio = ratio_of_means([samples[s] for s in pairs], [base_samples[s] for s in pairs])
    return row


def _final(plan: Plan, arm: str, baseline: str | None, held: dict[str, list[Run]]) -> Final:
    finals = {r.seed: r.final for r in held[arm] if r.final is not None}
    row = Final(arm, len(finals), mean([*finals.values()]))
    if baseline is None or arm == baseline:
        row.why_none = "the baseline" if arm == baseline else "no baseline"
        return row
    base = {r.seed: r.final for r in held[baseline] if r.final is not None}
    pairs = sorted(set(finals) & set(base))
    if len(pairs) < MIN_PAIRS:
        row.why_none = f"{len(pairs)} seeds with both final values (at least {MIN_PAIRS})"
        return row
    sign = 1.0 if plan.ladder.higher else -1.0  # in the direction of better
    row.difference = mean_difference([sign * finals[s] for s in pairs], [sign * base[s] for s in pairs])
    row.verdict = non_inferiority(row.difference, float(plan.comparison["margin"]))
    return row


FIT_NAMES = ("S_min", "E_min", "B_crit", "perfect scaling up to", "maximal data parallelism from")


def frontier(plan: Plan, rung: str, held: dict[str, list[Run]]) -> Frontier:
    """The fixed batches' steps and samples to `rung` on the held-out seeds, the fit of
    (S/S_min - 1)(E/E_min - 1) = 1 through their means, and a bootstrap over the seeds of its
    S_min, E_min, B_crit and the regions' boundaries (REGION x B_crit, B_crit / REGION)."""
    found = Frontier(rung)
    found.points, stacked = reaches_at(plan, rung, held)
    if not found.points:
        return found

    def statistic(drawn) -> list[float]:
        fit = fit_of_seeds(stacked, drawn)
        if fit is None:
            return [math.nan] * len(FIT_NAMES)
        return [fit.s_min, fit.e_min, fit.b_crit, REGION * fit.b_crit, fit.b_crit / REGION]

    found.fit = fit_steps_samples([p[2] for p in found.points], [p[3] for p in found.points])
    found.intervals, found.refused_share = over_seeds(len(plan.held_out_seeds), statistic, FIT_NAMES)
    return found


def reaches_at(plan: Plan, rung: str, held: dict[str, list[Run]]) -> tuple[list, np.ndarray]:
    """The fixed batches that reached `rung` on comparison.min_reached of the held-out seeds: their
    points (arm, batch, mean steps, mean samples, seeds reached) and (arms, seeds, 2) of the steps
    and samples to it, NaN where a seed did not reach it."""
    seeds, need = plan.held_out_seeds, plan.seeds_needed
    points, table = [], []
    for arm in plan.baselines:
        by_seed = {r.seed: r for r in held[arm]}
        rows = [by_seed[s].reaches.get(rung) if s in by_seed else None for s in seeds]
        if sum(r is not None for r in rows) < max(need, 1):
            continue
        table.append(np.array([[r["step"], r["samples"]] if r else [np.nan, np.nan] for r in rows]))
        batch = next((r.batch for r in held[arm] if r.batch), 0)
        points.append((arm, batch, *np.nanmean(table[-1], axis=0), int(np.sum(~np.isnan(table[-1][:, 0])))))
    return points, np.stack(table) if table else np.empty((0, len(seeds), 2))


def fit_of_seeds(stacked: np.ndarray, drawn) -> Fit | None:
    """The fit through the batches' mean steps and samples over the drawn seeds (`reaches_at`'s
    table; a batch no drawn seed reached is left out); None where it is refused."""
    with warnings.catch_warnings():  # an arm no drawn seed reached: NaN, left out below
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean(stacked[:, np.asarray(drawn, dtype=int), :], axis=1)
    kept = means[~np.isnan(means).any(axis=1)]
    fit = fit_steps_samples(kept[:, 0].tolist(), kept[:, 1].tolist())
    return None if fit.refused else fit
