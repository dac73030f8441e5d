"""The points of a sweep and its rows: the seeds of one configuration, grouped into families of
rows that differ by batch only, and what every figure's title names (pure: no files)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A row "did not train" when its mean accuracy is below this fraction of the way from chance to
# 100 % (10 classes: below 19 %).
TRAINED_ABOVE = 0.1
# Train accuracy this far below the best of its family: the row did not fit the training set.
UNDER_TRAINED = 0.05
# Classes of the built-in data, for the chance level when summary.json does not say.
KNOWN_CLASSES = {"mnist1d": 10, "digits": 10, "mnist": 10, "fashion_mnist": 10, "cifar10": 10, "cifar100": 100}


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool): a value a summary or a record really measured."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True, kw_only=True)
class Point:
    """One job of a sweep: what `load` read from its directory (or the index, where it is gone)."""

    name: str
    setting: tuple[str, ...]  # the overrides that tell it apart, the seed left out
    overrides: tuple[str, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)
    summary: Mapping[str, Any] | None = None
    records: Sequence[Mapping[str, Any]] = ()  # metrics.jsonl: one per evaluation
    status: str = "missing"  # completed, diverged, preempted, failed, missing
    error: str | None = None
    dir: Path | None = None

    @property
    def done(self) -> bool:
        return self.status == "completed" and self.summary is not None

    @property
    def batch(self) -> int | None:
        """From summary.json, else the config, else the overrides (a point that never started has
        only those: its row still shows its batch)."""
        if self.summary and self.summary.get("batch_size"):
            return self.summary["batch_size"]
        return (self.config.get("batch") or {}).get("size") or self._given("batch.size")

    @property
    def seed(self) -> int | None:
        """From summary.json, else the config, else the overrides."""
        for value in ((self.summary or {}).get("seed"), self.config.get("seed"), self._given("seed")):
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    def _given(self, key: str) -> int | None:
        """A whole number this point's overrides give `key` (the last where given twice)."""
        values = [o.split("=", 1)[1] for o in self.overrides if o.lstrip("+~").split("=", 1)[0] == key]
        return int(values[-1]) if values and values[-1].lstrip("-").isdigit() else None

    @property
    def final_samples(self) -> float | None:
        """Training samples the run took in all."""
        if self.summary and is_number(self.summary.get("samples_seen")):
            return self.summary["samples_seen"]
        return self.records[-1].get("samples_seen") if self.records else None

    @property
    def num_classes(self) -> int | None:
        """From summary.json where it says, else from the config (data.num_classes, the data's name)."""
        if self.summary and isinstance(self.summary.get("num_classes"), int):
            return self.summary["num_classes"]
        data = self.config.get("data") or {}
        if isinstance(data.get("num_classes"), int):
            return data["num_classes"]
        name = (self.summary or {}).get("data") or data.get("name") or str(data.get("_target_", "")).rsplit(".", 1)[-1]
        return KNOWN_CLASSES.get(name)


@dataclass
class Row:
    """The points of one configuration: its seeds."""

    setting: tuple[str, ...]
    points: list[Point] = field(default_factory=list)

    @property
    def done(self) -> list[Point]:
        return [p for p in self.points if p.done]

    @property
    def batch(self) -> int | None:
        return next((p.batch for p in self.points if p.batch), None)

    @property
    def family(self) -> tuple[str, ...]:
        """The setting without the batch: rows of one family differ by batch only."""
        return tuple(o for o in self.setting if not o.startswith("batch.size="))

    @property
    def configuration(self) -> str:
        """The family as one string; empty when the sweep varies the batch only."""
        return ",".join(self.family)

    @property
    def seeds(self) -> list[int]:
        """The seeds of the row's points, completed or not (those the sweep names)."""
        return sorted({p.seed for p in self.points if p.seed is not None})

    def values(self, key: str) -> list[float]:
        return [p.summary[key] for p in self.done if is_number(p.summary.get(key))]

    def mean(self, key: str) -> float | None:
        values = self.values(key)
        return statistics.fmean(values) if values else None

    def std(self, key: str) -> float | None:
        values = self.values(key)
        return statistics.stdev(values) if len(values) > 1 else None

    def first(self, key: str) -> Any:
        return next((p.summary.get(key) for p in self.done), None)

    @property
    def chance(self) -> float | None:
        classes = next((p.num_classes for p in self.points if p.num_classes), None)
        return 1 / classes if classes else None

    def did_not_train(self, metric: str, higher: bool = True) -> bool:
        """Its mean accuracy `metric` stayed near chance (below TRAINED_ABOVE of the way to 100 %).
        A loss (`higher` false) has no chance level the report judges by: never flagged."""
        if not higher:
            return False
        mean, chance = self.mean(metric), self.chance
        return mean is not None and chance is not None and mean < chance + TRAINED_ABOVE * (1 - chance)

    def under_trained(self, family: Sequence[Row]) -> bool:
        """Its mean train accuracy lies UNDER_TRAINED or more below the best of its family: its gap
        is small because it did not fit the training set, not because it generalises better."""
        own = self.mean("train_acc")
        best = max((r.mean("train_acc") for r in family if r.mean("train_acc") is not None), default=None)
        return own is not None and best is not None and best - own >= UNDER_TRAINED

    @property
    def status(self) -> str:
        counts: dict[str, int] = {}
        for point in self.points:
            counts[point.status] = counts.get(point.status, 0) + 1
        return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


def common_settings(points: Sequence[Point]) -> tuple[str, ...]:
    """The overrides every point shares: said once, above the table, not in every row."""
    if not points:
        return ()
    shared = set.intersection(*(set(p.setting) for p in points))
    return tuple(o for o in points[0].setting if o in shared)


def make_rows(points: Sequence[Point]) -> list[Row]:
    """Points grouped by setting (their seeds together), sorted by family, then batch."""
    common = set(common_settings(points))
    rows: dict[tuple[str, ...], Row] = {}
    for point in points:
        setting = tuple(o for o in point.setting if o not in common)
        rows.setdefault(setting, Row(setting)).points.append(point)
    return sorted(rows.values(), key=lambda r: (r.family, r.batch or 0))


def families(rows: Sequence[Row]) -> dict[tuple[str, ...], list[Row]]:
    """Rows that differ by batch only, each family sorted by batch (rows without a batch left out)."""
    found: dict[tuple[str, ...], list[Row]] = {}
    for row in rows:
        if row.batch:
            found.setdefault(row.family, []).append(row)
    return {fam: sorted(members, key=lambda r: r.batch) for fam, members in sorted(found.items())}


@dataclass(frozen=True)
class Labels:
    """What every figure's title names: the data, the model, the epochs and the seeds."""

    data: tuple[str, ...]
    model: tuple[str, ...]
    epochs: tuple[float, ...]
    seeds: tuple[int, ...]  # of the completed points
    seeds_per_row: tuple[int, int]  # fewest and most completed seeds of a row
    grid_seeds: tuple[int, ...] = ()  # of every point of the sweep, completed or not
    grid_per_row: tuple[int, int] = (0, 0)  # fewest and most points of a row, completed or not
    complete: bool = True  # every point of the sweep completed


def labels(rows: Sequence[Row]) -> Labels:
    done = [p for r in rows for p in r.done]

    def distinct(key, clean=lambda v: v):
        return tuple(sorted({clean(p.summary[key]) for p in done if p.summary.get(key) is not None}, key=str))

    counts = [len(r.done) for r in rows if r.done] or [0]
    grid = [len(r.points) for r in rows] or [0]
    return Labels(
        distinct("data"),
        distinct("model", lambda m: str(m).rsplit(".", 1)[-1]),
        distinct("epochs", float),
        distinct("seed", int),
        (min(counts), max(counts)),
        tuple(sorted({s for r in rows for s in r.seeds})),
        (min(grid), max(grid)),
        all(len(r.done) == len(r.points) for r in rows),
    )
