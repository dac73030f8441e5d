"""Intervals over held-out seeds, and the verdicts read from them (scipy.stats.bootstrap: no
resampler of bsexp's own).

- A ratio between two arms (steps, samples to a rung): the ratio of their means over the seeds
  both reached the rung on, by a paired bootstrap (the seeds resampled together: seed s of the arm
  with seed s of the baseline), BCa, 95 %. Verdict from that interval alone: "fewer" where its upper
  end is below 1, "more" where its lower end is above 1, else "not distinguished" — never from two
  intervals overlapping.
- The final value's difference (the arm's mean less the baseline's, paired by seed, in the
  direction of better): "non-inferior" where the interval's lower end is above -margin, "inferior"
  where its upper end is below -margin, else "not shown".
- Quantities of a fit over seeds (S_min, E_min, B_crit of the fixed batches' frontier): a plain
  bootstrap of the seeds (percentile), resamples where the fit is refused left out and counted.

Every interval is drawn with one fixed generator (RNG_SEED), so a report of the same runs is the
same report. At 10 seeds the bootstrap's 95 % intervals cover about 91 % (their known small-sample
shortfall; tests/unit/test_compare_intervals.py measures it): a verdict on an interval's edge is
weaker than it reads.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 9999
FIT_RESAMPLES = 2000  # each a fit of the frontier: fewer than the ratios'
RNG_SEED = 0
MIN_PAIRS = 3  # below 3 seeds a bootstrap interval says nothing


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float

    def text(self, fmt: str = "{:.2f}") -> str:
        return f"{fmt.format(self.estimate)} [{fmt.format(self.low)}, {fmt.format(self.high)}]"


def _bootstrap(data: tuple, statistic: Callable, **options):
    from scipy.stats import bootstrap

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a degenerate sample: handled below, not a warning to the reader
        return bootstrap(
            data,
            statistic,
            confidence_level=CONFIDENCE,
            rng=np.random.default_rng(RNG_SEED),
            **options,
        )


def _paired(arm: Sequence[float], base: Sequence[float], statistic: Callable, resamples: int = RESAMPLES) -> Interval:
    a, b = np.asarray(arm, dtype=float), np.asarray(base, dtype=float)
    estimate = float(statistic(a, b, axis=-1))
    if len(a) < MIN_PAIRS:
        raise ValueError(f"a paired interval needs at least {MIN_PAIRS} seeds, got {len(a)}")
    for method in ("BCa", "percentile"):  # BCa is undefined where every resample agrees
        ci = _bootstrap((a, b), statistic, paired=True, vectorized=True, n_resamples=resamples, method=method)
        low, high = float(ci.confidence_interval.low), float(ci.confidence_interval.high)
        if math.isfinite(low) and math.isfinite(high):
            return Interval(estimate, low, high)
    return Interval(estimate, estimate, estimate)  # no spread at all: every pair the same


def _ratio(x, y, axis=-1):
    return np.mean(x, axis=axis) / np.mean(y, axis=axis)


def _difference(x, y, axis=-1):
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def ratio_of_means(arm: Sequence[float], base: Sequence[float], resamples: int = RESAMPLES) -> Interval:
    """mean(arm) / mean(base) over paired seeds, with its paired bootstrap interval."""
    return _paired(arm, base, _ratio, resamples)


def mean_difference(arm: Sequence[float], base: Sequence[float]) -> Interval:
    """mean(arm) - mean(base) over paired seeds, with its paired bootstrap interval."""
    return _paired(arm, base, _difference)


def ratio_verdict(ratio: Interval) -> str:
    if ratio.high < 1:
        return "fewer"
    return "more" if ratio.low > 1 else "not distinguished"


def non_inferiority(difference: Interval, margin: float) -> str:
    """`difference`: the arm's final value less the baseline's, in the direction of better."""
    if difference.low > -margin:
        return "non-inferior"
    return "inferior" if difference.high < -margin else "not shown"


def over_seeds(seeds: int, statistic: Callable[[np.ndarray], Sequence[float]], names: Sequence[str]):
    """A plain bootstrap over `seeds` seeds of a statistic of the seeds drawn (their indices, with
    replacement): {name: Interval} (None where it cannot be said) and the share of resamples where
    the statistic was undefined (a refused fit: NaN)."""
    every = np.arange(seeds)
    estimate = np.asarray(statistic(every), dtype=float)
    if seeds < MIN_PAIRS:
        return {name: None for name in names}, 1.0
    res = _bootstrap((every,), statistic, vectorized=False, n_resamples=FIT_RESAMPLES, method="percentile")
    draws = np.atleast_2d(res.bootstrap_distribution)
    out, refused = {}, float(np.mean(np.isnan(draws).any(axis=0)))
    tail = 100 * (1 - CONFIDENCE) / 2
    for i, name in enumerate(names):
        kept = draws[i][~np.isnan(draws[i])]
        if not math.isfinite(estimate[i]) or len(kept) < 2:
            out[name] = None
            continue
        low, high = np.percentile(kept, [tail, 100 - tail])
        out[name] = Interval(float(estimate[i]), float(low), float(high))
    return out, refused
