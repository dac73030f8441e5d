"""The best row and each family's breaking point: the first batch above the best whose mean
accuracy falls more than a tolerance below the best's, or whose mean loss rises more than it above
(pure). `higher`: the metric is better higher (an accuracy) or lower (a loss); the caller says
which (`bsexp.runs.ladder.Ladder(metric).higher`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bsexp.report.analysis.points import Row

# The default breaking-point tolerance: this many standard errors of the difference of two rows'
# means. One standard error calls a difference real about a third of the time when there is
# none; two, about one time in twenty (normal errors).
TOLERANCE_SE = 2.0


def best_row(rows: Sequence[Row], metric: str, higher: bool = True) -> Row | None:
    """The row with the best mean `metric`: the highest, or the lowest where `higher` is false (the
    smaller batch on a tie)."""
    scored = [r for r in rows if r.mean(metric) is not None]
    return (max if higher else min)(scored, key=lambda r: r.mean(metric), default=None)


def worse_by(best: Row, row: Row, metric: str, higher: bool = True) -> float:
    """How far `row`'s mean `metric` lies on the worse side of `best`'s (in the metric's units):
    below it for an accuracy, above it for a loss."""
    gap = best.mean(metric) - row.mean(metric)
    return gap if higher else -gap


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
    """One family's breaking point: the first batch above its best row whose mean `metric` lies
    more than the tolerance on the worse side of the best's (`worse_by`)."""

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


def breaking_point(
    members: Sequence[Row], metric: str, tolerance: float | None = None, higher: bool = True
) -> Breaking | None:
    """Walks up from the family's best batch; the first batch whose mean is worse than the best's
    by more than the tolerance (below it for an accuracy, above it for a loss) is the breaking
    point. The tolerance is `tolerance` where given (in the metric's units), else TOLERANCE_SE
    standard errors of the difference of the two rows' means (both rows' spread). None for a
    family of fewer than two scored batches."""
    scored = [r for r in members if r.mean(metric) is not None and r.batch]
    if len({r.batch for r in scored}) < 2:
        return None
    best = best_row(scored, metric, higher)
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
        if worse_by(best, row, metric, higher) > tol:
            found.row = row
            return found
        found.held = row
    return found
