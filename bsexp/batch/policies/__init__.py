"""Batch policies: one module per `batch=` option (and the branch), each a small class behind one
narrow interface, registered here and nowhere else.

A policy is made from the config and the number of ranks (`policy_for`). It must have:

- `name`: its `batch.policy` (or "branch");
- `check() -> BatchPlan | None`: what the config alone can tell is wrong (ConfigError), run before
  anything is written; the first step's plan where the config alone decides it;
- `check_data(n_train, data)`: every batch it asks for fits in the training set;
- `lay_out(probe, state) -> Layout`: the run, frozen (bsexp.batch.layout): measured with the
  `Probe` (the finder, the noise scale) or, resuming, from `state` (its own `state_dict`).

and may have (bsexp.batch.control supplies the default where it has not):

- `searches() -> bool` (False): whether laying out afresh runs the finder;
- `measures_noise` (False): it steers by B_simple, measured on every step;
- `own_setup` (True): the run's set-up is its own to caution about (a branch continues its trunk's);
- `due(step, layout) -> bool` and `decide(step, layout, b_simple)`, `apply(step, decision) -> Layout`:
  a closed loop; rank 0 decides, every rank applies the decision;
- `state_dict() -> dict`, `record() -> dict`, `summary(samples_seen) -> dict`,
  `described(hp) -> ScaledHparams`, `begin(step, lr, weight_decay)`, `found`, `batch_figure`.

Policies share behaviour through plain functions (bsexp.batch.policies.shared), never through a
base class. Torch-free: what a policy measures comes through the `Probe` (bsexp.train.loop builds it).
"""

from __future__ import annotations

import importlib
import pydoc
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from omegaconf import DictConfig

from bsexp.errors import ConfigError

# `batch.policy` -> the class that implements it: the one place a policy is registered.
REGISTRY = {
    "fixed": "bsexp.batch.policies.fixed:Fixed",
    "accumulation": "bsexp.batch.policies.accumulation:Accumulation",
    "finder": "bsexp.batch.policies.finder:Finder",
    "scheduled": "bsexp.batch.policies.scheduled:Scheduled",
    "adaptive": "bsexp.batch.policies.adaptive:Adaptive",
}
BRANCH = "bsexp.batch.policies.branch:Branch"  # a run with branch.trunk set, whatever its batch.policy


@dataclass(frozen=True)
class Probe:
    """What a policy may measure with when it lays the run out: the training set's size and name,
    the world (its ranks agree through it), the batch finder (`find(keep_size=..., largest=...)`
    -> bsexp.finder.FinderResult) and the gradient noise scale (`measure_noise(batch,
    steps)`: B_simple after training a copy of the run `steps` steps at `batch`)."""

    n_train: int
    data: str = "the data"
    world: Any = None
    find: Callable[..., Any] | None = None
    measure_noise: Callable[[int, int], float | None] | None = None


@dataclass(frozen=True)
class Traits:
    """What a policy says of itself, each with its default where it says nothing."""

    searches: bool = False  # laying the run out afresh runs the batch finder
    measures_noise: bool = False  # it steers by B_simple, measured on every step
    own_setup: bool = True  # the run's set-up is its own to caution about (a branch continues its trunk's)
    batch_figure: str | None = None  # the W&B key of a figure of the batch over training (it moves the batch)


def traits(policy) -> Traits:
    return Traits(
        searches=policy.searches() if hasattr(policy, "searches") else False,
        measures_noise=getattr(policy, "measures_noise", False),
        own_setup=getattr(policy, "own_setup", True),
        batch_figure=getattr(policy, "batch_figure", None),
    )


def load(target: str) -> type:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def config_of(name: str) -> type:
    """The config dataclass of a registered policy (its `config`, beside it in its module)."""
    return load(REGISTRY[name]).config


def policy_for(cfg: DictConfig, world: int):
    """The policy `batch.policy` names (a branch's, where branch.trunk is set), for `world` ranks."""
    if cfg.get("branch") is not None and cfg.branch.trunk is not None:
        return load(BRANCH)(cfg, world)
    target = cfg.batch.get("_target_")
    if target:  # a policy of your own, named by its batch/<name>.yaml as a model or dataset is
        found = pydoc.locate(str(target))
        if not isinstance(found, type):
            raise ConfigError("batch._target_", target, "must name a batch policy class (module.Class) that imports")
        _check_own(found, cfg.batch)
        return found(cfg, world)
    return load(REGISTRY[str(cfg.batch.policy)])(cfg, world)


def _check_own(policy: type, node: DictConfig) -> None:
    """A policy of your own with a config dataclass (`config`): its batch node holds its keys,
    of their types (bsexp's own are held to their schemas as Hydra composes them)."""
    schema = getattr(policy, "config", None)
    if schema is None:
        return
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        OmegaConf.merge(OmegaConf.structured(schema), node)
    except OmegaConfBaseException as exc:
        key = f"batch.{exc.key}" if getattr(exc, "key", None) else "batch"
        valid = ", ".join(f.name for f in fields(schema))
        raise ConfigError(
            key, getattr(exc, "value", None), f"not valid for {policy.__name__}'s config; its keys: {valid}"
        ) from None
