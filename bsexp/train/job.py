"""One training job on this rank: the world, the run's parts (resumed from a checkpoint where
asked), its outputs (sinks, finder.json), training under signals, the test split, and
`summary.json` — written by rank 0 whatever the outcome, and the W&B run always finished."""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from tqdm.contrib.logging import logging_redirect_tqdm

from bsexp.config.env import restarted
from bsexp.engine.build import build_sinks
from bsexp.engine.distributed import World, close_world, init_world
from bsexp.errors import one_line
from bsexp.runs import checkpoint as ckpt
from bsexp.runs import resume
from bsexp.runs.trunk import find as find_trunk
from bsexp.system import cores, memory
from bsexp.system.io import remove_leftovers, reserve, write_json
from bsexp.system.runtime import limit_memory, reset_peak_memory, unlimit_memory
from bsexp.system.signals import stop_on_signals
from bsexp.train.loop import TrainState, build_loop, train
from bsexp.train.summary import announce, hyperparameters, make_summary, print_summary

log = logging.getLogger(__name__)
SUMMARY_ROOM = 2**16  # bytes kept free for summary.json (a few kB) from the start of training


def run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """The whole job on this rank; returns its summary."""
    started = time.perf_counter()
    if cfg.trainer.memory_limit_gb is not None:  # before threads that would take arenas of their own
        memory.one_arena()
    world = init_world(str(cfg.device), str(cfg.distributed.backend), cfg.distributed.timeout_s)
    run_dir = Path(world.broadcast_object(str(run_dir)))  # rank 0's, where ranks disagree
    summary = _run_on(world, cfg, run_dir, started)
    # Only after a clean run: tearing the group down while a failed rank's peers still wait in a
    # collective aborts the process before its error is reported; the process ends anyway.
    close_world(world)
    return summary


def _completed(world: World, run_dir: Path, step: int) -> dict[str, Any] | None:
    """The summary of the run in `run_dir` when it completed at `step`, the step a resume would
    continue from (rank 0's reading): resuming it would only evaluate and rewrite it."""
    return world.broadcast_object(resume.completed(run_dir, step) if world.is_main else None)


def tell_completed(summary: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """A resumed run that had completed: said, with its summary, and nothing of it rewritten."""
    log.info(
        "%s completed at step %d (summary.json): nothing left to resume, nothing rewritten", run_dir, summary["steps"]
    )
    print_summary(summary, run_dir)
    return summary


def _figures(loop, records: list[dict], run_dir: Path) -> None:
    """A figure of the batch over training, where the batch policy moved it (batch=adaptive): the
    batch against its target and B_simple, in the run directory and to the sinks."""
    key = loop.batch_control.hooks.batch_figure
    if key is None:
        return
    from bsexp.report.render import batch_figure

    name = batch_figure(records, run_dir)
    if name:
        loop.sinks.image(key, run_dir / name)


def _cpu_threads(cfg: DictConfig, world: World) -> cores.Threads:
    """This run's CPU threads, entered in the machine's registry of bsexp runs (bsexp.system.cores) before
    anything trains (the finder's trials take them too): pinned where told (trainer.threads;
    OMP_NUM_THREADS, which torchrun sets; trainer.speed=reproducible: torch's default, bit for bit
    as the run alone, and told where the cores are oversubscribed), else the run's share of the
    cores beside the other bsexp runs, moved while it trains. A run on a GPU takes no part."""
    if world.device.type != "cpu":
        return cores.Threads(threads=torch.get_num_threads())
    if cfg.trainer.threads is not None:
        return cores.take_threads(pinned=cfg.trainer.threads)
    told = "OMP_NUM_THREADS" in os.environ
    if told or str(cfg.trainer.speed) == "reproducible":
        return cores.take_threads(pinned=cores.default_threads(), tell=not told)
    return cores.take_threads(pinned=None)


def _run_on(world: World, cfg: DictConfig, run_dir: Path, started: float) -> dict[str, Any]:
    resumed = ckpt.find(cfg.resume, run_dir, restarted())
    changed = resume.changes(cfg, str(cfg.resume), str(run_dir)) if cfg.resume is not None else []
    done = _completed(world, run_dir, resumed[1]["step"]) if resumed is not None and not changed else None
    if done is not None:  # before the run's parts are built: nothing of it will train
        return tell_completed(done, run_dir) if world.is_main else done
    if world.is_main and (removed := remove_leftovers(run_dir)):  # this run's writes cut off by a kill
        log.info("removed %d temporary file(s) that writes into %s left unfinished", len(removed), run_dir)
    trunk = find_trunk(cfg) if resumed is None and cfg.branch.trunk is not None else None
    threads = _cpu_threads(cfg, world)
    loop = build_loop(
        cfg,
        world,
        run_dir,
        None if resumed is None else resumed[1],
        trunk=None if trunk is None else trunk[2],
        threads=threads,
    )
    # A signal from here on (a preemption while the run sets up) stops it at its first step boundary,
    # checkpointed, as one during training does.
    with stop_on_signals(loop.watch):
        summary = _set_up_and_train(cfg, world, run_dir, loop, resumed, changed, trunk, started)
    if world.is_main:
        print_summary(summary, run_dir)
    if loop.watch.stop_signal and not summary.get("preempted_by"):
        # A signal after the last step (in the test split, the summary, the figures): the run has
        # completed, and a sweep stops before its next point (bsexp.train.cli), not on as if unasked.
        summary = {**summary, "signalled_at_end": signal.Signals(loop.watch.stop_signal).name}
    return summary


def _set_up_and_train(cfg: DictConfig, world: World, run_dir: Path, loop, resumed, changed, trunk, started: float):
    """The state restored (a resume's, a branch's trunk), rank 0's outputs started, the cores shared and
    the memory capped, then training; the summary."""
    state = TrainState(started=started)
    wandb_id = None if resumed is None else ckpt.restore(cfg, loop, state, *resumed)
    if trunk is not None:  # a new run from the trunk's checkpoint, its batch (LR, weight decay) its own
        ckpt.restore(cfg, loop, state, trunk[0], trunk[1], branch=True)
        loop.batch_control.begin(state.step, *loop.hyperparameters.values(state.step, loop.batch_control.layout))
    # A resumed run's summary says what it started with (what the checkpoint kept), unless the resume
    # changed the run (checkpoint.allow_mismatch): then what the changed run derives where it resumes.
    if state.hparams is None or changed:
        state.hparams = hyperparameters(cfg, loop)
    hparams = state.hparams
    if world.is_main:
        for key, was, now in changed:  # taken with checkpoint.allow_mismatch=true, and recorded
            log.warning("resume: %s changed from %s to %s (checkpoint.allow_mismatch=true)", key, was, now)
        _start_outputs(cfg, loop, run_dir, hparams, state.records if resumed else None, wandb_id)
    if trunk is not None:  # where the branch starts: the trunk's model, at the branch's batch
        loop.evaluator.log(loop, state, loop.batch_control.epochs_done(state))
    with loop.threads.watching() as trained:
        if cfg.trainer.memory_limit_gb is not None:  # after the cores' watcher has started: a thread is room
            loop.threads.no_more = True  # and no torch thread started anew under the cap (bsexp.system.memory.cap_room)
            limit_memory(world.device, int(cfg.trainer.memory_limit_gb * 2**30))
        try:
            return _train(cfg, loop, state, run_dir, hparams, resumed, changed, trained)
        finally:
            # The cap is the training's: the summary and an OOM's report (its traceback still holds the
            # tensors that filled the cap) run without it. Under it a lazy import in the report raised a
            # MemoryError of its own, and the run ended in a traceback, not the one line (CI, 2026-12-05).
            if cfg.trainer.memory_limit_gb is not None:
                unlimit_memory(world.device)


def _start_outputs(cfg: DictConfig, loop, run_dir: Path, hparams: dict, records: list | None, wandb_id) -> None:
    """Rank 0, before training: the set-up announced, the sinks attached (a resumed run's
    `records`, its checkpoint's, kept; a run started over by a resume with none of its earlier
    ones), what the finder found."""
    announce(cfg, loop, hparams)
    keep = records if records is not None else ([] if cfg.resume is not None else None)
    loop.sinks.attach(build_sinks(cfg, run_dir, hparams, keep_records=keep, wandb_id=wandb_id))
    found = loop.batch_control.found
    if found is not None:
        log.info(found.table())
        write_json(run_dir / "finder.json", found.to_json())
        loop.sinks.table("finder/trials", [asdict(t) for t in found.trials])


def _train(cfg: DictConfig, loop, state: TrainState, run_dir: Path, hparams: dict, resumed, changed, trained) -> dict:
    """Train (under the signals `_run_on` watches), then the test split; the summary, written by
    rank 0 whatever the outcome (with the error where one ended the run), and the sinks closed."""
    status, test, error = "failed", None, None
    reset_peak_memory(loop.world.device)
    if loop.world.is_main:  # summary.json is written whatever ends the run: a full disk too
        reserve(run_dir / "summary.json", SUMMARY_ROOM)
    try:
        with logging_redirect_tqdm():
            try:
                status = train(loop, state)
            finally:
                trained()  # the cores given back: what follows (test split, summary, sinks) trains nothing
        if loop.splits.test is not None and status == "completed":
            test = loop.evaluator.split(loop, loop.splits.test)
    except KeyboardInterrupt:
        status = "preempted"
        raise
    except Exception as exc:
        error = f"{type(exc).__name__}: {one_line(exc)}"
        raise
    finally:
        summary = make_summary(cfg, status, loop, hparams, state, test, state.wall_time_s)
        if error is not None:  # what failed, beside the figures up to it
            summary["error"] = error
        summary["resumed_from"] = str(resumed[0]) if resumed is not None else None
        summary["resume_changes"] = [{"key": k, "was": was, "now": now} for k, was, now in changed]
        if status == "preempted" and loop.watch.stop_signal:
            summary["preempted_by"] = signal.Signals(loop.watch.stop_signal).name
        if loop.world.is_main:
            _finish_outputs(loop, state, run_dir, summary, failing=error is not None)
    return summary


def _finish_outputs(loop, state: TrainState, run_dir: Path, summary: dict, failing: bool) -> None:
    """Rank 0, at the end: summary.json (into the room reserved for it), the figures, the sinks
    closed, no temporary file left. After a failure, what fails here (a full disk again) is
    warned of, and the error that ended the run is the one reported."""
    try:
        write_json(run_dir / "summary.json", summary)
        _figures(loop, state.records, run_dir)
        loop.sinks.summary(summary)
        loop.sinks.close(summary["status"])
    except Exception as exc:
        if not failing:
            raise
        log.warning("after the run failed, its outputs could not all be written: %s", one_line(exc)[:300])
    finally:
        remove_leftovers(run_dir)
