"""What a batch-size sweep found, as plain data: pure (no matplotlib, no wandb, no torch, no files).

    points (one per job) -> rows (the seeds of one configuration) -> families (rows that differ
    by batch only) -> the best row, each family's breaking point, the steps each row needed to
    reach a target, each family's critical-batch fit, the gradient noise scale the runs measured.

`render` turns an `Analysis` into report.md, report.csv, figures and a W&B run; `load` reads
points from disk. Accuracies are fractions here; rendering decides the units.

The pieces compose for later tables without restructuring: a Pareto front (per arm: steps to a
target, `reach_row`, against the final accuracy, `Row.mean`) and the critical batch over training
(`critical_batch` of one family at a rising list of targets).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METRICS = ("val_acc", "test_acc")

# The default steps-to-target target: the highest accuracy that every point of the fit had
# reached by this fraction of its training samples, so that every point reaches it well before
# its end and the large batches' steps measure optimisation, not the end of their LR schedule.
TARGET_BY = 0.5
# A row "did not train" when its mean accuracy is below this fraction of the way from chance to
# 100 % (10 classes: below 19 %).
TRAINED_ABOVE = 0.1
# The default breaking-point tolerance: this many standard errors of the difference of two rows'
# means. One standard error calls a difference real about a third of the time when there is
# none; two, about one time in twenty (normal errors).
TOLERANCE_SE = 2.0
# Train accuracy this far below the best of its family: the row did not fit the training set.
UNDER_TRAINED = 0.05
# Classes of the built-in data, for the chance level when summary.json does not say.
KNOWN_CLASSES = {"mnist1d": 10, "digits": 10, "mnist": 10, "fashion_mnist": 10, "cifar10": 10, "cifar100": 100}


def _share(fraction: float) -> str:
    return {0.5: "half", 0.25: "quarter"}.get(fraction, f"{fraction:.0%}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ----------------------------------------------------------------------------- points and rows


@dataclass(frozen=True)
class Point:
    """One job of a sweep: what `load` read from its directory (or the index, where it is gone)."""

    name: str
    setting: tuple[str, ...]  # the overrides that tell it apart, the seed left out
    overrides: tuple[str, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)
    summary: Mapping[str, Any] | None = None
    records: Sequence[Mapping[str, Any]] = ()  # metrics.jsonl: one per evaluation
    status: str = "missing"  # completed, diverged, preempted, failed, missing
    error: str | None = None
    dir: Path | None = None

    @property
    def done(self) -> bool:
        return self.status == "completed" and self.summary is not None

    @property
    def batch(self) -> int | None:
        if self.summary and self.summary.get("batch_size"):
            return self.summary["batch_size"]
        return (self.config.get("batch") or {}).get("size")

    @property
    def final_samples(self) -> float | None:
        """Training samples the run took in all."""
        if self.summary and _number(self.summary.get("samples_seen")):
            return self.summary["samples_seen"]
        return self.records[-1].get("samples_seen") if self.records else None

    @property
    def num_classes(self) -> int | None:
        """From summary.json where it says, else from the config (data.num_classes, the data's name)."""
        if self.summary and isinstance(self.summary.get("num_classes"), int):
            return self.summary["num_classes"]
        data = self.config.get("data") or {}
        if isinstance(data.get("num_classes"), int):
            return data["num_classes"]
        name = (self.summary or {}).get("data") or data.get("name") or str(data.get("_target_", "")).rsplit(".", 1)[-1]
        return KNOWN_CLASSES.get(name)


@dataclass
class Row:
    """The points of one configuration: its seeds."""

    setting: tuple[str, ...]
    points: list[Point] = field(default_factory=list)

    @property
    def done(self) -> list[Point]:
        return [p for p in self.points if p.done]

    @property
    def batch(self) -> int | None:
        return next((p.batch for p in self.points if p.batch), None)

    @property
    def family(self) -> tuple[str, ...]:
        """The setting without the batch: rows of one family differ by batch only."""
        return tuple(o for o in self.setting if not o.startswith("batch.size="))

    @property
    def configuration(self) -> str:
        """The family as one string; empty when the sweep varies the batch only."""
        return ",".join(self.family)

    def values(self, key: str) -> list[float]:
        return [p.summary[key] for p in self.done if _number(p.summary.get(key))]

    def mean(self, key: str) -> float | None:
        values = self.values(key)
        return statistics.fmean(values) if values else None

    def std(self, key: str) -> float | None:
        values = self.values(key)
        return statistics.stdev(values) if len(values) > 1 else None

    def first(self, key: str) -> Any:
        return next((p.summary.get(key) for p in self.done), None)

    @property
    def chance(self) -> float | None:
        classes = next((p.num_classes for p in self.points if p.num_classes), None)
        return 1 / classes if classes else None

    def did_not_train(self, metric: str) -> bool:
        """Its mean `metric` stayed near chance (below TRAINED_ABOVE of the way to 100 %)."""
        mean, chance = self.mean(metric), self.chance
        return mean is not None and chance is not None and mean < chance + TRAINED_ABOVE * (1 - chance)

    def under_trained(self, family: Sequence[Row]) -> bool:
        """Its mean train accuracy lies UNDER_TRAINED or more below the best of its family: its gap
        is small because it did not fit the training set, not because it generalises better."""
        own = self.mean("train_acc")
        best = max((r.mean("train_acc") for r in family if r.mean("train_acc") is not None), default=None)
        return own is not None and best is not None and best - own >= UNDER_TRAINED

    @property
    def status(self) -> str:
        counts: dict[str, int] = {}
        for point in self.points:
            counts[point.status] = counts.get(point.status, 0) + 1
        return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


def common_settings(points: Sequence[Point]) -> tuple[str, ...]:
    """The overrides every point shares: said once, above the table, not in every row."""
    if not points:
        return ()
    shared = set.intersection(*(set(p.setting) for p in points))
    return tuple(o for o in points[0].setting if o in shared)


def make_rows(points: Sequence[Point]) -> list[Row]:
    """Points grouped by setting (their seeds together), sorted by family, then batch."""
    common = set(common_settings(points))
    rows: dict[tuple[str, ...], Row] = {}
    for point in points:
        setting = tuple(o for o in point.setting if o not in common)
        rows.setdefault(setting, Row(setting)).points.append(point)
    return sorted(rows.values(), key=lambda r: (r.family, r.batch or 0))


def families(rows: Sequence[Row]) -> dict[tuple[str, ...], list[Row]]:
    """Rows that differ by batch only, each family sorted by batch (rows without a batch left out)."""
    found: dict[tuple[str, ...], list[Row]] = {}
    for row in rows:
        if row.batch:
            found.setdefault(row.family, []).append(row)
    return {fam: sorted(members, key=lambda r: r.batch) for fam, members in sorted(found.items())}


@dataclass(frozen=True)
class Labels:
    """What every figure's title names: the data, the model, the epochs and the seeds."""

    data: tuple[str, ...]
    model: tuple[str, ...]
    epochs: tuple[float, ...]
    seeds: tuple[int, ...]
    seeds_per_row: tuple[int, int]  # fewest and most completed seeds of a row


def labels(rows: Sequence[Row]) -> Labels:
    done = [p for r in rows for p in r.done]

    def distinct(key, clean=lambda v: v):
        return tuple(sorted({clean(p.summary[key]) for p in done if p.summary.get(key) is not None}, key=str))

    counts = [len(r.done) for r in rows if r.done] or [0]
    return Labels(
        distinct("data"),
        distinct("model", lambda m: str(m).rsplit(".", 1)[-1]),
        distinct("epochs", float),
        distinct("seed", int),
        (min(counts), max(counts)),
    )


# ----------------------------------------------------------------------------- best and breaking point


def best_row(rows: Sequence[Row], metric: str) -> Row | None:
    """The row with the highest mean `metric` (the smaller batch on a tie)."""
    scored = [r for r in rows if r.mean(metric) is not None]
    return max(scored, key=lambda r: r.mean(metric), default=None)


def difference_se(a: Row, b: Row, metric: str) -> float | None:
    """Standard error of mean(a) - mean(b): sqrt(s_a^2/n_a + s_b^2/n_b). A row of one seed borrows
    the other row's std (equal spread assumed); None when neither has two seeds."""
    sa, sb = a.std(metric), b.std(metric)
    if sa is None and sb is None:
        return None
    sa, sb = (sa if sa is not None else sb), (sb if sb is not None else sa)
    return math.sqrt(sa**2 / len(a.values(metric)) + sb**2 / len(b.values(metric)))


@dataclass
class Breaking:
    """One family's breaking point: the first batch above its best row whose mean `metric` falls
    more than the tolerance below the best's."""

    family: tuple[str, ...]
    best: Row
    members: list[Row]  # the family's scored rows, by batch
    row: Row | None = None  # the breaking point; None: none within the swept range
    held: Row | None = None  # the largest batch below it that stayed within the tolerance
    tolerance: float | None = None  # at the breaking point (or at the largest batch, where none)
    given: bool = False  # the tolerance came from --tolerance
    refused: str | None = None  # why there is no answer

    @property
    def best_is_smallest(self) -> bool:
        return self.best is self.members[0]


def breaking_point(members: Sequence[Row], metric: str, tolerance: float | None = None) -> Breaking | None:
    """Walks up from the family's best batch; the first batch whose mean is more than the tolerance
    below the best's is the breaking point. The tolerance is `tolerance` where given, else
    TOLERANCE_SE standard errors of the difference of the two rows' means (both rows' spread).
    None for a family of fewer than two scored batches."""
    scored = [r for r in members if r.mean(metric) is not None and r.batch]
    if len({r.batch for r in scored}) < 2:
        return None
    best = max(scored, key=lambda r: r.mean(metric))
    found = Breaking(scored[0].family, best, scored, held=best, tolerance=tolerance, given=tolerance is not None)
    for row in (r for r in scored if r.batch > best.batch):
        tol = tolerance
        if tol is None:
            se = difference_se(best, row, metric)
            if se is None:
                found.refused = (
                    f"batch {best.batch} and {row.batch} ran one seed each: no spread to judge a "
                    f"difference by (run more seeds or give --tolerance)"
                )
                return found
            tol = TOLERANCE_SE * se
        found.tolerance = tol
        if best.mean(metric) - row.mean(metric) > tol:
            found.row = row
            return found
        found.held = row
    return found


# ----------------------------------------------------------------------------- steps to a target


@dataclass(frozen=True)
class Reach:
    """Where a run (or the mean of a row's seeds) first reached a target: optimizer steps and
    training samples actually taken, read from its metrics records."""

    steps: float
    samples: float
    at_first_eval: bool = False  # reached by the first evaluation: steps and samples are upper bounds

    @property
    def batch(self) -> float:
        """Samples per step actually taken (below the nominal batch where an epoch ends in a smaller step)."""
        return self.samples / self.steps


def reach(point: Point, metric: str, target: float) -> Reach | None:
    """Steps and samples at which `metric` first reached `target`, interpolated linearly between
    the evaluation below it and the first at or above it (the records' own steps and samples, so
    a smaller last step of an epoch counts as what it was); None if it never did."""
    below = None
    for record in point.records:
        value = record.get(metric)
        if not _number(value):
            continue
        if value >= target:
            if below is None:
                return Reach(record["step"], record["samples_seen"], at_first_eval=True)
            f = (target - below[metric]) / (value - below[metric])
            return Reach(
                below["step"] + f * (record["step"] - below["step"]),
                below["samples_seen"] + f * (record["samples_seen"] - below["samples_seen"]),
            )
        below = record
    return None


def reach_row(row: Row, metric: str, target: float) -> Reach | None:
    """Mean over the row's seeds; None unless every completed seed reached the target."""
    reached = [reach(p, metric, target) for p in row.done]
    if not reached or any(r is None for r in reached):
        return None
    return Reach(
        statistics.fmean(r.steps for r in reached),
        statistics.fmean(r.samples for r in reached),
        any(r.at_first_eval for r in reached),
    )


@dataclass(frozen=True)
class Target:
    value: float | None
    rule: str  # how it was chosen
    refused: str | None = None
    doubt: str | None = None  # why the value may not be what the sweep can reach (a failed seed set it)


# A seed whose early best lies this far (in the metric's units) below every other seed of its
# batch has failed, not trained more slowly: a target it sets says little about the others.
FAILED_SEED_BY = 0.1


def target_rule(metric: str) -> str:
    return f"the highest {metric} every point reached within the first {_share(TARGET_BY)} of its training samples"


def choose_target(rows: Sequence[Row], metric: str) -> Target:
    """The highest `metric` that every completed point had reached by TARGET_BY of its training
    samples: every point reaches it well before its end."""
    rule = target_rule(metric)
    reached: list[tuple[float, Point, Row]] = []
    for row in rows:
        for point in row.done:
            total = point.final_samples
            early = [
                rec[metric]
                for rec in point.records
                if _number(rec.get(metric)) and total and rec.get("samples_seen", math.inf) <= TARGET_BY * total
            ]
            if not early:
                return Target(
                    None,
                    rule,
                    f"`{point.name}` has no evaluation within the first {_share(TARGET_BY)} of "
                    f"its training samples (evaluate more often: trainer.eval_every_steps)",
                )
            reached.append((max(early), point, row))
    if not reached:
        return Target(None, rule, "no completed point has metrics records")
    value, setter, row = min(reached, key=lambda item: item[0])
    siblings = [v for v, p, r in reached if r is row and p is not setter]
    doubt = None
    if siblings and min(siblings) - value >= FAILED_SEED_BY:
        doubt = (
            f"the target was set by `{setter.name}` ({100 * value:.1f} %), far below the other seeds of batch "
            f"{row.batch} ({100 * min(siblings):.1f}-{100 * max(siblings):.1f} %): a failed seed sets it low, and "
            f"every batch reaches a low target early; give --target, or leave that seed out"
        )
    return Target(value, rule, doubt=doubt)


# ----------------------------------------------------------------------------- the critical batch


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
class Critical:
    """One family's critical batch: the steps and samples each batch needed to reach a target, and
    the fit of (S/S_min - 1)(E/E_min - 1) = 1 to them (or why there is none)."""

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


def critical_batch(members: Sequence[Row], metric: str, target: float | None = None) -> Critical:
    """The critical batch of a family of rows that differ by batch: each row's steps and samples to
    `target` (default: `choose_target`), fitted. Rows that did not train are left out, and say so."""
    family = members[0].family if members else ()
    trained, left_out = [], []
    for row in members:
        if not row.done:
            left_out.append(f"batch {row.batch}: no completed point")
        elif row.did_not_train(metric):
            left_out.append(f"batch {row.batch}: did not train")
        else:
            trained.append(row)
    chosen = Target(target, "given (--target)") if target is not None else choose_target(trained, metric)
    critical = Critical(family, chosen, left_out=left_out)
    if len({r.batch for r in trained}) < 3:
        critical.refused = (
            f"fewer than 3 batch sizes trained ({', '.join(str(r.batch) for r in trained) or 'none'}): "
            f"a fit of S_min and E_min needs at least 3"
        )
        return critical
    if chosen.value is None:
        critical.refused = chosen.refused
        return critical
    chance = next((r.chance for r in trained if r.chance is not None), None)
    if chance is not None and chosen.value < chance + TRAINED_ABOVE * (1 - chance):
        critical.refused = (
            f"the target, {metric} {100 * chosen.value:.2f} %, is at chance level "
            f"({100 * chance:.2f} %): the points "
            f"had not trained within the first {_share(TARGET_BY)} of their samples (train longer)"
        )
        return critical
    bounds = []  # reached by the first evaluation: steps and samples only bounded from above
    for row in trained:
        got = reach_row(row, metric, chosen.value)
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
    """Why steps to target that are first-evaluation bounds cannot be fitted, and the evaluation
    interval that would resolve them: a tenth of the fewest steps any of them took, so that each
    is read to about 10 % (interpolated between evaluations, to better)."""
    batches = ", ".join(str(row.batch) for row, _ in bounds)
    fewest = min(got.steps for _, got in bounds)
    every = max(1, int(fewest // 10))
    return (
        f"the steps to the target of batch{'es' if len(bounds) > 1 else ''} {batches} are upper bounds: each "
        f"reached it by its first evaluation (step {fewest:,.0f} for the earliest), so a fit would be forced by "
        f"when the runs were evaluated, not by when they got there; evaluate every {every} step"
        f"{'s' if every > 1 else ''} or fewer (trainer.eval_every_steps={every}) to resolve them"
    )


# ----------------------------------------------------------------------------- the gradient noise scale


@dataclass(frozen=True)
class NoiseScale:
    """B_simple as the runs measured it (the mean over each run, `noise_b_simple_mean`), or why absent."""

    values: tuple[float, ...] = ()
    absent: str | None = None

    @property
    def b_simple(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None


def noise_scale(points: Sequence[Point]) -> NoiseScale:
    done = [p for p in points if p.done]
    values = tuple(p.summary["noise_b_simple_mean"] for p in done if _number(p.summary.get("noise_b_simple_mean")))
    if values:
        return NoiseScale(values)
    modes = {str((p.config.get("trainer") or {}).get("noise_scale", "auto")) for p in done}
    if done and modes == {"off"}:
        return NoiseScale(absent="turned off (trainer.noise_scale=off)")
    one_gradient = all(
        (p.summary.get("accum_steps") or 1) == 1 and (p.summary.get("world_size") or 1) == 1 for p in done
    )
    if one_gradient:
        return NoiseScale(
            absent="a step of one micro-batch on one process computes one gradient, so there are no "
            "two batch sizes to compare (McCandlish et al. 2018, App. A.1)"
        )
    return NoiseScale(absent="no completed point recorded a value")


# ----------------------------------------------------------------------------- the whole sweep


@dataclass
class Analysis:
    points: list[Point]
    rows: list[Row]
    common: tuple[str, ...]
    metric: str
    labels: Labels
    best: Row | None
    breaking: list[Breaking]
    critical: list[Critical]  # one per family of more than one batch
    noise: NoiseScale
    tolerance: float | None = None  # as given

    @property
    def experiments(self) -> list[str]:
        return sorted({o.split("=", 1)[1] for p in self.points for o in p.overrides if o.startswith("experiment=")})

    @property
    def varies_configuration(self) -> bool:
        """Whether any row has a configuration besides its batch (else that column says nothing)."""
        return any(r.configuration for r in self.rows)


def analyse(
    points: Sequence[Point], metric: str = "val_acc", tolerance: float | None = None, target: float | None = None
) -> Analysis:
    points = list(points)
    rows = make_rows(points)
    groups = families(rows)
    breaking = [b for b in (breaking_point(m, metric, tolerance) for m in groups.values()) if b is not None]
    critical = [critical_batch(m, metric, target) for m in groups.values() if len({r.batch for r in m}) > 1]
    return Analysis(
        points,
        rows,
        common_settings(points),
        metric,
        labels(rows),
        best_row(rows, metric),
        breaking,
        critical,
        noise_scale(points),
        tolerance,
    )


def grid(rows: Sequence[Row], metric: str):
    """When the rows vary in exactly two settings: ((key_a, values_a), (key_b, values_b), {(a, b): mean})."""
    scored = [r for r in rows if r.mean(metric) is not None]
    settings = [dict(o.split("=", 1) for o in r.setting) for r in scored]
    keys = sorted({k for s in settings for k in s})
    varying = [k for k in keys if len({s.get(k) for s in settings}) > 1]
    if len(varying) != 2:
        return None
    a, b = varying
    values_a = sorted({s.get(a) for s in settings}, key=str)
    values_b = sorted({s.get(b) for s in settings}, key=str)
    cells = {(s.get(a), s.get(b)): r.mean(metric) for s, r in zip(settings, scored)}
    return (a, values_a), (b, values_b), cells
