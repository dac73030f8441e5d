"""`python -m bsexp.train [group=option ...] [key=value ...]`: the Hydra entry point.

Configuration errors, from Hydra, OmegaConf or bsexp's own checks, end with one line on stderr
and exit code 2 (docs: Outputs and logging, "Errors", says what may already have been written).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from bsexp.config.env import env_rank, launches_workers, remember_torchrun_dir, torchrun_first_dir, under_torchrun
from bsexp.config.schema import register_configs
from bsexp.config.shadowed import check_not_shadowed
from bsexp.errors import (
    CONFIG,
    DIVERGED,
    FAILED,
    config_errors,
    exit_on_config_error,
    one_line,
    refused,
    to_log_file,
)
from bsexp.runs import resume
from bsexp.runs.sweep import INDEX, apply_wandb_identity, outcomes, read_index, register_resolvers, started_sweep
from bsexp.system.io import DiskFull, no_room
from bsexp.train.preflight import finished_run

register_configs()
register_resolvers()
log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def _job(cfg: DictConfig) -> float | None:
    from bsexp.train.job import run  # torch is imported only once the config is known to be good

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    job = run
    remember_torchrun_dir(run_dir)
    if launches_workers(cfg):
        from bsexp.train.workers import launch_workers as job
    if (done := finished_run()) is not None and not under_torchrun():  # resumed, and completed: no world to start
        from bsexp.train.job import tell_completed

        job = lambda _, run_dir: tell_completed(done, run_dir)  # noqa: E731
    apply_wandb_identity(cfg)
    _split_cores_between_points(cfg, hydra_cfg)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        return _point(job, cfg, run_dir, hydra_cfg.job.num)
    try:
        with exit_on_config_error():
            summary = job(cfg, run_dir)
        if summary.get("status") == "diverged":  # an outcome, not a crash: its own exit code
            print(
                f"diverged at step {summary.get('diverged_at_step')} (a non-finite training loss; the last finite: "
                f"{summary.get('last_finite_loss')}): status diverged in {run_dir / 'summary.json'}",
                file=sys.stderr,
                flush=True,
            )
            sys.exit(DIVERGED)
        if summary.get("preempted_by"):  # a checkpoint is saved: resume=auto continues the run
            launcher = (
                "torchrun <the same torchrun options> -m bsexp.train" if under_torchrun() else "python -m bsexp.train"
            )
            _stop(
                summary,
                f"at step {summary['steps']}: checkpoint saved; continue with:\n  {launcher} resume=auto "
                f"hydra.run.dir={run_dir}",
            )
        return summary.get("val_acc")
    except KeyboardInterrupt:
        print(
            f"interrupted: what was measured so far is in {run_dir} (summary.json, metrics.jsonl)",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(130)
    except Exception as exc:
        _runtime_error(exc, run_dir)


def _point(job, cfg: DictConfig, run_dir: Path, num: int) -> float | None:
    """One point of a sweep. A failing point raises: Hydra records it as failed (so does
    jobs.jsonl) and runs the others; main() reports it once the sweep has ended."""
    try:
        summary = job(cfg, run_dir)
    except Exception as exc:
        log.error("point %d failed: %s", num, one_line(exc))
        raise
    if summary.get("preempted_by"):  # the whole sweep was told to stop (SLURM, a signal): not the next point
        _stop(
            summary,
            f"at point {num} (step {summary['steps']}, checkpoint saved in {run_dir}); the points after it did not run",
        )
    if late := summary.get("signalled_at_end"):  # as the point ended (Ctrl-C while it wrote its summary)
        print(
            f"stopped by {late} as point {num} ended (it {summary.get('status')}: {run_dir}); the points after it "
            f"did not run",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(128 + signal.Signals[late].value)
    return summary.get("val_acc")


def _stop(summary: dict, what: str) -> None:
    """A run stopped by a signal: say where, and exit as a process killed by it would (128 + n)."""
    print(f"stopped by {summary['preempted_by']} {what}", file=sys.stderr, flush=True)
    sys.exit(128 + signal.Signals[summary["preempted_by"]].value)


def _runtime_error(exc: Exception, run_dir: Path) -> None:
    """A run that failed while training: one line for a failed worker or an out-of-memory error
    (exit code 1); anything else is raised as it came. Either way the run's train.log holds it."""
    from bsexp.system.memory import is_oom
    from bsexp.train.workers import WorkersFailed

    if isinstance(exc, WorkersFailed):
        message = f"error: {exc} (see above; what was saved is in {run_dir})"
    elif no_room(exc) is not None:
        message = (
            f"error: {_no_room_line(exc)}; what was saved is in {run_dir}: make room, then continue with "
            f"python -m bsexp.train resume=auto hydra.run.dir={run_dir}"
        )
    elif is_oom(exc):
        message = (
            f"error: out of memory ({' '.join(str(exc).split())[:200]}); try batch=finder, a smaller batch.micro_size "
            f"with batch=accumulation, or precision=bf16. What was measured is in {run_dir}"
        )
    else:
        to_log_file(f"error: {type(exc).__name__}: {one_line(exc)}", exc)  # the console gets Python's traceback
        raise exc
    print(message, file=sys.stderr, flush=True)
    to_log_file(message)
    sys.exit(FAILED)


def _no_room_line(exc: Exception) -> str:
    """A write the disk had no room for, as one line: the file and the space it needs where known."""
    full = no_room(exc)
    return str(full) if isinstance(full, DiskFull) else f"the disk is full ({one_line(full)})"


def _split_cores_between_points(cfg: DictConfig, hydra_cfg: DictConfig) -> None:
    """Points run side by side (Hydra's joblib launcher) split the cores between them, rather
    than each taking them all (torch's default): trainer.threads, unless set. (Runs launched apart
    share the cores through bsexp.system.cores' registry instead.)"""
    launcher = hydra_cfg.launcher
    if cfg.trainer.threads is not None or "JoblibLauncher" not in str(launcher.get("_target_", "")):
        return
    cores = len(os.sched_getaffinity(0))
    n_jobs = int(launcher.get("n_jobs") or -1)
    side_by_side = n_jobs if n_jobs > 0 else max(1, cores + 1 + n_jobs)  # joblib: -1 is every core
    ranks = cfg.distributed.nproc_per_node if cfg.distributed.kind == "ddp" else 1
    cfg.trainer.threads = max(1, cores // (side_by_side * ranks))


def main() -> None:
    # Let errors reach us unformatted, so that each becomes one line and exit code 2.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    # A log line that cannot be written (train.log on a full disk) is lost, not a traceback on stderr.
    logging.raiseExceptions = False
    if under_torchrun():  # after a restart, every rank resumes (or none does), from the same place
        from bsexp.engine.distributed import agree_on_attempt

        agree_on_attempt()
    with exit_on_config_error():  # a resume continues the run's (or the sweep's) own config
        sys.argv = resume.prepare_sweep_argv(sys.argv) if _multirun_requested() else resume.prepare_argv(sys.argv)
        check_not_shadowed(sys.argv[1:])  # a config of the user's that bsexp's own of its name would hide
    if under_torchrun() and not any(a.partition("=")[0].lstrip("+~") == "distributed" for a in sys.argv[1:]):
        sys.argv.append("distributed=ddp")  # torchrun started the ranks: data parallel is what it asks for
    if env_rank() != 0:
        # Ranks of a torchrun job share rank 0's output directory (run() hands it round) and write
        # nothing themselves: no directory of their own, no .hydra/, no log file.
        sys.argv += ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=bsexp_worker"]
    elif (previous := torchrun_first_dir()) is not None and not any(
        a.startswith("hydra.run.dir=") for a in sys.argv[1:]
    ):
        sys.argv.append(f"hydra.run.dir={previous}")  # a restarted torchrun job resumes where it was
    with exit_on_config_error():
        try:
            _job()
        except Exception as exc:
            if not _multirun_requested():
                if no_room(exc) is not None:  # before the job: Hydra could not write the run's .hydra/
                    print(f"error: {_no_room_line(exc)}", file=sys.stderr, flush=True)
                    sys.exit(FAILED)
                raise
            _sweep_failed(exc)
    if _multirun_requested() and (sweep_dir := started_sweep()) is not None:
        _sweep_ended(sweep_dir)


def _sweep_failed(exc: Exception) -> None:
    """Hydra re-raises the first failed point's error after running every point (or the error
    that stopped the sweep, such as a full disk): one last line naming every point that failed."""
    sweep_dir = started_sweep()
    # The sweep's own config (an unknown key), before any point: one line, as a run's.
    if sweep_dir is None and isinstance(exc, config_errors()):
        print(f"error: {one_line(exc)}; no point has run", file=sys.stderr, flush=True)
        sys.exit(CONFIG)
    ran = (
        "the sweep did not start"
        if sweep_dir is None
        else f"ran: {outcomes(sweep_dir, ended=True)}; each point's outcome is in {sweep_dir / INDEX}"
    )
    failed = "was refused" if refused(exc) else "failed"  # its own values, refused: running it again gives the same
    what = _no_room_line(exc) if no_room(exc) is not None else f"a sweep point {failed} ({one_line(exc)})"
    print(f"error: {what}; {ran}", file=sys.stderr, flush=True)
    sys.exit(CONFIG if refused(exc) else FAILED)  # a point's values refused (status refused in the index)


def _sweep_ended(sweep_dir: Path) -> None:
    """A sweep whose every point ended without an error: where one diverged, one last line names
    them, and the exit code says so."""
    diverged = sorted(entry["num"] for entry in read_index(sweep_dir).values() if entry["status"] == "diverged")
    if diverged:
        print(
            f"diverged: sweep point{'s' if len(diverged) > 1 else ''} {', '.join(map(str, diverged))}; ran: "
            f"{outcomes(sweep_dir, ended=True)}; each point's outcome is in {sweep_dir / INDEX}",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(DIVERGED)


def one_process() -> bool:
    """A single run, in a process of its own: no sweep in this process, no torchrun ranks."""
    return not _multirun_requested() and not under_torchrun()


def _multirun_requested() -> bool:
    return any(arg in ("-m", "--multirun") for arg in sys.argv[1:])


if __name__ == "__main__":
    main()
