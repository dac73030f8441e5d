"""The points every search of bsexp draws (steps to result's, bsexp.runs.quasi_random; a comparison's,
bsexp.runs.search_space): a scrambled Sobol sequence (scipy.stats.qmc), each point fixed by its
number and the seed alone, so a search stopped half-way continues with the same points."""

from __future__ import annotations

import functools
import math


@functools.cache
def sobol(points: int, dimensions: int, seed: int) -> tuple[tuple[float, ...], ...]:
    """The first `points` points of a scrambled Sobol sequence in [0, 1)^dimensions (a power of
    two of them drawn, as the sequence's balance holds for those)."""
    from scipy.stats import qmc

    m = max(0, math.ceil(math.log2(max(points, 1))))
    drawn = qmc.Sobol(d=dimensions, scramble=True, seed=seed).random_base2(m)
    return tuple(tuple(float(v) for v in row) for row in drawn[:points])
