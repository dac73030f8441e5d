"""A target: a metric of the metrics records and a value of it, reached where the metric is at or
beyond the value in the direction the metric improves — at or above for an accuracy, at or below for
a loss (nats per token, bits per byte). The one notion every place that takes a target shares: a
run's `trainer.stop_at` (with `trainer.stop_metric`), the sweep report's `--target` and the critical
batch's report (pure: no torch, no files).

Written as text, a target names its metric or takes the one it is given: `0.9` (the default
metric's), `val_loss=1.25`, `val_loss<=1.25`, `val_acc>=0.9`."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The metrics a target may name, as the metrics records and summary.json name them.
HIGHER_IS_BETTER = ("val_acc", "train_acc", "test_acc", "best_val_acc")
LOWER_IS_BETTER = ("val_loss", "train_loss", "train_eval_loss", "test_loss", "val_bpb")
METRICS = HIGHER_IS_BETTER + LOWER_IS_BETTER
ACCURACIES = HIGHER_IS_BETTER  # fractions in [0, 1]


def higher_is_better(metric: str) -> bool:
    """An accuracy improves upwards; a loss (or bits per byte) downwards."""
    if metric not in METRICS:
        raise ValueError(f"{metric}: not a metric a target can name; valid: {', '.join(METRICS)}")
    return metric in HIGHER_IS_BETTER


def reached(metric: str, value: float, target: float) -> bool:
    """Whether `value` of `metric` is at or beyond `target` in the direction the metric improves."""
    return value >= target if higher_is_better(metric) else value <= target


def better(metric: str, a: float, b: float) -> bool:
    """Whether `a` is strictly better than `b`."""
    return a > b if higher_is_better(metric) else a < b


def best(metric: str, values):
    """The best of `values` (the highest accuracy, the lowest loss)."""
    return max(values) if higher_is_better(metric) else min(values)


def worst(metric: str, values):
    return min(values) if higher_is_better(metric) else max(values)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Target:
    metric: str
    value: float

    def __post_init__(self) -> None:
        higher_is_better(self.metric)  # a metric a target can name, else ValueError
        if not math.isfinite(self.value) or self.value < 0:
            raise ValueError(f"{self}: the value must be a finite number >= 0")
        if self.metric in ACCURACIES and self.value > 1:
            raise ValueError(f"{self}: an accuracy is a fraction in [0, 1]")

    @property
    def higher(self) -> bool:
        return higher_is_better(self.metric)

    def reached(self, value: float) -> bool:
        return _number(value) and reached(self.metric, value, self.value)

    def reached_by(self, record: Mapping[str, Any]) -> bool:
        """Whether a metrics record (or a summary) has the metric at or beyond the target."""
        return self.reached(record.get(self.metric))

    def __str__(self) -> str:
        return f"{self.metric} {'>=' if self.higher else '<='} {self.value:g}"

    @classmethod
    def parse(cls, text: str, metric: str) -> Target:
        """`0.9` (of `metric`), `val_loss=1.25`, `val_loss<=1.25`, `val_acc>=0.9`; ValueError
        naming what is valid where the text is none of those, or its direction is the wrong one."""
        found = re.fullmatch(r"\s*(?:([a-z_]+)\s*(=|<=|>=)\s*)?([-+0-9.eE]+)\s*", text)
        if found is None:
            raise ValueError(f"{text!r}: valid: a number (of {metric}) or METRIC=VALUE, e.g. val_loss=1.25")
        name, sign, number = found.groups()
        try:
            value = float(number)
        except ValueError:
            raise ValueError(f"{text!r}: {number!r} is not a number") from None
        target = cls(name or metric, value)
        if sign in ("<=", ">=") and (sign == ">=") != target.higher:
            raise ValueError(
                f"{text!r}: {target.metric} improves {'upwards' if target.higher else 'downwards'}: {target}"
            )
        return target
