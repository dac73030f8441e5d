"""The schema of a comparison (`comparison:`, set by a file of conf/comparison/): its arms, the
search space each is tuned over, the budget of trials every arm gets alike, and the objective,
seeds and margin fixed before any run (python -m bsexp.tune DIR comparison=NAME;
docs: Comparing arms). The ladder of targets it counts steps to is the runs' own `trainer.ladder`, its budget the
runs' `epochs`: a comparison file sets both for every arm."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from omegaconf import MISSING

from bsexp.fields import at_least, bounded, choice

# log: log-uniform; linear: uniform; log1m: 1 - value log-uniform (a momentum, as Shallue et al. search it)
Scale = choice("Scale", "log", "linear", "log1m", module=__name__)
KeyType = choice("KeyType", "float", "int", module=__name__)
# What an arm's best trial is chosen by: the fewest steps (or samples) to comparison.select_rung,
# or the best final value of trainer.ladder_metric at the budget.
Objective = choice("Objective", "steps", "samples", "final", module=__name__)


@dataclass
class SearchKey:
    """One searched key: its range and how a trial's value is drawn from it."""

    low: float = MISSING
    high: float = MISSING
    scale: Scale = Scale.log
    type: KeyType = KeyType.float  # int: rounded to a whole number (a batch)


@dataclass
class ArmConfig:
    """One arm: a config (its overrides) and what is searched of it."""

    overrides: List[str] = field(default_factory=list)  # what makes the arm: batch=adaptive, batch.size=64, ...
    # Its own keys, beside (or over) comparison.space's; a shared key set to null is not searched by this
    # arm (momentum, for an arm whose optimizer has none)
    space: Dict[str, Optional[SearchKey]] = field(default_factory=dict)
    # A fixed batch: the best of these on the tuning seeds is the baseline the others are held against,
    # and they draw the steps-samples frontier S(E)
    baseline: bool = False
    self_tuning: bool = False  # no search: the config as it is, run on the held-out seeds (AlgoPerf's self-tuning)


@dataclass
class ComparisonConfig:
    """Arms tuned alike and held against the best tuned fixed batch (python -m bsexp.tune DIR
    comparison=NAME): every key is fixed before the first run."""

    # name -> the arm (overrides, its own space, baseline, self_tuning); none outside a comparison
    arms: Dict[str, ArmConfig] = field(default_factory=dict)
    # key -> {low, high, scale: log | linear | log1m, type: float | int}, searched for every arm
    space: Dict[str, SearchKey] = field(default_factory=dict)
    trials: int = at_least(1, 24)  # quasi-random trials of every tuned arm (AlgoPerf: the same for all)
    refine: int = at_least(0, 8)  # then trials around each arm's best (0: none)
    refine_factor: float = at_least(1.0, 1.5)  # the refinement's log and log1m keys: within [best / this, best x this]
    refine_width: float = bounded(0.2, low=0, high=1, open_low=True)  # its linear keys: this fraction of the range
    objective: Objective = Objective.steps  # what an arm's best trial is chosen by
    select_rung: Optional[float] = None  # the rung of trainer.ladder the objective counts to; null: the top
    tuning_seeds: List[int] = bounded(low=0, nonempty=True, factory=lambda: [0])  # every trial runs on each
    held_out: int = at_least(0, 10)  # each arm's best rerun on seeds after the tuning's (10 for a headline)
    margin: float = at_least(0, 0.005)  # non-inferiority margin of the final metric (its units: 0.005 = 0.5 %)
    # A verdict needs the arm and the baseline to reach the rung on this fraction of the held-out seeds
    min_reached: float = bounded(0.8, low=0, high=1, open_low=True)
    search_seed: int = at_least(0, 0)  # scrambles the Sobol sequences
