"""A comparison's search space (comparison.space and each arm's own): any config keys, each with a
range, a scale and a type; a trial's values, drawn from a scrambled Sobol sequence
(bsexp.runs.sobol) by its number alone, so a search stopped half-way continues with
the same points; and the refinement's trials, drawn the same way from a box around the search's best.

Scales: `log` (log-uniform: an LR, a weight decay, a policy's c), `linear` (uniform: a warmup's
length), `log1m` (1 - value log-uniform: a momentum, as Shallue et al. 2019 search it). An `int`
key is rounded (a batch). The refinement's box: a log or log1m key within x`refine_factor` of the
best (1.5: the LR's neighbours near the best at most x1.5 apart, the issue's and the Tuning
Playbook's "refine near the best"), a linear key within `refine_width` of its range around it;
clipped to the space.

A config names a trial's value by interpolation, `optimizer.lr: ${bsexp_tuned:optimizer.lr}`
(the driver adds one for every searched key): the resolver (bsexp.runs.quasi_random.tuned) answers
from the run's `tune.arm`, `tune.trial` and `tune.around` with `value_for` below.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bsexp.errors import ConfigError
from bsexp.runs.sobol import sobol
from bsexp.system.io import Unreadable, read_json_object

EDGE = 0.05  # a best within this fraction of its range (on its scale) of an end is on the space's edge
SCALES = ("log", "linear", "log1m")


@dataclass(frozen=True)
class Dimension:
    """One searched key: [low, high] on its scale, a whole number where `integer`."""

    key: str
    low: float
    high: float
    scale: str = "log"
    integer: bool = False

    @classmethod
    def of(cls, key: str, node: Mapping[str, Any], where: str) -> Dimension:
        """From a SearchKey node (`where`: its full key, for the error), checked."""
        low, high, scale = node.get("low"), node.get("high"), str(node.get("scale", "log"))
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (low, high)):
            raise ConfigError(f"{where}.low", low, "low and high must both be finite numbers")
        if not low < high:
            raise ConfigError(f"{where}.high", high, f"must be above low ({low:g})")
        if scale == "log" and low <= 0:
            raise ConfigError(f"{where}.low", low, "must be > 0 on scale log")
        if scale == "log1m" and not high < 1:
            raise ConfigError(f"{where}.high", high, "must be < 1 on scale log1m (1 - value is drawn log-uniformly)")
        integer = str(node.get("type", "float")) == "int"
        if integer and math.ceil(low) > math.floor(high):
            raise ConfigError(f"{where}.high", high, f"holds no whole number above low ({low:g})")
        return cls(key, float(low), float(high), scale, integer)

    def _to(self, value: float) -> float:
        """The value on the scale's line (where a trial's coordinate is uniform)."""
        return {"log": lambda v: math.log(v), "linear": lambda v: v, "log1m": lambda v: math.log(1 - v)}[self.scale](
            value
        )

    def _from(self, line: float) -> float:
        return {"log": math.exp, "linear": lambda x: x, "log1m": lambda x: 1 - math.exp(x)}[self.scale](line)

    def value(self, u: float) -> float | int:
        """The value at coordinate `u` in [0, 1): low at 0, high at 1, uniform on the scale."""
        a, b = self._to(self.low), self._to(self.high)
        value = min(max(self._from(a + u * (b - a)), self.low), self.high)
        if self.integer:
            return int(min(max(round(value), math.ceil(self.low)), math.floor(self.high)))
        return value

    def unit(self, value: float) -> float:
        """Where `value` lies in the range on its scale: 0 at low, 1 at high."""
        a, b = self._to(self.low), self._to(self.high)
        return (self._to(min(max(value, self.low), self.high)) - a) / (b - a)

    def around(self, centre: float, factor: float, width: float) -> Dimension:
        """The refinement's range around `centre`, clipped to this one."""
        if self.scale == "log":
            low, high = centre / factor, centre * factor
        elif self.scale == "log1m":
            low, high = 1 - (1 - centre) * factor, 1 - (1 - centre) / factor
        else:
            half = width * (self.high - self.low) / 2
            low, high = centre - half, centre + half
        low, high = max(low, self.low), min(high, self.high)
        return Dimension(self.key, low, max(high, low), self.scale, self.integer)

    def edge(self, value: float) -> str | None:
        """ "low" or "high" where `value` lies within EDGE of an end of the range, on its scale."""
        u = self.unit(value)
        return "low" if u < EDGE else "high" if u > 1 - EDGE else None


def arm_space(comparison: Mapping[str, Any], arm: str) -> list[Dimension]:
    """The keys an arm searches: comparison.space's, then its own (an own key of the same name
    replaces the shared one's range, in its place; an own key set to null drops the shared one)."""
    arms = comparison.get("arms") or {}
    if arm not in arms:
        raise ConfigError("tune.arm", arm, f"is not an arm of the comparison; its arms: {', '.join(arms) or 'none'}")
    shared, own = dict(comparison.get("space") or {}), dict(arms[arm].get("space") or {})
    keys = [k for k in [*shared, *(k for k in own if k not in shared)] if own.get(k, shared.get(k)) is not None]
    return [
        Dimension.of(
            key,
            own.get(key, shared.get(key)),
            f"comparison.arms.{arm}.space.{key}" if key in own else f"comparison.space.{key}",
        )
        for key in keys
    ]


def trial_values(dims: list[Dimension], trial: int, seed: int) -> dict[str, float | int]:
    """Trial `trial`'s point of the search: one Sobol point over every dimension."""
    point = sobol(trial + 1, len(dims), seed)[trial]
    return {d.key: d.value(u) for d, u in zip(dims, point)}


def refined_values(
    dims: list[Dimension], centre: Mapping[str, float], trial: int, seed: int, factor: float, width: float
) -> dict[str, float | int]:
    """Refinement trial `trial`: a Sobol point (of another scramble than the search's) in the box
    around `centre`, the search's best."""
    return trial_values([d.around(centre[d.key], factor, width) for d in dims], trial, seed + 1)


def value_for(root: DictConfig, name: str, default: Any = None) -> Any:
    """The `bsexp_tuned` resolver's answer in a comparison: `name`'s value for this run's arm and
    trial (or refinement trial, where tune.around names the search's best)."""
    node = root.tune
    comparison = _searched(root.comparison)
    dims = arm_space(comparison, str(node.arm))
    if name not in {d.key for d in dims}:
        if default is not None:
            return default
        raise ConfigError(name, f"${{bsexp_tuned:{name}}}", f"is not searched by arm {node.arm}")
    trial = 0 if node.trial is None else int(node.trial)  # None: a sweep's own config, before its points
    seed = int(comparison["search_seed"])
    if node.around is None:
        return trial_values(dims, trial, seed)[name]
    centre = _centre(str(node.around), str(node.arm))
    missing = [d.key for d in dims if d.key not in centre]
    if missing:
        raise ConfigError("tune.around", node.around, f"holds no value of {', '.join(missing)} for arm {node.arm}")
    factor, width = comparison["refine_factor"], comparison["refine_width"]
    return refined_values(dims, centre, trial, seed, factor, width)[name]


def _searched(node: DictConfig) -> dict[str, Any]:
    """What the search needs of the comparison node, resolved: its spaces and seeds (an arm's
    overrides, which may name the searched keys by interpolation, left as they are)."""
    arms = {name: {"space": OmegaConf.to_container(arm.space, resolve=True)} for name, arm in node.arms.items()}
    shared = OmegaConf.to_container(node.space, resolve=True)
    return {"arms": arms, "space": shared, **{k: node[k] for k in ("search_seed", "refine_factor", "refine_width")}}


def _centre(path: str, arm: str) -> dict[str, float]:
    try:
        best = read_json_object(Path(path), "search's best trials")
    except Unreadable as exc:
        raise ConfigError("tune.around", path, str(exc)) from None
    entry = best.get(arm)
    if not isinstance(entry, dict) or not isinstance(entry.get("values"), dict):
        raise ConfigError("tune.around", path, f"holds no best trial of arm {arm}")
    return entry["values"]
