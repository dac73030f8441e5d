"""How the batch-size finder chooses which micro-batch sizes to try: pure logic, no torch.

A search calls `attempt(size) -> Attempt` and returns the largest size that passed. It never
returns a size it did not try, never exceeds `max_size`, and stops after `max_trials`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

STRAIGHT = 0.1  # probes lie on one line: the per-sample cost between the last two within 10 % of that before
SHORT = 0.8  # of the line's way past the last probe: the furthest fit probes where the probes' slope still rises
MAX_RISE = 2.0  # fit's probe past a rising slope takes it at most twice as steep: at least half the chord's way
# Below the line's edge, where fit tries first when the cap's room is measured (CPU): the line
# through the probes misses the edge by a percent or so either way (the bench's ResNet-18: 306
# predicted, 302 fit), and a first try that passes near the edge settles it at once where the
# line through it puts the edge no further than the aim plus the tolerance beyond it (the pass
# bore the line out; a second trial near the edge, the slowest kind, would gain at most that:
# the bench's conv net at 1.2 GB, 633 then 642 against a truth of 646, 1.3 s of its 3.5 s);
# one that fails costs a second trial.
AIM = 0.015
# Trials near the edge after the first full pass there, after which fit stops settling: the line
# through that pass is right to about a percent, and each further trial gains less than one
# (issue 17: at most five trials above a quarter of the edge, the last probe's among them).
AFTER_EDGE_PASS = 3
# fit probes until the peak has grown by this much of the budget: the line is then fitted over a
# range that matters. Each probe is 4x the last, or less where the slope so far says that the
# peak reaches PROBE_AIM of the budget sooner (ResNet-18 at 2 GB: 77 instead of 128, a step of
# 1.4-2.7 s instead of 3.2-3.5 s; the line through 32 and 64 put its edge within 1 % of 32 and 128's).
GROWN = 0.25
PROBE_AIM = 0.3
# measured_edge: where the peaks give no line, memory counts as far only where the peak of the
# largest pass is at most 1/FAR of the room the cap left (the line through no samples and it).
FAR = 8


@dataclass(frozen=True)
class Attempt:
    size: int
    ok: bool
    peak_bytes: float | None = None  # memory above the baseline at the trial's peak
    samples_per_s: float | None = None
    room_bytes: float | None = None  # CPU: the address space the cap left after the trial
    mapped_bytes: float | None = None  # CPU: address space at the peak (what the cap limits), where known
    verified: bool = True  # False: a probe's (one step, to measure the peak); a pass then proves less


@dataclass
class Budget:
    """The trials a search may still run, and those it has run (by size)."""

    max_trials: int
    attempts: dict[int, Attempt]  # the latest at each size
    runs: int = 0  # a size probed, then tried in full, counts twice

    @property
    def left(self) -> int:
        return self.max_trials - self.runs


class Searcher:
    """`attempt(size)`: a full trial. `probe(size)`, where given: a cheaper one that measures the
    peak as well but proves less where it passes (one training step instead of several); fit's
    small probes use it, and a search never returns a size only a probe passed."""

    def __init__(
        self,
        attempt: Callable[[int], Attempt],
        max_trials: int,
        max_size: int,
        probe: Callable[[int], Attempt] | None = None,
    ) -> None:
        self._attempt, self._probe, self.max_size = attempt, probe or attempt, max_size
        self.budget = Budget(max_trials, {})

    def attempt(self, size: int, probe: bool = False) -> Attempt:
        """Try `size` once (a size tried before is not tried again, unless only a probe passed
        there and a full trial is asked for)."""
        size = min(size, self.max_size)
        seen = self.budget.attempts.get(size)
        if seen is None or (not probe and seen.ok and not seen.verified):
            self.budget.attempts[size] = (self._probe if probe else self._attempt)(size)
            self.budget.runs += 1
        return self.budget.attempts[size]

    def best(self, verified: bool = False) -> int | None:
        """The largest size that passed (`verified`: a full trial)."""
        passed = [a.size for a in self.budget.attempts.values() if a.ok and (a.verified or not verified)]
        return max(passed) if passed else None

    def verified_best(self, tolerance: float = 0.0) -> int | None:
        """The largest pass, tried in full where only a probe passed there (rare: the probes stay
        below a quarter of the edge); where the full trial fails, the edge is settled again."""
        while self.budget.left > 0:
            best = self.best()
            if best is None or self.budget.attempts[best].verified:
                break
            if not self.attempt(best).ok:
                self.bisect(tolerance)
        return self.best(verified=True)

    def smallest_failure(self) -> int | None:
        failed = [a.size for a in self.budget.attempts.values() if not a.ok]
        return min(failed) if failed else None

    # ------------------------------------------------------------------ strategies

    def power(self, init: int) -> int | None:
        """Double from `init` until the first failure (or max_size, which is tried itself)."""
        size = min(init, self.max_size)
        while self.budget.left > 0:
            if not self.attempt(size).ok or size >= self.max_size:
                break
            size = min(2 * size, self.max_size)
        return self.best()

    def bisect(self, tolerance: float = 0.0, until_runs: int | None = None) -> int | None:
        """Between the largest pass and the smallest failure, until they are adjacent (or within
        `tolerance` of each other, as a fraction), or `until_runs` trials have run in all."""
        while self.budget.left > 0 and (until_runs is None or self.budget.runs < until_runs):
            low, high = self.best(), self.smallest_failure()
            if low is None or high is None or high - low <= max(1, math.ceil(low * tolerance)):
                break
            self.attempt((low + high) // 2)
        return self.best()

    def binsearch(self, init: int) -> int | None:
        self.power(init)
        return self.bisect()

    def fit(self, init: int, budget_bytes: float, tolerance: float = 0.01) -> int | None:
        """Probe sizes from `init` up (x4, or less: _next_probe) until memory clearly grows, fit its peak (through
        forward and backward) as fixed + per-sample x size, try the largest size the fit allows
        under `budget_bytes` (or the room the latest trial left; where that room is measured,
        AIM below it), then settle the edge there to `tolerance`: the
        line is usually right to a percent, so the search follows the line re-fitted through
        each new pass, else steps from the side just tried in growing steps (1, 2, 4 ... x
        `tolerance`), never past the middle of the bracket, and stops three trials after the
        first full pass near the edge, or at a pass whose line leaves no measured room for a size
        `tolerance` larger (AIM more, where it aimed below the line). Where the probes' slope
        still rises, one more probe goes where the slope rising on as it rose puts the edge
        (never past SHORT of the line's edge), and the first full try to the edge of the line
        through it. Trials near the edge are the slow ones: this spends two to four of them
        where bisecting up from the last probe spends eight. The probes up to there run one
        step each (`probe`): they measure the peak, which the first step shows."""
        self._settle_fit(init, budget_bytes, tolerance)
        return self.verified_best(tolerance)

    def _settle_fit(self, init: int, budget_bytes: float, tolerance: float) -> None:
        """fit's trials, which `verified_best` then reads: the probes up the line, one more where
        their slope still rises, and the edge settled from the first full try near it."""
        large = self._fit_probes(init, budget_bytes)
        if large is None:
            return
        # The line through the two largest sizes that fit: furthest from small-size fixed costs.
        predicted = _fit(self.budget.attempts.values(), budget_bytes)
        shorted = False
        if _still_rising(self.budget.attempts.values(), large, predicted) and self.budget.left > 2:
            # The probes' slope still rises (fixed costs hid the per-sample cost at the smaller
            # ones): the chord through the last two is too shallow and its edge too far. One more
            # probe where the slope rising on puts the edge, and the line through it. (One step:
            # at a new size most of a full trial's cost, the first step mapping the new memory;
            # the bench's MLP at 0.8 GB, 2,860 probed in 0.7 s, then 3,106 in full in 1.4 s,
            # against two full trials.)
            large = self.attempt(
                _rising_edge(self.budget.attempts.values(), large, predicted, budget_bytes, self.max_size), probe=True
            )
            predicted, shorted = _fit(self.budget.attempts.values(), budget_bytes), True
        if large.ok and (predicted is None or predicted <= large.size):
            if not shorted:  # no usable fit: fall back to doubling
                self.power(2 * large.size)
                self.bisect(tolerance)
            return  # shorted: no room past the probe toward the edge, which is tried in full (verified_best)
        size, settle = self._first_edge_try(large, predicted, shorted, tolerance)
        self._settle_edge(size, settle, budget_bytes, tolerance)

    def _fit_probes(self, init: int, budget_bytes: float) -> Attempt | None:
        """fit's probes (one step each) from `init` up, x4 or less (_next_probe), until the peak
        has grown by GROWN of the budget: the last, or None where `init` failed or is max_size.

        At small sizes fixed costs (gradients, the optimizer's temporaries) hide the per-sample
        cost: grow until the peak has grown by a quarter of the budget, so that the line is
        fitted over a range that matters and extrapolated by less. But a probe beyond a quarter
        of the edge is a large trial (the slow ones): where the probes already lie on one line
        (fixed costs no longer hide the per-sample cost: an MLP's small activations sit in the
        allocator's heap until a few hundred samples) and it puts the next probe there, go to
        the edge instead."""
        small = self.attempt(init, probe=True)
        if not small.ok or small.size >= self.max_size:
            return None
        large = self.attempt(4 * init, probe=True)
        while (
            large.ok
            and large.size < self.max_size
            and self.budget.left > 2
            and (large.peak_bytes or 0) - (small.peak_bytes or 0) < GROWN * budget_bytes
        ):
            guess = _fit(self.budget.attempts.values(), budget_bytes)
            if guess is not None and 4 * large.size > guess / 4 and _straight(self.budget.attempts.values()):
                break
            large = self.attempt(_next_probe(small, large, budget_bytes), probe=True)
        return large

    def _first_edge_try(
        self, large: Attempt, predicted: int | None, shorted: bool, tolerance: float
    ) -> tuple[int, float]:
        """The first size tried in full near the edge, after the last probe `large`, and how far
        short of its line's edge a pass may settle (a fraction: `tolerance`, plus AIM where it
        aims below the line). Where `large` failed: the line's guess below it, else the middle of
        the bracket; else the line's edge `predicted` (past `large`), or short of it."""
        settle = tolerance
        if not large.ok:  # the edge lies below the last probe
            low = self.best()
            size = predicted if predicted is not None and low < predicted < large.size else (low + large.size) // 2
            return size, settle
        # After the extra probe (shorted), a few percent are left to go from it: the edge of the
        # line through it, no lower (the room a trial leaves counts all that its step keeps,
        # more than the next step's peak holds; the bench's MLP: 8.3 MB kept, 5.7 MB held).
        if not shorted and _still_rising(self.budget.attempts.values(), large, predicted):
            # Aim short of the line, where a pass steadies it (an MLP's probes at 512 and 2,048
            # put the edge 6 % beyond the 3,030 that fit).
            predicted = _short_of(large, predicted, self.max_size)
        elif not shorted and large.room_bytes is not None:  # where a pass there can settle the edge (below)
            predicted = math.floor(predicted * (1 - AIM))
            settle += AIM
        return min(max(predicted, large.size + 1), self.max_size), settle

    def _settle_edge(self, size: int, settle: float, budget_bytes: float, tolerance: float) -> None:
        """Full trials near the edge from `size` until the largest pass and the smallest failure
        lie within `tolerance` (a fraction) of each other, or a pass's line leaves no measured room
        for a size `settle` larger, or AFTER_EDGE_PASS trials have run since the first pass here;
        where the next size was tried before (or the trials run out), the bracket is bisected
        within that same count."""
        step = tolerance
        first_pass = None  # the trials run when the first full trial near the edge passed
        while self.budget.left > 0 and size not in self.budget.attempts:
            if first_pass is not None and self.budget.runs - first_pass >= AFTER_EDGE_PASS:
                return  # close enough: each further trial near the edge gains less than a percent
            passed = self.attempt(size).ok
            if passed and first_pass is None:
                first_pass = self.budget.runs
            low, high = self.best(), self.smallest_failure()
            if low is not None and high is not None and high - low <= max(1, math.ceil(low * tolerance)):
                break  # settled
            if high is None and low >= self.max_size:
                break
            guess = _fit(self.budget.attempts.values(), budget_bytes)
            if (
                passed
                and size == low
                and guess is not None
                and guess < math.ceil(low * (1 + settle))
                and self.budget.attempts[size].room_bytes is not None
            ):
                # The line through this pass leaves no room for a size a step larger (or, where
                # fit aimed below the line, one more than the aim larger), under the room the cap
                # measurably leaves (CPU): settled. Where the room is the budget's estimate
                # (CUDA), a step up shows it.
                return
            size, step = self._next_edge_try(passed, low, high, guess, step, tolerance)
        self.bisect(tolerance, until_runs=None if first_pass is None else first_pass + AFTER_EDGE_PASS)

    def _next_edge_try(
        self, passed: bool, low: int | None, high: int | None, guess: int | None, step: float, tolerance: float
    ) -> tuple[int, float]:
        """The next size near the edge, and the step after it (a fraction of the size). A new pass
        near the edge gives a better line: follow it while it points past the largest pass `low`
        (and below the smallest failure `high`); else step from the side just tried, in growing
        steps, never beyond the middle of the bracket. A failure's guess moves a step at most."""
        top = self.max_size + 1 if high is None else high
        if (
            guess is not None
            and low is not None
            and low < guess < top
            and guess not in self.budget.attempts
            and (passed or guess <= _step_below(high, step))
        ):
            return guess, tolerance
        if passed:
            return min(math.ceil(low * (1 + step)), self.max_size if high is None else (low + high) // 2), 2 * step
        size = _step_below(high, step)
        return (size if low is None else max(size, (low + high) // 2)), 2 * step


def _still_rising(attempts, large: Attempt, predicted: int | None) -> bool:
    """Whether the line's edge lies past the last probe `large` and the probes' slope still
    rises there (the last per-sample cost more than STRAIGHT above the one before)."""
    rising = _rising(attempts)
    return (
        large.ok and predicted is not None and predicted > large.size and rising is not None and rising > 1 + STRAIGHT
    )


def _rising_edge(attempts, large: Attempt, predicted: int, budget_bytes: float, max_size: int) -> int:
    """Where the edge lies if the per-sample cost past the last probe `large` rises again as it
    rose between the last two chords (the MLP's: 0.024, then 0.038, then ~0.05 MB a sample to
    its edge; a rise of 1.3-1.6), at most MAX_RISE times as steep (noisy small probes can give any
    rise: a probe just past `large` would put the next line through noise), and never past SHORT
    of the chord's edge `predicted`; at least a size past `large`."""
    edge = _fit(attempts, budget_bytes, steeper=min(_rising(attempts) or 1.0, MAX_RISE))
    short = _short_of(large, predicted, max_size)
    return short if edge is None else min(max(edge, large.size + 1), short)


def _short_of(large: Attempt, predicted: int, max_size: int) -> int:
    """SHORT of the way from `large` to the line's edge `predicted` (at least a size past it)."""
    return min(max(large.size + int(SHORT * (predicted - large.size)), large.size + 1), max_size)


def _step_below(failed: int, step: float) -> int:
    """The size a `step` below a failure, as the bracket is measured (from the pass): a pass
    there a tolerance below settles the edge. (A step of the failure's own size left the bracket
    just wider than that: the bench's MLP at 1.2 GB, 5,032 failed and 4,981 passed, 51 apart
    where 1 % of 4,981 rounds up to 50, took one more trial near the edge for 0.5 %.)"""
    return math.ceil(failed / (1 + step))


def _next_probe(small: Attempt, large: Attempt, budget_bytes: float) -> int:
    """4x the last probe `large`, or less (never under 2x): where the slope from the first probe
    `small` puts a peak PROBE_AIM of the budget above small's. That slope is at most the true
    one (fixed costs hide the per-sample cost at small sizes), so the probe reaches it."""
    size = 4 * large.size
    if small.peak_bytes is not None and large.peak_bytes is not None and large.peak_bytes > small.peak_bytes:
        size = min(size, small.size + math.ceil(PROBE_AIM * budget_bytes / _per_sample(small, large)))
    return max(size, 2 * large.size)


def _fit(attempts, budget_bytes: float, steeper: float = 1.0) -> int | None:
    """The size predicted by the line through the two largest passes whose peak was measured
    (its slope times `steeper`, through the larger), under the room the latest trial had (where
    measured) or `budget_bytes`."""
    fitted = _largest_measured(attempts, 2)
    if len(fitted) < 2:
        return None
    if all(a.mapped_bytes is not None for a in fitted):  # CPU: the quantity the cap limits
        fitted = [replace(a, peak_bytes=a.mapped_bytes) for a in fitted]
    # The room the latest trial left: what the next one will have.
    rooms = [a.room_bytes for a in attempts if a.room_bytes is not None]
    return predict_size(fitted[0], fitted[1], rooms[-1] if rooms else budget_bytes, steeper)


def _straight(attempts, tolerance: float = STRAIGHT) -> bool:
    """Whether the last three passes with a measured peak lie on one line: the per-sample cost
    between the last two within `tolerance` of that between the two before (|last - before| <=
    tolerance x last)."""
    rising = _rising(attempts)
    return rising is not None and abs(1 - 1 / rising) <= tolerance


def _rising(attempts) -> float | None:
    """The per-sample cost between the last two passes with a measured peak over that between
    the two before; None with fewer than three or a cost that is not positive."""
    points = _largest_measured(attempts, 3)
    if len(points) < 3:
        return None
    before, last = _per_sample(points[0], points[1]), _per_sample(points[1], points[2])
    return last / before if before > 0 and last > 0 else None


def peak_line(attempts) -> tuple[float, float] | None:
    """Bytes per sample and bytes at no samples of the peak, on the line through the two largest
    passes whose peak was measured; None with fewer than two."""
    points = _largest_measured(attempts, 2)
    if len(points) < 2:
        return None
    a, b = points
    per_sample = _per_sample(a, b)
    return per_sample, a.peak_bytes - per_sample * a.size


def _largest_measured(attempts, n: int) -> list[Attempt]:
    """The `n` largest passes whose peak was measured, smallest first."""
    return sorted((a for a in attempts if a.ok and a.peak_bytes is not None), key=lambda a: a.size)[-n:]


def _per_sample(a: Attempt, b: Attempt) -> float:
    """The slope of the peak between two measured sizes."""
    return (b.peak_bytes - a.peak_bytes) / (b.size - a.size)


def predict_size(a: Attempt, b: Attempt, budget_bytes: float, steeper: float = 1.0) -> int | None:
    """The largest size whose peak, on the line through two measured (size, peak) points (its
    slope times `steeper`, through `b`), stays within `budget_bytes`; None when the points give
    no positive per-sample cost."""
    if a.peak_bytes is None or b.peak_bytes is None or b.size == a.size:
        return None
    per_sample = _per_sample(a, b) * steeper
    if per_sample <= 0:
        return None
    fixed = b.peak_bytes - per_sample * b.size
    return max(1, int((budget_bytes - fixed) / per_sample))


def measured_edge(attempts, headroom_bytes: float = 0.0) -> int | None:
    """Where the memory runs out, as the trials measured it (what the margin is taken from): the
    size at which the line through the largest passes meets the room the cap left after the
    largest full pass (CPU, where the room is measured) less `headroom_bytes` (below that pass,
    where the headroom does not fit beside it), below the smallest size that failed above it.
    Where the peaks do not grow measurably (a small model at sizes the data bounds), the line
    through no samples and the largest pass, if that puts the edge FAR times beyond it (memory is
    far: a few percent on the slope cannot bring it near). None where no edge was measured (no
    room, or no line): the largest pass is all that is known."""
    attempts = list(attempts)
    passed = [a for a in attempts if a.ok and a.verified]
    if not passed:
        return None
    best = max(passed, key=lambda a: a.size)
    if best.room_bytes is None:
        return None
    room = best.room_bytes - headroom_bytes
    fitted = _largest_measured(attempts, 2)
    if all(a.mapped_bytes is not None for a in fitted):  # CPU: the quantity the cap limits
        fitted = [replace(a, peak_bytes=a.mapped_bytes) for a in fitted]
    line = predict_size(fitted[0], fitted[1], room) if len(fitted) == 2 else None
    peak = best.mapped_bytes if best.mapped_bytes is not None else best.peak_bytes
    if line is None and peak and room / peak >= FAR:
        line = int(best.size * room / peak)
    if line is None or line < best.size / 2:  # no line, or one that the pass itself belies
        return None
    failed = [a.size for a in attempts if not a.ok and a.size > best.size]
    return min(line, min(failed) - 1) if failed else line


def throughput_choice(attempts: list[Attempt], tolerance: float) -> int | None:
    """The smallest passing size within `tolerance` (a fraction) of the best samples/s measured:
    the maximum is not the optimum when a smaller batch runs as fast."""
    timed = [a for a in attempts if a.ok and a.samples_per_s]
    if not timed:
        return None
    best = max(a.samples_per_s for a in timed)
    return min(a.size for a in timed if a.samples_per_s >= (1 - tolerance) * best)


def largest_divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of n that is <= cap (1 at least)."""
    for d in range(min(n, cap), 0, -1):
        if n % d == 0:
            return d
    return 1
