"""What a run tells about itself: the values it derived (logged at the start, and in W&B's
config), `summary.json` at the end, and the table printed for a person."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from bsexp.batch.scaling import cautions
from bsexp.engine.distributed import World
from bsexp.engine.gradient_noise import NoiseScale
from bsexp.runs.ladder import Ladder
from bsexp.system.runtime import compiled_graphs, peak_memory_mb, provenance, run_speed

log = logging.getLogger(__name__)
_FOLLOWED = ("dropout", "bn_momentum")  # the regularisers that follow the batch (bsexp.engine.regularisers)


def hyperparameters(cfg: DictConfig, loop) -> dict[str, Any]:
    """What the batch policy and the scaling rules made of the config: logged, and in summary.json
    (the plan the run starts with; `final_*` in the summary say where it ended)."""
    plan, hp = loop.batch_control.current, loop.batch_control.described(loop.hp)
    return {
        "batch_size": plan.size,
        "micro_size": plan.micro_size,
        "accum_steps": plan.accum_steps,
        "world_size": plan.world_size,
        "ref_batch": cfg.scaling.ref_batch,
        "k": hp.k,
        "lr_rule": str(cfg.scaling.lr_rule),
        "wd_rule": str(cfg.scaling.wd_rule),
        "base_lr": cfg.optimizer.lr,
        "momentum": cfg.optimizer.get("momentum"),  # as the optimizer's config has it (the tuning's, where searched)
        "base_weight_decay": cfg.optimizer.weight_decay,
        "lr": hp.lr,
        "lr_peak": hp.lr_peak,
        "weight_decay": hp.weight_decay,
        "warmup": cfg.schedule.warmup,  # in schedule.unit, as configured (the tuning's, where searched)
        "warmup_shape": str(cfg.schedule.warmup_shape),
        "warmup_steps": hp.warmup_steps,
        "total_steps": hp.total_steps,
        **loop.regularisers.values(plan.size),  # dropout and BatchNorm momentum at the first batch
    }


def announce(cfg: DictConfig, loop, hparams: dict[str, Any]) -> None:
    """The run's set-up, logged before it trains: its data, model and speed, its batch and what the
    rules derived from it, and the cautions about that set-up."""
    _announce_setup(cfg, loop)
    _announce_batch(hparams, loop.splits.tokens.context if loop.splits.tokens is not None else None)
    if loop.batch_control.hooks.own_setup:  # the trunk's set-up was cautioned about; a branch only continues it
        _caution(cfg, loop, hparams)


def _announce_setup(cfg: DictConfig, loop) -> None:
    splits = loop.splits
    params = sum(p.numel() for p in loop.step.net.parameters())
    log.info(
        "data %s: %d train / %d val / %s test, input %s, %d classes",
        splits.name,
        len(splits.train),
        len(splits.val),
        len(splits.test) if splits.test is not None else "no",
        splits.input_shape,
        splits.num_classes,
    )
    if splits.tokens is not None:
        _announce_tokens(splits.tokens)
    log.info("model %s: %s parameters, on %s, %s", cfg.model._target_, f"{params:,}", loop.world.device, cfg.precision)
    log.info("speed %s: %s", cfg.trainer.speed, _speed_words(run_speed_of(cfg, loop)))


def _announce_tokens(tokens) -> None:
    floor = (
        f"its loss floor {tokens.floor:.4f} nats per token over windows of {tokens.context} "
        f"(entropy rate {tokens.entropy_rate:.4f})"
        if tokens.floor is not None
        else "no known loss floor"
    )
    log.info("text: %s; a sample is %d tokens; %s", tokens.source, tokens.context, floor)


def run_speed_of(cfg: DictConfig, loop):
    """trainer.speed as this run resolved it, the optimizer's fused kernel as built (an optimizer
    without one, timm's LARS or LAMB, steps as it comes on the fast path too)."""
    speed = run_speed(cfg, loop.world.device, loop.step.net)
    return replace(speed, fused_optimizer=bool(loop.step.optimizer.defaults.get("fused")))


def _speed_words(speed) -> str:
    """How the run computes, as its log says it: only what applies on its device."""
    if not speed.fast:
        return "reproducible (deterministic algorithms, no autotuner, eager)"
    parts = ["no deterministic algorithms"]
    if speed.cuda:
        parts += [*(["cuDNN autotuner"] if speed.cudnn_benchmark else []), "TF32"]
    parts += [
        *(["fused optimizer"] if speed.fused_optimizer else []),
        *(["channels_last"] if speed.channels_last else []),
    ]
    parts.append(f"torch.compile {speed.compile}" if speed.compile else "eager")
    return f"fast ({', '.join(parts)})"


def _announce_batch(h: dict[str, Any], context: int | None = None) -> None:
    """`context`: a language model's tokens per sequence; its batches (sequences) are said in tokens too."""
    log.info(
        "batch %d = micro %d x accum %d x world %d; k = %d/%d = %g%s",
        h["batch_size"],
        h["micro_size"],
        h["accum_steps"],
        h["world_size"],
        h["batch_size"],
        h["ref_batch"],
        h["k"],
        ""
        if context is None
        else f" (sequences of {context} tokens: {h['batch_size'] * context:,} tokens a step, "
        f"{h['ref_batch'] * context:,} at scaling.ref_batch)",
    )
    log.info(
        "lr %.4g (%s rule from %g), weight decay %.4g (%s rule from %g), warmup %d of %d steps",
        h["lr"],
        h["lr_rule"],
        h["base_lr"],
        h["weight_decay"],
        h["wd_rule"],
        h["base_weight_decay"],
        h["warmup_steps"],
        h["total_steps"],
    )
    if h["dropout_rule"] != "none" or h["bn_momentum_rule"] != "none":  # moved with the batch
        log.info(
            "dropout %.4g (%s rule from %s), BatchNorm momentum %.4g (%s rule from %s)",
            h["dropout"] or 0.0,
            h["dropout_rule"],
            h["base_dropout"],
            h["bn_momentum"] or 0.0,
            h["bn_momentum_rule"],
            h["base_bn_momentum"],
        )


def _caution(cfg: DictConfig, loop, h: dict[str, Any]) -> None:
    run = loop.batch_control.layout.run
    per_epoch = run.epoch_steps(0) if run.epoch_starts else run.total  # a whole epoch's, where max_steps cut it
    for key, what in cautions(
        h["lr"] / h["base_lr"],
        str(cfg.schedule.warmup_shape),
        h["warmup_steps"],
        h["total_steps"],
        per_epoch,
        h["lr_peak"] / h["lr"],
        h["bn_momentum"] if h["bn_momentum_rule"] != "none" else None,
    ):
        log.warning("%s: %s", key, what)
    adam = "adam" in str(cfg.optimizer._target_).lower()  # Adam, AdamW, a user's Adam of their own
    if adam and h["lr_rule"] == "linear" and h["k"] != 1:
        log.warning(
            "scaling.lr_rule: linear with %s: Adam's step is scale-free, and the rule derived for it is the "
            "square root (Malladi et al. 2022: batch x k, LR x sqrt(k)); scaling.lr_rule=sqrt applies it",
            cfg.optimizer._target_,
        )


def make_summary(
    cfg: DictConfig,
    status: str,
    loop,
    hparams: dict[str, Any],
    state,
    test: tuple[float, float] | None,
    wall_time_s: float,
) -> dict[str, Any]:
    """summary.json: the run's final figures (docs: Outputs and logging), with what it used."""
    last = state.records[-1] if state.records else {}
    plan, device, noise = loop.batch_control.current, loop.world.device, loop.step.noise
    samples_per_s = (state.samples_seen - state.samples_before) / state.train_time_s if state.train_time_s else None
    return {
        "status": status,
        **hparams,
        "diverged_at_step": state.diverged_at_step,
        # where trainer.stop_metric reached trainer.stop_at (or the ladder's top) and the run ended
        "stopped_at": state.stopped_at,
        # Where the run first reached each rung of trainer.ladder (bsexp.runs.ladder): step, samples, LR
        "ladder": Ladder.of(cfg.trainer).read(state.records) if cfg.trainer.get("ladder") else None,
        "last_finite_loss": state.last_finite_loss,
        "final_batch_size": plan.size,  # where a batch schedule ended
        "final_micro_size": plan.micro_size,  # after any OOM recovery
        # The dropout rate and BatchNorm momentum the last batch trained with (their rules follow it).
        **{f"final_{key}": value for key, value in loop.regularisers.values(plan.size).items() if key in _FOLLOWED},
        "oom_recoveries": loop.batch_control.oom_recoveries,
        "epochs": last.get("epoch", 0),  # completed, as a fraction where the run stopped mid-epoch
        "steps": state.step,
        "samples_seen": state.samples_seen,
        **{key: last.get(key) for key in ("train_loss", "train_acc", "val_loss", "val_acc", "gen_gap")},
        "best_val_acc": state.best_val_acc if state.records else None,
        "test_loss": test[0] if test else None,
        "test_acc": test[1] if test else None,
        "wall_time_s": wall_time_s,
        "train_time_s": state.train_time_s,
        "samples_per_s": samples_per_s,
        "peak_memory_mb": _peak_memory_mb(loop.world, status),
        "seed": cfg.seed,
        "data": loop.splits.name,
        "model": cfg.model._target_,
        "num_classes": loop.splits.num_classes,
        "parameters": sum(p.numel() for p in loop.step.net.parameters()),
        "optimizer": cfg.optimizer._target_,
        "precision": str(cfg.precision),
        "device": str(device),
        "threads": loop.threads.first,  # the CPU threads it started training with, then where they moved:
        "threads_changes": [{"step": step, "threads": n} for step, n in loop.threads.changes],
        "openmp_wait_policy": os.environ.get("OMP_WAIT_POLICY") or "default",  # chosen before torch loaded
        "speed": run_speed_of(cfg, loop).summary(),
        "compiled_graphs": compiled_graphs() - loop.graphs_before,  # torch.compile's: 1 a graph, more on recompiles
        "cuda_graphs": loop.step.graphs.summary() if loop.step.graphs is not None else None,  # trainer.cuda_graphs
        "finder": loop.batch_control.found.summary() if loop.batch_control.found is not None else None,
        **loop.batch_control.summary(state.samples_seen),
        **(noise.scale if noise is not None else NoiseScale()).summary(),
        "provenance": provenance(),
        **_in_tokens_summary(loop.splits.tokens, hparams["batch_size"], state, samples_per_s, last.get("val_loss")),
    }


def _in_tokens_summary(tokens, batch_size: int, state, samples_per_s: float | None, val_loss: float | None):
    """A language model's: tokens beside samples, the loss against the data's floor, bits per byte."""
    return {} if tokens is None else tokens.summary(batch_size, state.samples_seen, samples_per_s, val_loss)


def _peak_memory_mb(world: World, status: str) -> float:
    """The most any rank held; after a failure this rank's (a collective could meet a peer stuck in
    another one)."""
    mine = peak_memory_mb(world.device)
    return mine if status in ("failed", "preempted") else _max_over_ranks(world, mine)


def _max_over_ranks(world: World, value: float) -> float:
    return world.all_reduce(torch.tensor([value], dtype=torch.float64, device=world.device), op="max").item()


def _changes(summary: dict[str, Any]) -> str:
    """How the batch moved during the run: the schedule's last batch, OOM recoveries."""
    notes = []
    if summary["final_batch_size"] != summary["batch_size"]:
        notes.append(f"grew to {summary['final_batch_size']}")
    if summary["oom_recoveries"]:
        notes.append(f"{summary['oom_recoveries']} OOM recoveries, final micro {summary['final_micro_size']}")
    return f" ({'; '.join(notes)})" if notes else ""


def print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    pct = lambda v: "-" if v is None else f"{100 * v:.2f} %"  # noqa: E731
    rows = [
        ("status", summary["status"]),
        (
            "data / model",
            f"{summary['data']} / {summary['model'].rsplit('.', 1)[-1]} ({summary['parameters']:,} parameters)",
        ),
        (
            "batch",
            f"{summary['batch_size']} = {summary['micro_size']} micro x {summary['accum_steps']} "
            f"accum x {summary['world_size']} ranks" + _changes(summary),
        ),
        (
            "lr / weight decay",
            f"{summary['lr']:.4g} ({summary['lr_rule']}, k={summary['k']:g}) / "
            f"{summary['weight_decay']:.4g} ({summary['wd_rule']})",
        ),
        ("epochs / steps", f"{summary['epochs']:g} / {summary['steps']}"),
        ("train acc", pct(summary["train_acc"])),
        ("val acc (best)", f"{pct(summary['val_acc'])} ({pct(summary['best_val_acc'])})"),
        ("test acc", pct(summary["test_acc"])),
        ("generalisation gap", pct(summary["gen_gap"])),
        ("train time", f"{summary['train_time_s']:.1f} s ({summary['samples_per_s'] or 0:,.0f} samples/s)"),
        ("peak memory", f"{summary['peak_memory_mb']:,.0f} MB"),
        ("outputs", str(run_dir)),
    ]
    if summary.get("context") is not None:
        rows = _in_tokens(summary, rows)
    width = max(len(name) for name, _ in rows)
    print("\n".join(f"  {name:<{width}}  {value}" for name, value in rows), flush=True)


def _in_tokens(summary: dict[str, Any], rows: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A language model's table: batches, data and speed in tokens beside sequences, and the loss
    (nats per token) against the data's floor where it has one, instead of the accuracies."""
    number = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    floor = summary.get("loss_floor")
    above = "" if floor is None else f"; floor {floor:.4f}, {summary['loss_above_floor']:+.4f} above it"
    bpb = "" if summary.get("val_bpb") is None else f"; {summary['val_bpb']:.4f} bits per byte"
    loss_rows = [
        ("train loss", f"{number(summary['train_loss'], '.4f')} nats/token"),
        ("val loss", f"{number(summary['val_loss'], '.4f')} nats/token{above}{bpb}"),
        ("val token acc", f"{number(summary['val_acc'] and 100 * summary['val_acc'], '.2f')} %"),
    ]
    out = []
    for name, value in rows:
        if name == "batch":
            value += f" (sequences of {summary['context']}: {summary['tokens_per_step']:,} tokens a step)"
        elif name == "epochs / steps":
            name, value = "epochs / steps / tokens", f"{value} / {summary['tokens_seen']:,}"
        elif name == "train time":
            value = value[:-1] + f", {summary['tokens_per_s'] or 0:,.0f} tokens/s)"
        elif name == "train acc":
            out += loss_rows
        if name not in ("train acc", "val acc (best)", "test acc", "generalisation gap"):
            out.append((name, value))
    return out
