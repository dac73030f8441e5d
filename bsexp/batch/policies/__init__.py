"""Batch policies: one module per `batch=` option (and the branch), each a small class behind one
narrow interface (bsexp.batch.policies.interface: the `BatchPolicy` and `OptionalHooks`
protocols, the `Hooks` that fill in their defaults), registered here and nowhere else.

A policy is made from its own config dataclass and a `RunSpec` (the run's epochs, step budget,
ranks, scaling rules, ...): `policy_for` builds both from the composed config, the one place a
policy's values are read from it, so a policy's tests need no Hydra. Policies share behaviour
through plain functions (bsexp.batch.policies.shared), never through a base class. Torch-free:
what a policy measures comes through the `Probe` (bsexp.train.loop builds it).
"""

from __future__ import annotations

import pydoc
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bsexp.batch.hparams import Rules
from bsexp.batch.policies.accumulation import Accumulation
from bsexp.batch.policies.adaptive import Adaptive
from bsexp.batch.policies.branch import Branch, BranchBatch
from bsexp.batch.policies.finder import Finder
from bsexp.batch.policies.fixed import Fixed
from bsexp.batch.policies.interface import BatchPolicy, Hooks, OptionalHooks, conform
from bsexp.batch.policies.scheduled import Scheduled
from bsexp.batch.policies.shared import Probe, RunSpec
from bsexp.errors import ConfigError

__all__ = [
    "REGISTRY",
    "BatchPolicy",
    "Branch",
    "BranchBatch",
    "Hooks",
    "OptionalHooks",
    "Probe",
    "RunSpec",
    "config_of",
    "policy_for",
    "run_spec",
]

# `batch.policy` -> the class that implements it: the one place a policy is registered (the names
# are batch.policy's choices, bsexp.batch.policies.shared.POLICIES, in this order).
REGISTRY: dict[str, type[BatchPolicy]] = {
    policy.name: policy for policy in (Fixed, Accumulation, Finder, Scheduled, Adaptive)
}


def policy_for(cfg: DictConfig, world: int, trunk: Mapping[str, Any] | None = None) -> BatchPolicy:
    """The policy `batch.policy` names (a branch where branch.trunk is set; one of your own where
    batch._target_ names it), for `world` ranks; `trunk`: where a branch starts
    (bsexp.runs.trunk.find), known once the trunk's checkpoint is found."""
    target = cfg.batch.get("_target_")
    if target:  # a policy of your own, named by its batch/<name>.yaml as a model or dataset is
        own = pydoc.locate(str(target))
        if not isinstance(own, type):
            raise ConfigError("batch._target_", target, "must name a batch policy class (module.Class) that imports")
        conform(own, "batch._target_", target)
        policy = own
    else:
        policy = REGISTRY[str(cfg.batch.policy)]
    config, spec = _config(policy, cfg.batch), run_spec(cfg, world, trunk)
    if cfg.get("branch") is not None and cfg.branch.trunk is not None:  # whatever batch.policy (Branch.check
        return Branch(config=BranchBatch(config, OmegaConf.to_object(cfg.branch)), spec=spec)  # takes two)
    return policy(config=config, spec=spec)


def config_of(name: str) -> type:
    """The config dataclass of a registered policy (its `config`, beside it in its module)."""
    return REGISTRY[name].config  # type: ignore[attr-defined]


def run_spec(cfg: DictConfig, world: int, trunk: Mapping[str, Any] | None = None) -> RunSpec:
    """What a policy may read of the run beyond its own config, from the composed config."""
    return RunSpec(
        epochs=cfg.epochs,
        world_size=world,
        max_steps=cfg.trainer.max_steps,
        drop_last=bool(cfg.batch.get("drop_last", False)),
        rules=Rules.of(cfg),
        noise_scale=str(cfg.trainer.noise_scale),
        data_in_memory=bool(cfg.data.get("in_memory", True)),
        trunk=trunk,
    )


def _config(policy: type, node: DictConfig) -> Any:
    """The batch node as the policy's config dataclass (`config`, beside it in its module): its
    keys, of their types (a policy of your own is held to its schema here; bsexp's, as Hydra composes
    them). A policy with no `config` gets the node as a plain dict."""
    schema = getattr(policy, "config", None)
    if schema is None:
        return OmegaConf.to_container(node, resolve=True)
    if OmegaConf.get_type(node) is schema:  # composed on its schema: typed, and resolved where it stands
        return OmegaConf.to_object(node)
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), node))
    except OmegaConfBaseException as exc:
        key = f"batch.{exc.key}" if getattr(exc, "key", None) else "batch"
        valid = ", ".join(f.name for f in fields(schema))
        raise ConfigError(
            key, getattr(exc, "value", None), f"not valid for {policy.__name__}'s config; its keys: {valid}"
        ) from None
