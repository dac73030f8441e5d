"""The search behind steps to result (`python -m bsexp.tune`, experiment=steps_to_result): each trial
is a point of a quasi-random Sobol sequence (scipy.stats.qmc) over the learning rate, log-uniform in
[tune.lr_min, tune.lr_max], and, where asked, SGD's momentum (1 - momentum log-uniform in
[0.01, 0.5]) and the length of a linear warmup (uniform in [0, tune.warmup_max], in schedule.unit),
as Shallue et al. 2019 searched (quasi-random search, their section 4.3). A trial's point depends
on its number alone, so a search stopped half-way continues with the same points.
Once the trials have run, each batch size's best values are read from the tuning's best.json.

A config names them by interpolation, `optimizer.lr: ${bsexp_tuned:lr}`: the resolver reads the
config's `tune` node (and its `batch.size`) and answers for this run. A comparison's trials search
any keys (bsexp.runs.search_space) through the same resolver.
"""

from __future__ import annotations

import math
from pathlib import Path

from bsexp.errors import ConfigError
from bsexp.runs.search_space import value_for
from bsexp.runs.sobol import sobol
from bsexp.system.io import Unreadable, read_json_object

# Searched dimensions, in the order of the Sobol point's coordinates; the warmup's is drawn only
# where it is searched, so that a search of the LR (and momentum) keeps its points.
DIMENSIONS = ("lr", "momentum", "warmup")
ONE_MINUS_MOMENTUM = (0.01, 0.5)


def log_uniform(u: float, low: float, high: float) -> float:
    return math.exp(math.log(low) + u * (math.log(high) - math.log(low)))


def trial_values(
    trial: int, lr_min: float, lr_max: float, momentum: bool, seed: int = 0, warmup_max: float | None = None
) -> dict[str, float | str]:
    """Trial `trial`'s learning rate (and momentum, and a linear warmup's length, where searched)."""
    point = sobol(trial + 1, len(DIMENSIONS) - (warmup_max is None), seed)[trial]
    values: dict[str, float | str] = {"lr": log_uniform(point[0], lr_min, lr_max)}
    if momentum:
        values["momentum"] = 1 - log_uniform(point[1], *ONE_MINUS_MOMENTUM)
    if warmup_max is not None:
        values["warmup"] = point[2] * warmup_max
        values["warmup_shape"] = "linear"
    return values


def tuned(name: str, default=None, *, _root_):
    """The `bsexp_tuned` resolver: `name` (lr, momentum, warmup, warmup_shape) for this run: the
    best trial's for its batch size where tune.best names a best.json, else trial tune.trial's;
    `default` where this run searches no such value (no trial, or momentum not searched). In a
    comparison (tune.arm set), `name` is any searched key (optimizer.lr, batch.adaptive.c) of the
    arm's space (bsexp.runs.search_space)."""
    node = _root_.tune
    if node.get("arm") is not None:
        return value_for(_root_, name, default)
    if node.best is not None:
        best = _best_of(str(node.best), str(_root_.batch.size))
        return default if best.get(name) is None else best[name]
    if node.trial is None:
        return default
    if not 0 < node.lr_min <= node.lr_max:
        raise ConfigError("tune.lr_min", node.lr_min, f"must be > 0 and at most tune.lr_max ({node.lr_max})")
    values = trial_values(
        int(node.trial), node.lr_min, node.lr_max, bool(node.momentum), int(node.search_seed), node.warmup_max
    )
    return values.get(name, default)


def _best_of(path: str, batch: str) -> dict:
    """best.json's entry for this batch size, or a ConfigError naming tune.best (the resolver's
    caller would name the key it resolves: optimizer.lr)."""
    try:
        best = read_json_object(Path(path), "tuning's best trials")
    except Unreadable as exc:
        raise ConfigError("tune.best", path, str(exc)) from None
    if not isinstance(best.get(batch), dict):
        raise ConfigError("tune.best", path, f"holds no best trial for batch.size={batch}; it holds: {', '.join(best)}")
    return best[batch]
