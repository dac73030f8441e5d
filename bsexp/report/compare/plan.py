"""A comparison as it was declared before its runs (DIR/comparison.json, written by python -m
bsexp.tune DIR comparison=NAME as it starts): its arms and spaces, budget of trials, objective,
ladder of rungs, budget of samples, seeds and margin. The driver runs from it and the report reads
it, so both hold the runs to the same declaration (pure: no Hydra, no torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bsexp.runs.ladder import Ladder, rung_key
from bsexp.runs.search_space import Dimension, arm_space
from bsexp.system.io import Unreadable, read_json_object

COMPARISON, SEARCH_BEST, BEST = "comparison.json", "search_best.json", "best.json"
SEARCH, REFINE, HELD_OUT = "search", "refine", "held_out"  # the stages' folders, one sweep an arm in each


@dataclass(frozen=True)
class Plan:
    """comparison.json: `name` (the conf/comparison/ option), `comparison` (its node, resolved),
    the runs' `ladder` (trainer.ladder, trainer.ladder_metric, trainer.ladder_stop), `epochs` (the
    budget) and `args` (the command line's overrides that change what the runs compute)."""

    name: str
    comparison: dict[str, Any]
    ladder_rungs: tuple[float, ...]
    ladder_metric: str
    ladder_stop: bool
    epochs: float
    args: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "comparison": self.comparison,
            "ladder": {"rungs": list(self.ladder_rungs), "metric": self.ladder_metric, "stop": self.ladder_stop},
            "epochs": self.epochs,
            "args": list(self.args),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        ladder = data["ladder"]
        return cls(
            name=data["name"],
            comparison=data["comparison"],
            ladder_rungs=tuple(float(r) for r in ladder["rungs"]),
            ladder_metric=ladder["metric"],
            ladder_stop=bool(ladder["stop"]),
            epochs=float(data["epochs"]),
            args=tuple(data.get("args", ())),
        )

    @classmethod
    def read(cls, tune_dir: Path) -> Plan:
        """DIR/comparison.json; ValueError (one line) where DIR holds no comparison."""
        try:
            return cls.from_json(read_json_object(tune_dir / COMPARISON, "comparison"))
        except Unreadable as exc:
            raise ValueError(f"{tune_dir} holds no comparison ({exc}; see python -m bsexp.tune --help)") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{tune_dir / COMPARISON} is not a comparison's declaration ({exc!r})") from None

    @property
    def ladder(self) -> Ladder:
        return Ladder(self.ladder_metric, self.ladder_rungs)

    @property
    def arms(self) -> dict[str, dict[str, Any]]:
        return self.comparison["arms"]

    @property
    def tuned(self) -> list[str]:
        """The arms searched (every one but the self-tuning), in their declared order."""
        return [name for name, arm in self.arms.items() if not arm.get("self_tuning")]

    @property
    def baselines(self) -> list[str]:
        return [name for name, arm in self.arms.items() if arm.get("baseline")]

    def space(self, arm: str) -> list[Dimension]:
        return [] if self.arms[arm].get("self_tuning") else arm_space(self.comparison, arm)

    @property
    def objective(self) -> str:
        return str(self.comparison["objective"])

    @property
    def select_rung(self) -> float:
        """The rung the objective counts steps (or samples) to: comparison.select_rung, else the top."""
        chosen = self.comparison.get("select_rung")
        return float(chosen) if chosen is not None else self.ladder_rungs[-1]

    @property
    def tuning_seeds(self) -> list[int]:
        return [int(s) for s in self.comparison["tuning_seeds"]]

    @property
    def held_out_seeds(self) -> list[int]:
        """The seeds after the tuning's: never one that chose a best."""
        first = max(self.tuning_seeds) + 1
        return list(range(first, first + int(self.comparison["held_out"])))

    @property
    def seeds_needed(self) -> int:
        """How many held-out seeds an arm (and its baseline) must reach a rung on for a verdict there:
        comparison.min_reached of them."""
        return math.ceil(float(self.comparison["min_reached"]) * len(self.held_out_seeds) - 1e-9)

    @property
    def rungs(self) -> list[str]:
        return [rung_key(r) for r in self.ladder_rungs]

    def capped(self, value: float | None) -> float | None:
        """A final value as the comparison reads it: capped at the top rung where the runs end there
        (a run stopped at it would have gone on: its final value is only known to reach it)."""
        if value is None or not self.ladder_stop:
            return value
        top = self.ladder_rungs[-1]
        return min(value, top) if self.ladder.higher else max(value, top)
