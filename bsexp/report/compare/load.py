"""Reading a comparison's runs from disk (DIR/search/<arm>, DIR/refine/<arm>, DIR/held_out/<arm>):
each run's rungs, final value and status, read from its own metrics records up to the budget."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bsexp.report.analysis.points import Point, is_number
from bsexp.report.compare.plan import HELD_OUT, REFINE, SEARCH, SEARCH_BEST, Plan
from bsexp.report.load import load_points
from bsexp.system.io import Unreadable, read_json_object

STAGES = (SEARCH, REFINE, HELD_OUT)
FINISHED = ("completed", "diverged")  # a run that says what its trial gave (a diverged one: the worst)


@dataclass(frozen=True)
class Run:
    """One run of a comparison: a trial (search or refinement) on a tuning seed, or an arm's best on
    a held-out seed. `reaches`: rung -> where it first reached it (bsexp.runs.ladder), within the
    budget; `final`: the metric at the budget (capped at the top rung where runs end there);
    `best`: the best value it reached within the budget."""

    arm: str
    stage: str
    trial: int | None
    seed: int
    status: str
    name: str
    dir: Path | None = None
    batch: int | None = None  # its first batch (summary.json's batch_size)
    reaches: dict[str, dict[str, Any]] = field(default_factory=dict)
    final: float | None = None
    best: float | None = None
    past_budget: bool = False  # it trained past the budget (AdaScale's advanced schedule): read at the budget
    context: int | None = None  # a language model's tokens per sample (summary.json's `context`)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


def read_run(point: Point, plan: Plan, arm: str, stage: str) -> Run:
    """A sweep point as a comparison's run: its rungs and final value from its metrics records
    (the budget: `epochs` of samples; records past it left out)."""
    tune = (point.config or {}).get("tune") or {}
    summary = point.summary or {}
    seed = summary.get("seed", (point.config or {}).get("seed"))
    within = [r for r in point.records if r.get("epoch", 0) <= plan.epochs + 1e-9]
    values = [r[plan.ladder_metric] for r in within if is_number(r.get(plan.ladder_metric))]
    finished = point.status in FINISHED
    pick = max if plan.ladder.higher else min
    return Run(
        arm=arm,
        stage=stage,
        trial=tune.get("trial"),
        seed=int(seed) if seed is not None else -1,
        status=point.status,
        name=point.name,
        dir=point.dir,
        batch=summary.get("batch_size") or point.batch,
        reaches=plan.ladder.read(point.records, until_epoch=plan.epochs) if finished else {},
        final=plan.capped(values[-1]) if finished and values else None,
        best=pick(values) if finished and values else None,
        past_budget=len(within) < len(point.records),
        context=summary.get("context"),
    )


def load_runs(tune_dir: Path, plan: Plan) -> list[Run]:
    """Every run of every stage and arm found on disk (the points a sweep holds, those that never
    ran as missing), in stage and arm order."""
    runs = []
    for stage in STAGES:
        for arm in plan.arms:
            folder = tune_dir / stage / arm
            if folder.is_dir():
                runs += [read_run(p, plan, arm, stage) for p in load_points(folder)]
    return runs


def read_centres(tune_dir: Path) -> dict[str, dict[str, float]]:
    """The search's best values per arm (DIR/search_best.json), the refinement's centres; {} before."""
    try:
        best = read_json_object(tune_dir / SEARCH_BEST, "search's best trials")
    except Unreadable:
        return {}
    return {arm: entry["values"] for arm, entry in best.items() if isinstance(entry, dict) and "values" in entry}


def mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None
