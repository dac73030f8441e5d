"""Each arm's best configuration, chosen on the tuning seeds by the comparison's declared objective,
and the baseline at each rung: the best tuned fixed batch, chosen on the same tuning seeds (never on
the held-out seeds it is then held against). Pure: the runs come in read (bsexp.report.compare.load).

A configuration is one trial of an arm (of the search, or of the refinement around its best), run
on every tuning seed. Ranked by the objective: with `steps` (`samples`), those that reached
comparison.select_rung on every tuning seed first, by their mean steps (samples) to it; then those
that reached it on fewer seeds, by how many, then by the best value they reached. With `final`, by
the mean final value at the budget. Ties go to the earlier trial (the search before the refinement).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bsexp.report.compare.load import Run, mean
from bsexp.report.compare.plan import REFINE, SEARCH, Plan
from bsexp.runs.search_space import refined_values, trial_values

MEASURE = {"steps": "step", "samples": "samples"}  # what a reach counts, by objective


@dataclass
class Candidate:
    """One configuration of an arm: a trial and its runs on the tuning seeds."""

    arm: str
    stage: str
    trial: int
    values: dict[str, float | int]
    runs: list[Run] = field(default_factory=list)

    def measures(self, rung: str, measure: str) -> list[float | None]:
        """Per tuning seed: its steps (or samples) to `rung`, None where it did not reach it."""
        return [r.reaches[rung][measure] if rung in r.reaches else None for r in self.runs]

    def objective(self, plan: Plan) -> float | None:
        """The objective on the tuning seeds: mean steps (samples) to the selection rung where every
        seed reached it, or the mean final value; None where it cannot be said."""
        if plan.objective == "final":
            finals = [r.final for r in self.runs]
            return None if not finals or None in finals else mean(finals)
        got = self.measures(_key(plan.select_rung), MEASURE[plan.objective])
        return None if not got or None in got else mean(got)

    def rank(self, plan: Plan) -> tuple:
        """The sort key: the best configuration first."""
        order = (0 if self.stage == SEARCH else 1, self.trial)
        sign = 1 if plan.ladder.higher else -1
        value = self.objective(plan)
        if value is not None:
            return (0, -sign * value if plan.objective == "final" else value, *order)
        reached = sum(m is not None for m in self.measures(_key(plan.select_rung), "step"))
        bests = [r.best for r in self.runs if r.best is not None]
        return (1, -reached, -sign * (mean(bests) if bests else -sign * float("inf")), *order)

    @property
    def name(self) -> str:
        return f"{self.stage} trial {self.trial}"


def _key(rung: float) -> str:
    return format(rung, "g")


def candidates(plan: Plan, runs: Sequence[Run], centres: dict[str, dict[str, float]]) -> dict[str, list[Candidate]]:
    """Each tuned arm's configurations, from its search and refinement runs on the tuning seeds,
    with the values each trial drew (computed as the runs' resolver drew them)."""
    seed = int(plan.comparison["search_seed"])
    factor, width = plan.comparison["refine_factor"], plan.comparison["refine_width"]
    found: dict[str, dict[tuple[str, int], Candidate]] = {arm: {} for arm in plan.tuned}
    for run in runs:
        if run.stage not in (SEARCH, REFINE) or run.arm not in found or run.trial is None:
            continue
        key = (run.stage, int(run.trial))
        if key not in found[run.arm]:
            dims = plan.space(run.arm)
            if run.stage == SEARCH:
                values = trial_values(dims, key[1], seed)
            else:
                values = refined_values(dims, centres.get(run.arm, {}), key[1], seed, factor, width)
            found[run.arm][key] = Candidate(run.arm, run.stage, key[1], values)
        found[run.arm][key].runs.append(run)
    return {arm: sorted(c.values(), key=lambda c: (c.stage != SEARCH, c.trial)) for arm, c in found.items()}


def best_of(plan: Plan, configs: Sequence[Candidate]) -> Candidate | None:
    return min(configs, key=lambda c: c.rank(plan), default=None)


def best_entry(plan: Plan, best: Candidate) -> dict[str, Any]:
    """best.json's (and search_best.json's) entry of an arm: its best configuration's values (the
    held-out reruns' overrides, the refinement's centre) and what chose it."""
    rung = _key(plan.select_rung)
    reached = sum(m is not None for m in best.measures(rung, "step"))
    return {
        "stage": best.stage,
        "trial": best.trial,
        "values": best.values,
        "objective": plan.objective,
        "value": best.objective(plan),
        "reached": f"{reached}/{len(best.runs)}",
        "runs": [r.name for r in best.runs],
    }


def edges(plan: Plan, arm: str, values: dict[str, float | int]) -> dict[str, str]:
    """The searched keys whose best lies on the edge of the space (within EDGE of an end, on its
    scale): the best may lie outside it, and the space should be widened."""
    found = {}
    for dim in plan.space(arm):
        where = dim.edge(values[dim.key]) if dim.key in values else None
        if where:
            found[dim.key] = where
    return found


def baseline_at(plan: Plan, best: dict[str, Candidate], rung: str) -> str | None:
    """The best tuned fixed batch at `rung`, on the tuning seeds: of the baseline arms whose best
    configuration reached it on every tuning seed, the fewest mean steps (samples, by the
    objective) to it; with objective `final`, the best final value (the same at every rung)."""
    chosen = [best[a] for a in plan.baselines if a in best]
    if plan.objective == "final":
        scored = [(c.rank(plan), c.arm) for c in chosen if c.objective(plan) is not None]
        return min(scored)[1] if scored else None
    measure = MEASURE[plan.objective]
    scored = []
    for c in chosen:
        got = c.measures(rung, measure)
        if got and None not in got:
            scored.append((mean(got), plan.baselines.index(c.arm), c.arm))
    return min(scored)[2] if scored else None
