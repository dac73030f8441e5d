"""Arms against tuned fixed batches, as plain data: pure (no matplotlib, no files). Each arm's
final accuracy and its steps, samples and seconds to a target; the tuned fixed batch that reaches it
in the fewest steps; each other arm's verdict against it, and how far the verdict moves with the
seeds; and what any batch schedule could gain in McCandlish et al.'s model (`bound`)."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from bsexp.report.analysis.fit import ScheduleBound, fit_steps_samples, schedule_bound
from bsexp.report.analysis.points import Point

GOAL_STEPS = 0.7  # an arm's steps to the target at most this fraction of the fastest fixed batch's
# The rungs of the ladder of targets below the target, in accuracy, for the schedule bound: each
# spacing gives one bound (fine rungs see more of B_noise's change, and more of the fits' noise).
RUNGS = (0.01, 0.02, 0.05)
RESAMPLES = 2000  # draws of the seeds, with replacement, for how much a verdict moves with them


@dataclass
class Arm:
    name: str
    points: list[Point] = field(default_factory=list)
    lr: float | None = None  # the tuned LR (of the points' optimizer.lr; none where they set none)
    settings: str = ""  # the overrides that set it apart beyond its arm, seed, LR and batch (`_settings`)

    def finals(self) -> list[float]:
        return [p.summary["val_acc"] for p in self.points if p.done and p.summary.get("val_acc") is not None]

    def mean_std(self) -> tuple[float | None, float]:
        finals = self.finals()
        if not finals:
            return None, 0.0
        return statistics.fmean(finals), statistics.stdev(finals) if len(finals) > 1 else 0.0

    def firsts(self, target: float) -> list[tuple[dict[str, Any], bool] | None]:
        """Per point (seed): its first evaluation at or above `target`, and whether that was its first
        evaluation of all; None where it never reaches it."""
        out = []
        for point in self.points:
            evaluated = [r for r in point.records if r.get("val_acc") is not None]
            first = next((r for r in evaluated if r["val_acc"] >= target), None)
            out.append(None if first is None else (first, first is evaluated[0]))
        return out

    def to_target(self, target: float) -> dict[str, Any]:
        """Mean steps, samples and training seconds to the first evaluation at or above `target`,
        over the seeds that reach it."""
        found = [f for f in self.firsts(target) if f is not None]
        reached = [r for r, _ in found]
        if not reached:
            return {
                "reached": 0,
                "seeds": len(self.points),
                "steps": None,
                "samples": None,
                "seconds": None,
                "at_first_eval": False,
            }
        rates = [(r["samples_seen"], r.get("samples_per_s") or 0) for r in reached]
        seconds = [samples / rate for samples, rate in rates if rate]
        return {
            "reached": len(reached),
            "seeds": len(self.points),
            "steps": statistics.fmean(r["step"] for r in reached),
            "samples": statistics.fmean(r["samples_seen"] for r in reached),
            "seconds": statistics.fmean(seconds) if seconds else None,
            "at_first_eval": any(at_first for _, at_first in found),
        }  # reached by then: when, it does not say


def _value(overrides, key: str) -> str | None:
    found = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+~") == key]
    return found[-1] if found else None


def _tuned(groups: dict[tuple[Any, float], Arm]) -> list[Arm]:
    """Of each arm's LRs, the one with the best mean final accuracy (of equals, the lowest LR); in the
    order of the arms."""
    best: dict[Any, Arm] = {}
    for (key, _), arm in sorted(groups.items()):
        if key not in best or (arm.mean_std()[0] or 0) > (best[key].mean_std()[0] or 0):
            best[key] = arm
    return [best[k] for k in sorted(best)]


NOT_AN_ARM = ("seed", "optimizer.lr", "batch.size", "logger.")  # seeds, the LR tuned, a fixed row's batch, logs


def _settings(point: Point, shared: set[str]) -> str:
    """The overrides that set the point apart from the others, beyond its arm, seed, LR and batch
    (`batch.adaptive.c=0.5`): an arm run at several settings is one row per setting."""
    return " ".join(
        o
        for o in point.overrides
        if o not in shared
        and not o.startswith(("experiment/", "+experiment/"))
        and not o.split("=", 1)[0].lstrip("+~").startswith(NOT_AN_ARM)
    )


def arms(points: list[Point]) -> tuple[list[Arm], list[Arm]]:
    """(tuned fixed batches, other arms), from the points of one or more sweeps. An arm run at several
    `optimizer.lr` is tuned as the fixed batches are: its row is the LR with the best final accuracy."""
    fixed: dict[tuple[Any, float], Arm] = {}
    others: dict[tuple[str, float], Arm] = {}
    done = [p for p in points if p.done]
    shared = set.intersection(*(set(p.overrides) for p in done)) if done else set()
    for point in done:
        arm = next(
            (o.split("=", 1)[1] for o in point.overrides if o.split("=", 1)[0].startswith("experiment/")), "fixed"
        )
        lr = _value(point.overrides, "optimizer.lr")
        lr = float(lr) if lr is not None else None
        order = lr if lr is not None else -math.inf  # no LR set: the arm's default, before any set
        settings = _settings(point, shared)
        if arm == "fixed":
            batch = int(point.summary["batch_size"])
            name = f"fixed {batch}" + (f" {settings}" if settings else "")
            fixed.setdefault(((batch, settings), order), Arm(name, lr=lr, settings=settings)).points.append(point)
        else:
            name = arm + (f" {settings}" if settings else "")
            others.setdefault((name, order), Arm(name, lr=lr, settings=settings)).points.append(point)
    return _tuned(fixed), _tuned(others)


def bound(tuned: list[Arm], target: float, spacing: float) -> ScheduleBound | None:
    """`schedule_bound` over targets from the target down by `spacing` (to zero): at each, S_min and
    E_min fitted to the same batches, those that reach the target on every seed (mean steps and
    samples to each rung): a set of batches that changed from rung to rung would move S_min and
    E_min by its change. Rungs where no fit is possible (a degenerate fit) are skipped, and so are
    rungs some seed reached by its first evaluation (its steps to them unknown: only at most)."""
    members = [arm for arm in tuned if (got := arm.to_target(target))["reached"] == got["seeds"]]
    ladder, fitted = [], None
    for k in range(int(target / spacing), -1, -1):
        reached = [arm.to_target(target - k * spacing) for arm in members]
        if any(t["at_first_eval"] for t in reached):
            continue
        fit = fit_steps_samples([t["steps"] for t in reached], [t["samples"] for t in reached])
        if not fit.refused:
            ladder.append((fit.s_min, fit.e_min))
            fitted = k
    return schedule_bound(ladder) if fitted == 0 else None  # the last rung must be the target itself


def seed_spread(arm: Arm, baseline: Arm, target: float, draws: int = RESAMPLES) -> dict[str, Any]:
    """How much the verdict against `baseline` moves with the seeds: a percentile bootstrap that
    draws the arm's seeds and the baseline's, each with replacement (the target and the choice of
    baseline held as they are). The central 90 % of the steps and samples ratios over the draws in
    which some drawn seed of the arm reaches the target, the share of all draws in which its steps
    and samples are within the goal's, and the share in which the whole goal holds: that, every
    drawn seed reaching the target and the drawn seeds' mean final accuracy in the band. With 3
    seeds a side there are 10 distinct draws of each: a coarse guide, not a test."""
    rng = random.Random(0)  # the same report from the same runs
    seeds = list(zip(arm.firsts(target), (p.summary.get("val_acc") for p in arm.points)))
    base = [first for first, _ in filter(None, baseline.firsts(target))]
    steps, samples, efficient, held = [], [], 0, 0
    for _ in range(draws):
        drawn, base_drawn = rng.choices(seeds, k=len(seeds)), rng.choices(base, k=len(base))
        reached = [found[0] for found, _ in drawn if found is not None]
        if not reached or not base_drawn:
            continue
        ratios = [
            statistics.fmean(r[key] for r in reached) / statistics.fmean(r[key] for r in base_drawn)
            for key in ("step", "samples_seen")
        ]
        steps.append(ratios[0])
        samples.append(ratios[1])
        finals = [final for _, final in drawn if final is not None]
        within = ratios[0] <= GOAL_STEPS and ratios[1] <= 1.0
        efficient += within
        held += within and len(reached) == len(drawn) and bool(finals) and statistics.fmean(finals) >= target
    return {
        "steps": _central(steps),
        "samples": _central(samples),
        "efficient": efficient / draws,
        "held": held / draws,
    }


def _central(values: list[float]) -> tuple[float, float] | None:
    """The 5th and 95th percentiles (None for no values)."""
    if len(values) < 2:
        return (values[0], values[0]) if values else None
    cuts = statistics.quantiles(values, n=20, method="inclusive")
    return cuts[0], cuts[-1]


class NoBaseline(Exception):
    """No completed point of the arm `fixed`: nothing to hold the other arms against."""


def analyse(points: list[Point]) -> dict[str, Any]:
    tuned, others = arms(points)
    if not tuned:
        raise NoBaseline("no completed point of the arm `fixed` to hold the others against")
    best = max(tuned, key=lambda a: a.mean_std()[0] or 0)
    mean, std = best.mean_std()
    target = mean - std
    rows = [_row(arm, target) for arm in [*tuned, *others]]
    # The baseline is the fixed batch that reaches the target in the fewest steps on every seed: one
    # that reaches it on a lucky seed only is not a batch to train at (nor, for the goal, is such an arm).
    reaching = [r for r in rows[: len(tuned)] if r["to_target_steps"] is not None and _every_seed(r)]
    fastest = min(reaching, key=lambda r: r["to_target_steps"]) if reaching else None
    baseline = next(a for a in tuned if a.name == fastest["arm"]) if fastest is not None else None
    verdicts = [_verdict(arm, row, baseline, fastest, target) for arm, row in zip(others, rows[len(tuned) :])]
    bounds = _bounds(tuned, baseline, fastest, target) if baseline is not None else {}
    return {
        "rows": rows,
        "best": best.name,
        "target": target,
        "best_mean": mean,
        "best_std": std,
        "fastest": fastest,
        "verdicts": verdicts,
        "bounds": bounds,
    }


def _row(arm: Arm, target: float) -> dict[str, Any]:
    """The arm's row of pareto.md and pareto.csv: its final accuracy, and its steps, samples and
    seconds to the target."""
    m, s = arm.mean_std()
    to = arm.to_target(target)
    return {
        "arm": arm.name,
        "lr": arm.lr,
        "seeds": len(arm.points),
        "final_val_acc": m,
        "std": s,
        **{f"to_target_{k}": to[k] for k in ("steps", "samples", "seconds")},
        "reached": f"{to['reached']}/{len(arm.points)}",
    }


def _every_seed(row: dict[str, Any]) -> bool:
    """Whether every seed of the row reached the target."""
    return row["reached"].split("/")[0] == row["reached"].split("/")[1]


def _verdict(arm: Arm, row: dict[str, Any], baseline: Arm | None, fastest: dict[str, Any] | None, target: float):
    """(arm, steps ratio, samples ratio, goal met, seed spread) against the baseline; the ratios and
    the spread None where there is no baseline or the arm never reached the target."""
    if baseline is None or row["to_target_steps"] is None:
        return (row["arm"], None, None, False, None)
    steps = row["to_target_steps"] / fastest["to_target_steps"]
    samples = row["to_target_samples"] / fastest["to_target_samples"]
    in_band = row["final_val_acc"] is not None and row["final_val_acc"] >= target
    return (
        row["arm"],
        steps,
        samples,
        steps <= GOAL_STEPS and samples <= 1.0 and in_band and _every_seed(row),
        seed_spread(arm, baseline, target),
    )


def _bounds(tuned: list[Arm], baseline: Arm, fastest: dict[str, Any], target: float) -> dict[float, tuple]:
    """Per rung spacing: (the schedule bound, a fixed batch's steps, the best schedule's steps) at the
    baseline's samples, fitted to the baseline's own family: the fixed batches of its settings."""
    bounds = {}
    family = [a for a in tuned if a.settings == baseline.settings]
    for spacing in RUNGS:
        found = bound(family, target, spacing)
        steps = found.steps(fastest["to_target_samples"]) if found is not None else None
        if steps is not None:
            bounds[spacing] = (found, *steps)
    return bounds
