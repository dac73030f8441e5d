"""Whether the seeds tell the best row apart from the others: Welch's two-sample t-test of the
best row's seeds against each other row's (pure).

The best row is the one with the best mean (the highest accuracy, the lowest loss); it is starred
only where that mean is better than every other row's by more than its seeds' spread explains:
Welch's t-test (unequal variances), two sided, at 5 %. With 3 seeds a row the test has little
power: two rows 1 standard deviation apart are seldom told apart, and the report then says which
batches it cannot separate rather than star one of them on the seeds' noise (two runs of one sweep
starred 256, then 32, with rows closer than their spread). A row of one seed borrows the other's
spread; two rows of one seed each have none to test by, and are never told apart."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from bsexp.report.analysis.breaking import best_row
from bsexp.report.analysis.points import Row

# The test's level: a difference the seeds would show this often or less were there none counts as real.
SIGNIFICANCE = 0.05


@dataclass(frozen=True)
class Apart:
    """One row against the best: the two-sided p-value of Welch's test (None: each has one seed)."""

    row: Row
    p: float | None = None

    @property
    def told(self) -> bool:
        return self.p is not None and self.p < SIGNIFICANCE


@dataclass(frozen=True)
class Separation:
    best: Row | None  # the best mean: the highest, or the lowest for a loss
    against: list[Apart] = field(default_factory=list)  # every other scored row, by mean, the best first

    @property
    def separated(self) -> bool:
        """The seeds tell the best apart from every other row (and there is another row to tell it from)."""
        return self.best is not None and bool(self.against) and all(a.told for a in self.against)

    @property
    def tied(self) -> list[Apart]:
        """The rows the seeds cannot tell apart from the best."""
        return [a for a in self.against if not a.told]


def welch_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value of Welch's t-test of mean(a) = mean(b). A side of one value borrows the
    other's spread (equal spread assumed, as the breaking point's tolerance does: a t-test of the
    one value against the other side's mean, n - 1 degrees of freedom); None where neither side
    has two. Sides without spread (every seed equal) differ surely where their means differ."""
    if len(a) < 2 and len(b) < 2:
        return None
    if len(a) < 2 or len(b) < 2:
        many = a if len(a) > 1 else b
        spread = statistics.variance(many)
        va, vb, df = spread / len(a), spread / len(b), len(many) - 1
    else:
        va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
        df = None
    diff = statistics.fmean(a) - statistics.fmean(b)
    if va + vb == 0:
        return 1.0 if diff == 0 else 0.0
    if df is None:  # Welch-Satterthwaite
        df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return student_t_two_sided(diff / math.sqrt(va + vb), df)


def student_t_two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom: the regularised incomplete beta
    function I_x(df/2, 1/2) at x = df / (df + t²) (Abramowitz & Stegun 26.7.1)."""
    return _incomplete_beta(df / (df + t * t), df / 2, 0.5)


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), by its continued fraction (Numerical Recipes' betacf, modified Lentz), taken on
    the side where it converges fast (x below (a + 1) / (a + b + 2), else 1 - I_{1-x}(b, a))."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _incomplete_beta(1 - x, b, a)
    tiny = 1e-300  # keeps a denominator off zero

    def guarded(v: float) -> float:
        return v if abs(v) > tiny else tiny

    c, d = 1.0, 1.0 / guarded(1.0 - (a + b) * x / (a + 1))
    h = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 / guarded(1.0 + numerator * d)
            c = guarded(1.0 + numerator / c)
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    return math.exp(log_front) * h / a


def separate(rows: Sequence[Row], metric: str, higher: bool = True) -> Separation:
    """The best row by mean `metric` (the highest, or the lowest where `higher` is false), tested
    against every other row that has one."""
    best = best_row(rows, metric, higher)
    if best is None:
        return Separation(None)
    sign = -1 if higher else 1  # the best first
    others = sorted(
        (r for r in rows if r is not best and r.mean(metric) is not None), key=lambda r: sign * r.mean(metric)
    )
    against = []
    for row in others:
        against.append(Apart(row, welch_p(best.values(metric), row.values(metric))))
    return Separation(best, against)
