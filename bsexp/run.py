"""One training job: build the parts from the config, train, evaluate, write `summary.json`."""

from __future__ import annotations

import inspect
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from tqdm.contrib.logging import logging_redirect_tqdm

from bsexp import config as schema
from bsexp.data import Splits, steps_per_epoch, train_batches
from bsexp.errors import ConfigError
from bsexp.metrics import JsonlSink, NullSink, Sinks, WandbSink
from bsexp.optim import ScaledHparams, build_optimizer, build_scheduler, scaled_hparams
from bsexp.plan import BatchPlan
from bsexp.runtime import (autocast, grad_scaler, peak_memory_mb, provenance, reset_peak_memory,
                           resolve_device, seed_everything)
from bsexp.trainer import Loop, Progress, evaluate, train

log = logging.getLogger(__name__)


def _call_target(group: str, node: DictConfig, **given: Any) -> Any:
    """Call `node._target_` with the node's other keys plus `given`, naming any key it rejects."""
    kwargs = OmegaConf.to_container(node, resolve=True)
    target = kwargs.pop("_target_")
    fn = schema.locate(group, target)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins may have no signature: let the call decide
        params = {}
    if params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        for key, value in kwargs.items():
            if key not in params:
                valid = ", ".join(p for p in params if p not in given)
                raise ConfigError(f"{group}.{key}", value, f"not an option of {target}; valid: {valid}")
    try:
        return fn(**kwargs, **given)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{group}._target_", target, " ".join(str(exc).split())) from None


def build_data(cfg: DictConfig) -> Splits:
    splits = _call_target("data", cfg.data)
    if not isinstance(splits, Splits):
        raise ConfigError("data._target_", cfg.data._target_, f"must return bsexp.data.Splits, got {type(splits).__name__}")
    return splits


def build_model(cfg: DictConfig, splits: Splits) -> nn.Module:
    model = _call_target("model", cfg.model, input_shape=splits.input_shape, num_classes=splits.num_classes)
    if not isinstance(model, nn.Module):
        raise ConfigError("model._target_", cfg.model._target_, f"must return a torch.nn.Module, got {type(model).__name__}")
    return model


def build_sinks(cfg: DictConfig, run_dir: Path, derived: dict[str, Any]):
    sinks: list = [JsonlSink(run_dir / "metrics.jsonl")]
    if cfg.logger.kind == schema.LoggerKind.wandb:
        config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
        config["derived"] = derived
        try:
            sinks.append(WandbSink(cfg.logger.wandb, run_dir, config))
        except Exception as exc:  # W&B is a view of the run, never a reason to lose it
            log.warning("W&B could not start (%s); logging locally to %s only", exc, run_dir)
    return Sinks(*sinks)


def build_loop(cfg: DictConfig, plan: BatchPlan) -> Loop:
    """Seed, then build data, model, optimizer and schedule for `plan` (sinks are set later)."""
    device = resolve_device(str(cfg.device))
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    seed_everything(cfg.seed, cfg.trainer.deterministic)
    splits = build_data(cfg).to(device)
    if plan.size > len(splits.train):
        raise ConfigError("batch.size", plan.size, f"exceeds the {len(splits.train)} training samples of {splits.name}")
    model = build_model(cfg, splits).to(device)
    per_epoch = steps_per_epoch(len(splits.train), plan, cfg.batch.drop_last)
    hp, schedule = scaled_hparams(cfg, plan, per_epoch)
    optimizer = build_optimizer(cfg, model, hp)
    precision = str(cfg.precision)
    return Loop(
        model=model, optimizer=optimizer, scheduler=build_scheduler(optimizer, schedule),
        scaler=grad_scaler(device, precision), autocast=autocast(device, precision),
        batches=train_batches(splits, cfg.seed, device), splits=splits, plan=plan, hp=hp,
        sinks=NullSink(), device=device, epochs=cfg.epochs, clip_grad_norm=cfg.trainer.clip_grad_norm,
        eval_every_steps=cfg.trainer.eval_every_steps, eval_batch_size=cfg.trainer.eval_batch_size,
        drop_last=cfg.batch.drop_last, progress=cfg.trainer.progress,
    )


def run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """The whole job; `summary.json` is written whatever the outcome, W&B always finished."""
    started = time.perf_counter()
    plan = schema.check(cfg)
    loop = build_loop(cfg, plan)
    _announce(cfg, loop)
    loop.sinks = build_sinks(cfg, run_dir, derived=_derived(plan, loop.hp))
    status, progress, test = "failed", Progress(), None
    reset_peak_memory(loop.device)
    try:
        with logging_redirect_tqdm():
            status = train(loop, progress)
        if loop.splits.test is not None and status == "completed":
            test = evaluate(loop, loop.splits.test)
    finally:
        summary = make_summary(cfg, status, loop, progress, test, time.perf_counter() - started)
        write_json(run_dir / "summary.json", summary)
        loop.sinks.summary(summary)
        loop.sinks.close(status)
    print_summary(summary, run_dir)
    return summary


def _derived(plan: BatchPlan, hp: ScaledHparams) -> dict[str, Any]:
    return {"batch_size": plan.size, "micro_size": plan.micro_size, "accum_steps": plan.accum_steps,
            "world_size": plan.world_size, "k": hp.k, "lr": hp.lr, "weight_decay": hp.weight_decay,
            "warmup_steps": hp.warmup_steps, "total_steps": hp.total_steps}


def _announce(cfg: DictConfig, loop: Loop) -> None:
    splits, plan, hp = loop.splits, loop.plan, loop.hp
    params = sum(p.numel() for p in loop.model.parameters())
    log.info("data %s: %d train / %d val / %s test, input %s, %d classes", splits.name, len(splits.train),
             len(splits.val), len(splits.test) if splits.test is not None else "no", splits.input_shape,
             splits.num_classes)
    log.info("model %s: %s parameters, on %s, %s", cfg.model._target_, f"{params:,}", loop.device, cfg.precision)
    log.info("batch %d = micro %d x accum %d x world %d; k = %d/%d = %g", plan.size, plan.micro_size,
             plan.accum_steps, plan.world_size, plan.size, cfg.scaling.ref_batch, hp.k)
    log.info("lr %.4g (%s rule from %g), weight decay %.4g (%s rule from %g), warmup %d of %d steps",
             hp.lr, cfg.scaling.lr_rule, cfg.optimizer.lr, hp.weight_decay, cfg.scaling.wd_rule,
             cfg.optimizer.get("weight_decay", 0.0), hp.warmup_steps, hp.total_steps)


def make_summary(cfg: DictConfig, status: str, loop: Loop, progress: Progress,
                 test: tuple[float, float] | None, wall_time_s: float) -> dict[str, Any]:
    plan, hp = loop.plan, loop.hp
    last = progress.records[-1] if progress.records else {}
    return {
        "status": status,
        "batch_size": plan.size,
        "micro_size": plan.micro_size,
        "accum_steps": plan.accum_steps,
        "world_size": plan.world_size,
        "ref_batch": cfg.scaling.ref_batch,
        "k": hp.k,
        "lr": hp.lr,
        "weight_decay": hp.weight_decay,
        "base_lr": cfg.optimizer.lr,
        "base_weight_decay": cfg.optimizer.get("weight_decay", 0.0),
        "lr_rule": str(cfg.scaling.lr_rule),
        "wd_rule": str(cfg.scaling.wd_rule),
        "warmup_steps": hp.warmup_steps,
        "epochs": last.get("epoch", 0),
        "steps": progress.step,
        "samples_seen": progress.samples_seen,
        "train_loss": last.get("train_loss"),
        "train_acc": last.get("train_acc"),
        "val_loss": last.get("val_loss"),
        "val_acc": last.get("val_acc"),
        "best_val_acc": progress.best_val_acc if progress.records else None,
        "test_loss": test[0] if test else None,
        "test_acc": test[1] if test else None,
        "gen_gap": last.get("gen_gap"),
        "wall_time_s": wall_time_s,
        "train_time_s": progress.train_time_s,
        "samples_per_s": progress.samples_seen / progress.train_time_s if progress.train_time_s else None,
        "peak_memory_mb": peak_memory_mb(loop.device),
        "seed": cfg.seed,
        "data": loop.splits.name,
        "model": cfg.model._target_,
        "parameters": sum(p.numel() for p in loop.model.parameters()),
        "optimizer": cfg.optimizer._target_,
        "precision": str(cfg.precision),
        "device": str(loop.device),
        "provenance": provenance(),
    }


def write_json(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    pct = lambda v: "-" if v is None else f"{100 * v:.2f} %"  # noqa: E731
    rows = [
        ("status", summary["status"]),
        ("data / model", f"{summary['data']} / {summary['model'].rsplit('.', 1)[-1]} "
                         f"({summary['parameters']:,} parameters)"),
        ("batch", f"{summary['batch_size']} = {summary['micro_size']} micro x {summary['accum_steps']} "
                  f"accum x {summary['world_size']} ranks"),
        ("lr / weight decay", f"{summary['lr']:.4g} ({summary['lr_rule']}, k={summary['k']:g}) / "
                              f"{summary['weight_decay']:.4g} ({summary['wd_rule']})"),
        ("epochs / steps", f"{summary['epochs']:g} / {summary['steps']}"),
        ("train acc", pct(summary["train_acc"])),
        ("val acc (best)", f"{pct(summary['val_acc'])} ({pct(summary['best_val_acc'])})"),
        ("test acc", pct(summary["test_acc"])),
        ("generalisation gap", pct(summary["gen_gap"])),
        ("train time", f"{summary['train_time_s']:.1f} s ({summary['samples_per_s'] or 0:,.0f} samples/s)"),
        ("peak memory", f"{summary['peak_memory_mb']:,.0f} MB"),
        ("outputs", str(run_dir)),
    ]
    width = max(len(name) for name, _ in rows)
    print("\n".join(f"  {name:<{width}}  {value}" for name, value in rows), flush=True)
