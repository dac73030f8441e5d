"""The checks a config passes before anything is built or written: one validator over every
bound the schemas declare beside their fields, the few rules that relate keys, and the
`_target_` callables a config names. Torch-free, so a wrong config is refused in a second.

The batch policy's own rules (a batch that divides over the ranks, a schedule that stays whole)
are the policy's (`bsexp.batch.policies`)."""

from __future__ import annotations

import dataclasses
import inspect
import os
import pydoc
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from bsexp.config import schema
from bsexp.errors import ConfigError, did_you_mean


def check(cfg: DictConfig) -> None:
    """Every check that needs neither data nor torch; raises ConfigError on the first problem."""
    _check_known_keys(cfg)
    for key in ("lr", "weight_decay", "decay_norm_and_bias"):
        if key not in cfg.optimizer:
            raise ConfigError(
                f"optimizer.{key}",
                None,
                "must be set (an optimizer config of your own can start with `defaults: [/schema_optimizer@_here_]`)",
            )
    _check_bounds(cfg)
    if "betas" in cfg.optimizer and len(cfg.optimizer.betas) != 2:
        raise ConfigError(
            "optimizer.betas", list(cfg.optimizer.betas), "must be two values in [0, 1), e.g. [0.9,0.999]"
        )
    _check_increasing("schedule.milestones", list(cfg.schedule.milestones))
    _check_ladder(cfg.trainer)
    _check_tune_target(cfg.get("tune"))  # before trainer.stop_at, which steps to result sets from it
    _check_stop_target(cfg.trainer)
    if cfg.schedule.main == schema.MainSchedule.step and not cfg.schedule.milestones:
        raise ConfigError("schedule.milestones", [], "schedule.main=step needs at least one milestone")
    node = cfg.get("branch")
    if node is not None and node.trunk is None and (node.at_samples is not None or node.samples is not None):
        given = "branch.at_samples" if node.at_samples is not None else "branch.samples"
        raise ConfigError(
            "branch.trunk",
            None,
            f"{given} is set but not the trunk to branch from: give branch.trunk=<the trunk's run or sweep directory>",
        )
    if cfg.model.get("ghost_batch") is not None and cfg.distributed.sync_batchnorm:
        raise ConfigError(
            "distributed.sync_batchnorm",
            True,
            "model.ghost_batch normalises each rank's own ghost batches; valid with it: null or false",
        )
    _check_ranks_need_ddp(cfg)
    check_compile_mode(cfg.trainer.get("compile_mode"))
    check_gpus(cfg)
    for group in ("data", "model", "optimizer"):
        locate(group, cfg[group].get("_target_"))


def _check_ranks_need_ddp(cfg: DictConfig) -> None:
    """distributed.nproc_per_node starts ranks with distributed=ddp only (torchrun names its own)."""
    from bsexp.config.env import under_torchrun

    if (
        cfg.distributed.kind != schema.DistributedKind.ddp
        and not under_torchrun()
        and cfg.distributed.nproc_per_node > 1
    ):
        raise ConfigError(
            "distributed.nproc_per_node",
            cfg.distributed.nproc_per_node,
            "starts that many ranks with distributed=ddp only; add distributed=ddp, or leave it at 1",
        )


# torch.compile's modes that bsexp trains under (bsexp.system.runtime.speed_for); none (the default):
# the fast path's other settings, eager. On an H200 the compiled step (inductor, the batch
# dimension dynamic) ran slower than the eager one for both of bsexp's benchmark models, and its
# compile costs seconds a run (docs: GPUs). The modes that record CUDA graphs (reduce-overhead,
# max-autotune) are refused: a graph's backward output becomes a parameter's .grad and the next
# micro-batch's replay overwrites it, so accumulated gradients come out wrong or the step fails
# (pytorch/pytorch#169545; seen on the H200), and any bsexp run can accumulate (OOM recovery, the
# finder, adaptive).
COMPILE_MODES = ("none", "default", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def check_compile_mode(mode: str | None) -> None:
    """trainer.compile_mode: one of COMPILE_MODES, or null (none); the reason where CUDA graphs."""
    if (mode or "none") in COMPILE_MODES:
        return
    why = " (CUDA graphs overwrite accumulated gradients: pytorch/pytorch#169545)" if mode in CUDA_GRAPH_MODES else ""
    raise ConfigError("trainer.compile_mode", mode, f"valid: {', '.join(COMPILE_MODES)}{why}")


def check_gpus(cfg: DictConfig, count: int | None = None) -> None:
    """CUDA where the run asks for it (a device, NCCL), and a GPU of its own for each rank of this
    node: before any worker starts (self-launched) or any process group forms (torchrun).
    `count`: the GPUs visible (torch is asked when None)."""
    from bsexp.config.env import launches_workers, under_torchrun

    ddp = under_torchrun() or cfg.distributed.kind == schema.DistributedKind.ddp
    if under_torchrun():
        key, ranks = "--nproc_per_node (torchrun)", int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    elif launches_workers(cfg):
        key, ranks = "distributed.nproc_per_node", int(cfg.distributed.nproc_per_node)
    else:
        key, ranks = None, 1
    nccl = ddp and cfg.distributed.backend == schema.Backend.nccl
    if not nccl and (cfg.device == schema.Device.cpu or (cfg.device == schema.Device.auto and key is None)):
        return
    from bsexp.system.runtime import gpus

    if count is None:
        import torch  # counting the GPUs does not start CUDA

        count = torch.cuda.device_count()
    if cfg.device == schema.Device.cuda and count == 0:
        raise ConfigError("device", "cuda", "CUDA is not available here; valid: auto, cpu")
    if nccl and (cfg.device == schema.Device.cpu or count == 0):
        raise ConfigError(
            "distributed.backend", "nccl", "NCCL needs CUDA GPUs and this run trains on the CPU; valid here: auto, gloo"
        )
    if key is not None and 0 < count < ranks:
        raise ConfigError(
            key,
            ranks,
            f"{gpus(count)} visible and each rank needs its own; valid: at most {count}, "
            f"or device=cpu to run the ranks on the CPU",
        )


def _check_bounds(node: DictConfig, prefix: str = "") -> None:
    """Every field of a bsexp schema that carries a bound, wherever the node stands (a user's own
    model or dataset node, of no bsexp schema, is left to its own callable)."""
    cls = OmegaConf.get_type(node)
    fields = {f.name: f for f in dataclasses.fields(cls)} if _is_schema(cls) else {}
    for key in node:
        child = node._get_node(key)
        full = f"{prefix}{key}"
        if isinstance(child, DictConfig):
            _check_bounds(child, f"{full}.")
            continue
        spec = fields.get(str(key))
        bound = spec.metadata.get("bound") if spec is not None else None
        if bound is None or child._is_missing() or node[key] is None:
            continue
        value = node[key]
        if isinstance(value, ListConfig):
            _check_list(full, list(value), bound)
        elif not bound.holds(value):
            finite = "a finite number " if isinstance(value, float) else ""
            why = spec.metadata.get("why")
            raise ConfigError(full, value, f"must be {finite}{bound.text}" + (f" {why}" if why else ""))


def _check_list(key: str, values: list, bound: schema.Bound) -> None:
    if (bound.nonempty and not values) or not all(isinstance(v, (int, float)) and bound.holds(v) for v in values):
        noun = "sizes" if bound.low is not None and bound.low >= 1 else "values"
        raise ConfigError(key, values, f"must be a {'non-empty ' if bound.nonempty else ''}list of {noun} {bound.text}")


def _check_stop_target(trainer: DictConfig) -> None:
    """trainer.stop_at of trainer.stop_metric: an accuracy's target is a fraction (a loss's any value >= 0)."""
    _check_target("trainer.stop_at", trainer.stop_at, "trainer.stop_metric", str(trainer.stop_metric))


def _check_tune_target(tune: DictConfig | None) -> None:
    """tune.target of tune.metric (steps to result): an accuracy's is a fraction, a loss's any value >= 0."""
    if tune is not None:
        _check_target("tune.target", tune.get("target"), "tune.metric", str(tune.get("metric") or "val_acc"))


def _check_target(key: str, value: float | None, metric_key: str, metric: str) -> None:
    if value is not None and metric not in schema.LOWER_IS_BETTER and value > 1:
        raise ConfigError(key, value, f"{metric_key}={metric} is an accuracy: valid: a fraction in [0, 1]")


def _check_increasing(key: str, values: list) -> None:
    if values != sorted(values):
        raise ConfigError(key, values, "must be non-negative and increasing")


def _check_ladder(trainer: DictConfig) -> None:
    """trainer.ladder: rungs from the easiest to the hardest (an accuracy's rising, within 1; a
    loss's falling); trainer.ladder_stop needs a top rung to stop at."""
    rungs, metric = list(trainer.ladder), str(trainer.ladder_metric)
    lower = metric in schema.LOWER_IS_BETTER
    pairs = list(zip(rungs, rungs[1:]))
    if not all(b < a if lower else b > a for a, b in pairs) or (not lower and any(r > 1 for r in rungs)):
        how = "falling (a loss's, easiest first)" if lower else "rising within [0, 1] (an accuracy's, easiest first)"
        raise ConfigError("trainer.ladder", rungs, f"must be strictly {how} for trainer.ladder_metric={metric}")
    if trainer.ladder_stop and not rungs:
        raise ConfigError("trainer.ladder_stop", True, "needs trainer.ladder: the rungs whose top it stops at")


def _is_schema(cls: Any) -> bool:
    """A dataclass of bsexp's (bsexp.config.schema's, or a batch policy's own config)."""
    return dataclasses.is_dataclass(cls) and cls.__module__.startswith("bsexp.")


def _check_known_keys(cfg: DictConfig, prefix: str = "") -> None:
    """Hydra's `+key=value` adds keys past the schema; refuse any a schema does not define."""
    for key in cfg:
        if prefix == "" and key == "hydra":
            continue
        node = cfg._get_node(key)
        cls = OmegaConf.get_type(cfg)
        if dataclasses.is_dataclass(cls) and key not in {f.name for f in dataclasses.fields(cls)}:
            full = f"{prefix}{key}"
            names = [f.name for f in dataclasses.fields(cls)]
            raise ConfigError(
                full,
                cfg[key],
                f"not a key of {prefix.rstrip('.') or 'the config'}"
                f"{did_you_mean(full, names)}; valid: {', '.join(names)}",
            )
        if isinstance(node, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(node)):
            _check_known_keys(node, f"{prefix}{key}.")


def locate(group: str, target: Any) -> Any:
    """The callable a `_target_` names, or a ConfigError naming `<group>._target_`."""
    if not isinstance(target, str) or not target:
        raise ConfigError(f"{group}._target_", target, "must name an importable callable")
    try:
        obj = pydoc.locate(target)
    except pydoc.ErrorDuringImport as exc:
        raise ConfigError(f"{group}._target_", target, f"failed to import ({exc.value})") from None
    if obj is None:
        raise ConfigError(f"{group}._target_", target, "cannot be imported: no module or attribute of that name")
    if not callable(obj):
        raise ConfigError(f"{group}._target_", target, "is not callable")
    return obj


def call_target(group: str, node: DictConfig, *args: Any, exclude: tuple[str, ...] = (), **given: Any) -> Any:
    """Call `node._target_` with the node's keys (less `exclude`) plus `given`, naming any key it
    rejects. Enum values arrive as plain strings, as a user's callable expects."""
    kwargs = OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    target = kwargs.pop("_target_")
    for key in exclude:
        kwargs.pop(key, None)
    fn = locate(group, target)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins may have no signature: let the call decide
        params = {}
    if params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        for key, value in kwargs.items():
            if key not in params:
                valid = ", ".join(p for p in list(params)[len(args) :] if p not in given)
                raise ConfigError(f"{group}.{key}", value, f"not an option of {target}; valid: {valid}")
    try:
        return fn(*args, **kwargs, **given)
    except (TypeError, ValueError, RuntimeError) as exc:
        reason = " ".join(str(exc).split())
        raise ConfigError(f"{group}._target_", target, f"rejected the options in {group}.* ({reason})") from None
