"""A run's ladder of targets (`trainer.ladder`): where it first reached each rung, read from its
metrics records (pure: no torch, no files).

A comparison (python -m bsexp.tune DIR comparison=NAME) fixes its objective before the runs, and
the Deep Learning Tuning Playbook asks that the runs record enough for any target to be read
afterwards: so a run goes on to its budget, its evaluations recording the metric, and the step,
samples and LR at which it first reached each rung are read back from them — by the run itself
into summary.json (`ladder`), and by the report from metrics.jsonl, with this one function. The run
ends early only where `trainer.ladder_stop` asks and the top rung is reached.

A rung of an accuracy is reached at or above it, of a loss at or below it
(`bsexp.config.schema.LOWER_IS_BETTER`). Where it was reached is interpolated linearly between the
evaluation before and the first at or past it (trainer.eval_growth puts them a few percent apart),
in steps and in samples; the LR is the one the first evaluation past it recorded, with the highest
LR recorded up to then (`lr_peak`): a rung reached with the LR below half its peak was reached by
a decayed LR, which the comparison's report flags.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bsexp.config.schema import LOWER_IS_BETTER


def rung_key(rung: float) -> str:
    """A rung as summary.json and the report name it: 0.9 -> "0.9", 0.985 -> "0.985"."""
    return format(rung, "g")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Ladder:
    """The rungs of one metric, from the easiest to the hardest."""

    metric: str = "val_acc"
    rungs: tuple[float, ...] = ()

    @classmethod
    def of(cls, trainer: Mapping[str, Any]) -> Ladder:
        """The ladder a run's `trainer` node declares (trainer.ladder, trainer.ladder_metric)."""
        return cls(str(trainer.get("ladder_metric") or "val_acc"), tuple(float(r) for r in trainer.get("ladder") or ()))

    @property
    def higher(self) -> bool:
        """Whether the metric is better higher (an accuracy) or lower (a loss)."""
        return self.metric not in LOWER_IS_BETTER

    @property
    def top(self) -> float | None:
        return self.rungs[-1] if self.rungs else None

    def reached(self, value: float, rung: float) -> bool:
        return value >= rung if self.higher else value <= rung

    def top_reached(self, record: Mapping[str, Any]) -> bool:
        value = record.get(self.metric)
        return self.top is not None and _number(value) and self.reached(value, self.top)

    def read(self, records: Iterable[Mapping[str, Any]], until_epoch: float | None = None) -> dict[str, dict[str, Any]]:
        """{rung: where the run first reached it} for the rungs it reached, in the records up to
        `until_epoch` (epochs of samples seen; None: all): `step` and `samples` interpolated, the
        first evaluation at or past the rung's `evaluated_step`, `evaluated_samples`, `epoch`, `lr`
        and `batch`, the highest LR recorded up to it (`lr_peak`), and `at_first_eval` where the
        run's first evaluation had reached it already (its step and samples are then upper bounds)."""
        found: dict[str, dict[str, Any]] = {}
        below: Mapping[str, Any] | None = None
        peak = 0.0
        for record in records:
            if until_epoch is not None and record.get("epoch", 0) > until_epoch + 1e-9:
                break
            value = record.get(self.metric)
            if not _number(value):
                continue
            peak = max(peak, record.get("lr") or 0.0)
            for rung in self.rungs:
                if rung_key(rung) not in found and self.reached(value, rung):
                    found[rung_key(rung)] = _reach(below, record, self.metric, rung, peak)
            below = record
            if len(found) == len(self.rungs):
                break
        return {rung_key(r): found[rung_key(r)] for r in self.rungs if rung_key(r) in found}


def _reach(below: Mapping[str, Any] | None, at: Mapping[str, Any], metric: str, rung: float, peak: float):
    """Where a rung was reached: interpolated between `below` (the evaluation before, which had
    not reached it) and `at` (the first that had)."""
    step, samples = float(at["step"]), float(at["samples_seen"])
    if below is not None and at[metric] != below[metric]:
        f = (rung - below[metric]) / (at[metric] - below[metric])
        step = below["step"] + f * (at["step"] - below["step"])
        samples = below["samples_seen"] + f * (at["samples_seen"] - below["samples_seen"])
    return {
        "step": step,
        "samples": samples,
        "evaluated_step": at["step"],
        "evaluated_samples": at["samples_seen"],
        "epoch": at.get("epoch"),
        "lr": at.get("lr"),
        "lr_peak": peak,
        "batch": at.get("batch_size"),  # the batch it trained at then: an adaptive run's may have grown
        "at_first_eval": below is None,
    }


def decayed(reach: Mapping[str, Any], fraction: float = 0.5) -> bool:
    """Whether a rung was reached with the LR below `fraction` of the highest it had had: its
    steps then measure a decayed LR as much as the batch (the comparison's report flags it)."""
    lr, peak = reach.get("lr"), reach.get("lr_peak")
    return _number(lr) and _number(peak) and peak > 0 and lr < fraction * peak
