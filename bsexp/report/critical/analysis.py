"""The critical batch measured by branches (Merrill et al. 2025), as plain data: pure (no
matplotlib, no files). Not the critical batch fitted to steps to a target (McCandlish et al.
2018): that is `bsexp.report.analysis`'s `StepsCritical`, which this module fits to a fixed-batch
sweep beside it (`add_b_crit`).

    branches (one per seed, branch point and batch) -> stages (one per branch point: its critical
    batch, per seed, by ε and by branch length) -> B_simple over the trunks' window and B_crit
    fitted to a fixed-batch sweep, beside it.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bsexp.config.schema import LOWER_IS_BETTER
from bsexp.report.analysis.fit import fit_steps_samples
from bsexp.report.analysis.points import Point
from bsexp.report.analysis.to_target import reach

EPSILON = 0.05  # relative: within 5 % of the small-batch branch's loss
SEEDS = "seeds"  # ε from the trunk seeds' spread at each branch point (seed_epsilon)
DRAWS = 2000  # the bootstrap's resamplings of the trunk seeds
EPSILONS = (0.01, 0.02, 0.05, 0.1)  # the sensitivity table's
METRIC = "val_loss"
LENGTHS = (0.25, 0.5, 1.0)  # the branch-length table's: the loss a quarter, half and all the way along


@dataclass(frozen=True)
class BranchedCritical:
    """The critical batch from branch losses (Merrill et al.), and whether it is a bound: `=` (a
    larger batch branched fell out of ε), `>=` (every batch branched stayed within ε), `<=` (the
    next batch up already fell out); `none` where the smallest batch's branch itself did not get ε
    below the loss it started from (too short a branch to tell the batches apart)."""

    batch: int | None
    bound: str = "="

    def __str__(self) -> str:
        if self.bound == "none":
            return "no progress"
        if self.batch is None:
            return "-"
        return f"{'' if self.bound == '=' else ('≥ ' if self.bound == '>=' else '≤ ')}{self.batch:,}"


def branched_critical_batch(
    losses: Mapping[int, float | None], epsilon: float = EPSILON, start: float | None = None
) -> BranchedCritical:
    """The largest batch B such that every batch from the smallest up to B has a loss at most
    (1 + epsilon) x the smallest batch's (Merrill et al. 2025's rule, with a relative tolerance).
    A diverged branch has loss inf (out of any tolerance); a batch with no result (None: failed or
    not run) ends the search there, so the answer is a lower bound.
    `start`: the loss at the branch point; if the smallest batch did not get below (1 - epsilon)
    x it, the branches are too short to say anything (BranchedCritical(None, "none"))."""
    batches = sorted(losses)
    known = lambda b: losses[b] is not None and not math.isnan(losses[b])  # noqa: E731
    if not batches or not known(batches[0]) or not math.isfinite(losses[batches[0]]):
        return BranchedCritical(None)  # no reference: the smallest batch's branch did not finish
    if start is not None and losses[batches[0]] > start * (1 - epsilon):
        return BranchedCritical(None, "none")
    limit = losses[batches[0]] * (1 + epsilon)
    found = batches[0]
    for batch in batches[1:]:
        if not known(batch):  # not run or failed: at least what was reached so far
            return BranchedCritical(found, ">=")
        if losses[batch] > limit:
            return BranchedCritical(found, "<=" if found == batches[0] else "=")
        found = batch
    return BranchedCritical(found, ">=" if len(batches) > 1 else "=")


def at_samples(records: Sequence[Mapping[str, Any]], samples: float, metric: str = METRIC) -> float | None:
    """`metric` at `samples` seen, linear between the evaluations around it (exact at one)."""
    points = sorted(
        (r["samples_seen"], r[metric])
        for r in records
        if isinstance(r.get(metric), (int, float)) and r.get("samples_seen") is not None
    )
    for (s0, v0), (s1, v1) in zip(points, points[1:]):
        if s0 <= samples <= s1:
            return v0 if s1 == s0 else v0 + (v1 - v0) * (samples - s0) / (s1 - s0)
    return points[-1][1] if points and points[-1][0] == samples else None


@dataclass(kw_only=True)
class Branch:
    seed: int
    at: int  # samples seen where it branched
    batch: int
    length: int  # branch.samples
    trunk: str
    status: str
    records: list[dict[str, Any]] = field(default_factory=list)
    context: int | None = None  # a language model's tokens per sequence (a sample); None: not one
    lr: float | None = None  # its LR (summary.json's `lr`): which of an LR sweep's branches it is

    def loss(self, fraction: float = 1.0, window: float = 0.0) -> float | None:
        """The validation loss `fraction` of the way along; inf for a branch that diverged. With a
        `window` (a fraction of the branch's length): the median of its evaluations over that last
        stretch up to there, which a spike of a single evaluation does not move."""
        if self.status == "diverged":
            return math.inf
        if self.status != "completed":
            return None
        end = self.at + fraction * self.length
        if window > 0:
            inside = [
                r[METRIC]
                for r in self.records
                if isinstance(r.get(METRIC), (int, float))
                and end - window * self.length <= r.get("samples_seen", -1) <= end
            ]
            if inside:
                return statistics.median(inside)
        return at_samples(self.records, end)

    def start_loss(self) -> float | None:
        return at_samples(self.records, self.at)


@dataclass
class Stage:
    """One trunk checkpoint: its branches' critical batch, and the estimates beside it."""

    at: int  # requested mark (branch.at_samples is the checkpoint's samples seen)
    length: int
    losses: dict[int, list[float]]  # batch -> the seeds' final losses
    critical: BranchedCritical
    per_seed: list[BranchedCritical]
    by_epsilon: dict[float, BranchedCritical]
    by_length: dict[float, BranchedCritical]
    b_simple: float | None = None
    b_simple_note: str = ""
    target: float | None = None  # the trunk's `target_metric` at at + length (for B_crit)
    target_metric: str = "val_acc"  # what B_crit's steps are counted to: an accuracy, or a loss reached below
    b_crit: float | None = None
    b_crit_note: str = ""
    epsilon: float = EPSILON  # the ε this stage's critical batch was read with
    interval: tuple[int | None, int | None] = (None, None)  # 95 % over the trunk seeds resampled

    def ratio(self, value: float | None) -> float | None:
        if value is None or self.critical.batch is None:
            return None
        return value / self.critical.batch

    def shown_ratio(self, value: float | None) -> str:
        """The ratio, a bound where the critical batch is one (over an upper bound: at least)."""
        ratio = self.ratio(value)
        if ratio is None:
            return "-"
        return {"=": "", "<=": "≥ ", ">=": "≤ "}[self.critical.bound] + f"{ratio:,.2f}"


def mean_of(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def best_lrs(branches: Sequence[Branch], window: float = 0.0) -> tuple[list[Branch], dict[tuple[int, int], float]]:
    """Where a batch was branched from a point at several LRs (a sweep around its tuned LR), the
    branches at the LR whose branches end with the lowest mean loss over the seeds (a seed's that
    did not finish makes it inf; `window`: as `Branch.loss`), and that LR by (branch point, batch).
    Chosen on the seeds it is then read on, as Merrill et al. choose each batch's LR."""
    groups: dict[tuple[int, int, float | None], list[Branch]] = defaultdict(list)
    for b in branches:
        groups[(b.at, b.batch, b.lr)].append(b)
    best: dict[tuple[int, int], tuple[float, float | None]] = {}
    for (at, batch, lr), group in sorted(groups.items(), key=lambda item: (item[0][0], item[0][1], item[0][2] or 0)):
        losses = [b.loss(1.0, window) for b in group]
        mean = math.inf if any(v is None for v in losses) else statistics.fmean(losses)
        if (at, batch) not in best or mean < best[(at, batch)][0]:
            best[(at, batch)] = (mean, lr)
    chosen = {key: lr for key, (_, lr) in best.items()}
    return [b for b in branches if b.lr == chosen[(b.at, b.batch)]], chosen


def seed_epsilon(losses: Mapping[int, float | None]) -> float | None:
    """ε from the trunk seeds' spread: the relative standard deviation, over the seeds, of the
    smallest batch's branch loss (`losses`: seed -> that loss) — how far apart two seeds' own
    continuations end, so a batch whose mean loss ends within it of the smallest batch's is not
    told apart from it by the seeds. None with fewer than two finite losses."""
    values = [v for v in losses.values() if v is not None and math.isfinite(v)]
    if len(values) < 2:
        return None
    return statistics.stdev(values) / statistics.fmean(values)


def bootstrap_interval(
    per_seed: Mapping[int, Mapping[int, float | None]],
    epsilon: float,
    start: Mapping[int, float | None],
    draws: int = DRAWS,
    seed: int = 0,
) -> tuple[int | None, int | None]:
    """The 95 % interval of the critical batch over the trunk seeds drawn with replacement
    (`per_seed`: seed -> batch -> final loss; `start`: seed -> the loss at the branch point): the
    2.5th and 97.5th percentiles of the critical batches of the draws' mean losses (a draw with no
    answer counts as the smallest batch, its lowest)."""
    seeds = sorted(per_seed)
    if len(seeds) < 2:
        return None, None
    rng = random.Random(seed)
    batches = sorted({b for losses in per_seed.values() for b in losses})
    found = []
    for _ in range(draws):
        drawn = [rng.choice(seeds) for _ in seeds]
        means: dict[int, float | None] = {}
        for batch in batches:
            values = [per_seed[s].get(batch) for s in drawn]
            means[batch] = None if any(v is None for v in values) else statistics.fmean(values)
        starts = [start[s] for s in drawn if start.get(s) is not None]
        critical = branched_critical_batch(means, epsilon, statistics.fmean(starts) if starts else None)
        found.append(critical.batch or batches[0])
    found.sort()
    return found[int(0.025 * (draws - 1))], found[int(math.ceil(0.975 * (draws - 1)))]


def stages(branches: Sequence[Branch], epsilon: float | str = EPSILON, window: float = 0.0) -> list[Stage]:
    """The branch points' critical batches: at ε, or (`epsilon="seeds"`) at each point's own ε from
    the trunk seeds' spread (`seed_epsilon`, EPSILON where fewer than two seeds); each branch's loss
    the median over the last `window` of its length (0: at its end, `Branch.loss`)."""
    by_at: dict[int, list[Branch]] = defaultdict(list)
    for b in branches:
        by_at[b.at].append(b)
    out = []
    for at in sorted(by_at):
        group = by_at[at]
        length = group[0].length

        def mean_losses(fraction: float, group=group) -> dict[int, float | None]:
            per_batch: dict[int, list[float | None]] = defaultdict(list)
            for b in group:
                per_batch[b.batch].append(b.loss(fraction, window))
            # a batch counts only where every seed's branch finished
            return {
                batch: (None if any(v is None for v in vs) else statistics.fmean(vs)) for batch, vs in per_batch.items()
            }

        final = mean_losses(1.0)
        seeds = sorted({b.seed for b in group})
        starts = {
            s: next((b.start_loss() for b in group if b.seed == s and b.start_loss() is not None), None) for s in seeds
        }
        start = mean_of(list(starts.values()))
        per_seed_losses = {s: {b.batch: b.loss(1.0, window) for b in group if b.seed == s} for s in seeds}
        smallest = min(b.batch for b in group)
        eps = epsilon
        if epsilon == SEEDS:
            eps = seed_epsilon({s: per_seed_losses[s].get(smallest) for s in seeds})
            eps = EPSILON if eps is None else eps
        per_seed = [branched_critical_batch(per_seed_losses[s], eps, starts[s]) for s in seeds]
        losses: dict[int, list[float]] = defaultdict(list)
        for by_batch in per_seed_losses.values():
            for batch, value in by_batch.items():
                if value is not None:
                    losses[batch].append(value)
        out.append(
            Stage(
                at=at,
                length=length,
                losses=dict(sorted(losses.items())),
                critical=branched_critical_batch(final, eps, start),
                per_seed=per_seed,
                by_epsilon={e: branched_critical_batch(final, e, start) for e in EPSILONS},
                by_length={f: branched_critical_batch(mean_losses(f), eps, start) for f in LENGTHS},
                epsilon=eps,
                interval=bootstrap_interval(per_seed_losses, eps, starts),
            )
        )
    return out


def window_b_simple(records: Sequence[Mapping[str, Any]], start: float, stop: float) -> tuple[float | None, str]:
    """B_simple over the records within [start, stop] samples seen: the mean of tr(Σ) over the
    mean of |G|² (each averaged apart, as bsexp's estimator does), from the raw estimates each
    record holds since the one before (`noise/*_raw`; else the moving averages). None, and why,
    where |G|² averages to 0 or below: the gradient's signal is then too small for the trunk's
    batch to resolve against its noise, so B_simple is far above that batch."""
    inside = [r for r in records if start <= r.get("samples_seen", -1) <= stop]
    for grad_key, trace_key in (("noise/grad_sq_raw", "noise/trace_sigma_raw"), ("noise/grad_sq", "noise/trace_sigma")):
        pairs = [
            (r[grad_key], r[trace_key])
            for r in inside
            if isinstance(r.get(grad_key), (int, float)) and isinstance(r.get(trace_key), (int, float))
        ]
        if pairs:
            grad, trace = statistics.fmean(g for g, _ in pairs), statistics.fmean(t for _, t in pairs)
            if grad <= 0:
                return None, f"|G|² averages {grad:.3g} (not positive) over the window: unresolved at this batch"
            return trace / grad, ""
    return None, "no noise measurements in the window (run the trunk with trainer.noise_scale=always)"


def add_trunk(found: list[Stage], trunks: Mapping[int, Sequence[Mapping[str, Any]]], metric: str = "val_acc") -> None:
    """B_simple over each branch's window on the trunks (mean over the seeds that resolve it), and
    the trunks' `metric` at its end (B_crit's target: val_acc, or a loss such as a language
    model's val_loss). `trunks`: each seed's trunk records (`load.trunk_records`)."""
    for stage in found:
        estimates = [window_b_simple(recs, stage.at, stage.at + stage.length) for recs in trunks.values()]
        stage.b_simple = mean_of([value for value, _ in estimates])
        resolved = sum(value is not None for value, _ in estimates)
        if resolved < len(estimates):
            why = next(note for value, note in estimates if value is None)
            stage.b_simple_note = f"{len(estimates) - resolved} of {len(estimates)} trunk(s): {why}"
        stage.target = mean_of([at_samples(recs, stage.at + stage.length, metric) for recs in trunks.values()])
        stage.target_metric = metric


def add_b_crit(found: list[Stage], points: Sequence[Point]) -> None:
    """B_crit for each stage's target from the points of a sweep of fixed batches (report.analysis
    Points; each batch at its best LR)."""
    points = [p for p in points if p.done and p.batch]
    by_batch: dict[int, dict[Any, list]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        by_batch[p.batch][(p.config.get("optimizer") or {}).get("lr")].append(p)
    for stage in found:
        if stage.target is None:
            stage.b_crit_note = f"no trunk {stage.target_metric} at the branch's end"
            continue
        higher = stage.target_metric not in LOWER_IS_BETTER
        steps, samples = [], []
        for _batch, by_lr in sorted(by_batch.items()):
            best = None
            for seeds in by_lr.values():
                reached = [reach(p, stage.target_metric, stage.target, higher) for p in seeds]
                if reached and all(r is not None for r in reached):
                    mean = (statistics.fmean(r.steps for r in reached), statistics.fmean(r.samples for r in reached))
                    best = mean if best is None or mean[0] < best[0] else best
            if best is not None:
                steps.append(best[0])
                samples.append(best[1])
        fit = fit_steps_samples(steps, samples)
        stage.b_crit = fit.b_crit
        stage.b_crit_note = fit.refused or f"{len(steps)} batches reached it"
