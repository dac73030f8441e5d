"""Checks run before Hydra creates a job's directory, so a bad config writes nothing: the
config's own checks, the batch policy's, a resume's (it must not change the run, and its
checkpoint must load), and the output directory's, which the run then holds as its own (a lock)
for as long as it lives. A resume of a run that completed writes nothing into it at all."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from bsexp.batch.plan import BatchPlan
from bsexp.batch.policies import Hooks, policy_for
from bsexp.config.checks import check
from bsexp.config.env import env_rank, launches_workers, restarted, under_torchrun, world_size
from bsexp.errors import ConfigError, config_error_within, config_errors, exit_on_config_error, one_line
from bsexp.finder import server
from bsexp.runs import resume
from bsexp.runs.trunk import check as check_trunk

RESULTS = ("summary.json", "metrics.jsonl")
LOCK = ".bsexp.lock"


def check_all(cfg: DictConfig) -> BatchPlan | None:
    """Everything that can be checked without data, torch or a process group; the first step's
    plan where the config alone decides it."""
    check(cfg)
    return policy_for(cfg, world_size(cfg)).check()


def check_output_dir(key: str, path: str) -> None:
    """The output directory (of a run, or of a sweep's jobs) must be creatable and must not
    already hold a run's results."""
    directory = Path(path)
    if _held_elsewhere(directory):
        raise ConfigError(key, path, "is in use by another run right now; choose a new directory")
    for name in RESULTS:  # an empty file (a run killed before its first record) holds no results
        found = (
            next((p for p in directory.glob(f"**/{name}") if p.stat().st_size), None) if directory.is_dir() else None
        )
        if found is not None:
            raise ConfigError(
                key,
                path,
                f"already holds a run's results ({found.relative_to(directory)}); continue "
                f"{'that sweep' if key == 'hydra.sweep.dir' else 'that run'} with "
                f"{continue_command(key, path)}, or choose a new directory",
            )
    usable(key, path)


def usable(key: str, path: str) -> None:
    """The directory exists (made where it does not) and this process may write into it."""
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(key, path, f"cannot be created ({exc.strerror})") from None
    if not os.access(directory, os.W_OK):
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
        raise ConfigError(
            key,
            path,
            f"is not writable{' (a read-only file system)' if read_only else ''}: the run writes its "
            f"checkpoints, metrics and summary there",
        )


def continue_command(key: str, path: str) -> str:
    """The command that continues the run (hydra.run.dir) or sweep (hydra.sweep.dir) in `path`; a
    path Hydra would misread unquoted (a sweep point's: `=` and `,`) quoted for Hydra and the shell."""
    value = f"'{path}'" if any(c in path for c in "=,[]{}()'\" \t") else path
    override = f'"{key}={value}"' if value != path else f"{key}={value}"
    return f"python -m bsexp.train {'-m ' if key == 'hydra.sweep.dir' else ''}resume=auto {override}"


def _held_elsewhere(directory: Path) -> bool:
    """Whether a live process holds the directory (its lock file exists and is locked)."""
    try:
        handle = os.open(directory / LOCK, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(handle)


_CLAIMS: list[int] = []  # open, locked descriptors: held for the life of the process


def claim(key: str, path: str) -> None:
    """Make the directory this process's alone for as long as it lives (an exclusive lock on
    `<dir>/.bsexp.lock`; the kernel drops it when the process ends, however it ends). A second
    run given the same directory is refused here, before it writes anything of its own there."""
    usable(key, path)
    try:
        handle = os.open(Path(path) / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # without the lock, a second run could write over this one unseen
        raise ConfigError(
            key, path, f"cannot be locked for this run: its lock file {LOCK} cannot be opened ({exc.strerror})"
        ) from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(handle)
        if isinstance(exc, BlockingIOError):
            raise ConfigError(key, path, "is in use by another run right now; choose a new directory") from None
        raise ConfigError(key, path, f"cannot be locked for this run: {LOCK} ({exc.strerror})") from None
    _CLAIMS.append(handle)


def swept_keys(config: DictConfig) -> set[str]:
    """The keys a multirun sweeps: from the command line (`a=1,2`, `range(...)`, `choice(...)`) and
    from the sweeper's `params` (an experiment's)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params, task = _given(config)
    overrides = OverridesParser.create().parse_overrides(task)
    return {o.key_or_group for o in overrides if o.is_sweep_override()} | {str(k) for k in params}


def _given(config: DictConfig) -> tuple[dict[str, Any], list[str]]:
    """The sweeper's `params` and the command line's overrides, as given: read through the config,
    an override's own interpolation (a comparison's `batch.size=${bsexp_tuned:batch.size}`) would
    be resolved in the sweep's config, where no point's tune.trial is set, and every point would
    get trial 0's value: a continued comparison's points then differed from their own runs, or,
    named by that value, were looked for in directories they were not in and went unchecked."""
    params = config.hydra.sweeper.get("params")
    params = {} if params is None else OmegaConf.to_container(params, resolve=False)
    return params, [str(o) for o in OmegaConf.to_container(config.hydra.overrides.task, resolve=False)]


def _searches_on_cpu(cfg: DictConfig) -> bool:
    """Whether this process will likely run the CPU batch finder (bsexp.train.loop decides, and stops
    the probe server whichever way it goes): a search not resumed, in a process that trains."""
    try:
        return (
            cfg.get("resume") is None
            and str(cfg.device) in ("cpu", "auto")
            and not launches_workers(cfg)
            and Hooks(policy_for(cfg, world_size(cfg))).searches()
        )
    except ConfigError:  # reported by the checks
        return False


class Preflight(Callback):
    """Hydra turns exceptions from callbacks into warnings and carries on, so a failed check
    exits here (SystemExit passes through Hydra untouched)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        # The finder's probe server imports torch and bsexp beside these checks (which import
        # torch too) and the building of data and model; a failed check stops it at once.
        with refused(), server.stopped_on_error():
            if _searches_on_cpu(config):  # a config it cannot read (`~batch`) is the checks' to say
                server.start()
            check_all(config)
            if env_rank() != 0:  # other ranks of a torchrun job write nothing (bsexp.train)
                return
            if config.get("resume") is not None:  # into the directory it left, as it was started
                if resume_checks(config, str(config.hydra.run.dir)):
                    return  # a completed run: nothing to write, nothing to hold
            elif not restarted():
                if config.branch.trunk is not None:  # the trunk's run with only the batch changed
                    check_trunk(config)
                check_output_dir("hydra.run.dir", config.hydra.run.dir)
            claim("hydra.run.dir", config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        with refused():
            if under_torchrun():
                raise ConfigError(
                    "--multirun",
                    True,
                    "under torchrun every rank would run the sweep; sweep "
                    "with distributed=ddp distributed.nproc_per_node=N instead",
                )
            # The config without the swept values: what is wrong here is wrong for every point, said
            # as for a single run; then each point, as it will run (a sweeper that chooses its points
            # as it goes, Optuna's, leaves them to each job).
            try:
                check_all(config)
            except config_errors() as exc:
                inner, swept = config_error_within(exc), swept_keys(config)
                # tune.best is read at the point's batch size (OmegaConf wraps the resolver's error):
                # without the swept batch, the config's own (128, say) need not be one it holds
                if inner is None or not (inner.key in swept or (inner.key == "tune.best" and "batch.size" in swept)):
                    raise
            points = sweep_points(config)
            continued = config.get("resume") == "auto"  # a sweep continued in its own directory
            if points is not None:
                check_points(config, points, continued)
            if not continued:
                check_output_dir("hydra.sweep.dir", config.hydra.sweep.dir)
            claim("hydra.sweep.dir", config.hydra.sweep.dir)


@contextlib.contextmanager
def refused():
    """A failed check ends the command here, before Hydra writes into the run (Hydra would turn
    it into a warning and carry on): a config error, or a directory that cannot be used, is one
    line and exit code 2; anything else its traceback and exit code 1."""
    try:
        with exit_on_config_error():
            yield
    except OSError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr, flush=True)
        sys.exit(2)
    except Exception:  # noqa: BLE001 - a fault of the checks themselves: shown whole
        traceback.print_exc()
        sys.exit(1)


_FINISHED: list[dict[str, Any]] = []  # the summary of the run resume_checks found completed


def finished_run() -> dict[str, Any] | None:
    """The summary of the run this process was asked to resume, where it had completed (the job
    then says so and starts nothing: no world, no workers)."""
    return _FINISHED[0] if _FINISHED else None


def resume_checks(config: DictConfig, run_dir: str) -> bool:
    """A resume's checks, before Hydra writes into the run: its config must not change the run,
    and a checkpoint of it must load (bsexp.runs.checkpoint.find); a refusal leaves every file of the
    run as it was. True for a run that completed at that checkpoint: Hydra is told to write
    nothing into it (no .hydra/resume-<n>/, no line in train.log), on a read-only directory too,
    and the job says so and exits 0."""
    from bsexp.runs import checkpoint

    changed = resume.check(config, run_dir)
    found = checkpoint.find_early(config.resume, run_dir)
    done = None if found is None or changed else resume.completed(run_dir, found[1]["step"])
    if done is None:
        return False
    _FINISHED[:] = [done]
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.output_subdir = None
        if config.hydra.job_logging is not None:
            config.hydra.job_logging = _without_files(OmegaConf.to_container(config.hydra.job_logging))
    return True


def _without_files(logging_cfg: dict) -> dict:
    """A logging config (logging.config.dictConfig's) without the handlers that write files."""
    handlers = logging_cfg.get("handlers") or {}
    files = {name for name, handler in handlers.items() if "filename" in handler}
    logging_cfg["handlers"] = {name: h for name, h in handlers.items() if name not in files}
    for node in [logging_cfg.get("root") or {}, *(logging_cfg.get("loggers") or {}).values()]:
        if "handlers" in node:
            node["handlers"] = [h for h in node["handlers"] if h not in files]
    return logging_cfg


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_points(config: DictConfig) -> list[list[str]] | None:
    """Every point of a sweep as Hydra's basic sweeper will run them (the sweeper's `params`, an
    experiment's, then the command line's overrides), each as its list of overrides; None for a
    sweeper that decides its points while it runs (Optuna's)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if config.hydra.sweeper.get("_target_") != BASIC_SWEEPER:
        return None
    params, task = _given(config)
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    overrides = parser.parse_overrides([*(f"{key}={value}" for key, value in params.items()), *task])
    return [point for batch in BasicSweeper.split_arguments(overrides, None) for point in batch]


def check_points(config: DictConfig, points: list[list[str]], continued: bool = False) -> None:
    """Compose every point of the sweep and check it, before the first one trains: a bad value
    in the last point would otherwise be found when its turn came, hours in. A continued sweep's
    points that ran already must compose to their own configs (a resume continues a run's own
    config). Exits with one line naming the point, its key and value (code 2)."""
    from hydra.core.global_hydra import GlobalHydra

    from bsexp.runs.sweep import point_dirname

    loader = GlobalHydra.instance().config_loader()
    for num, overrides in enumerate(points):
        try:
            point = loader.load_sweep_config(config, list(overrides))
            check_all(point)
            point_dir = Path(config.hydra.sweep.dir) / point_dirname(num, list(overrides))
            if continued and not resume.holds_no_run(point_dir):  # else started afresh (bsexp.runs.sweep.output_subdir)
                resume.check(point, str(point_dir))
        except config_errors() as exc:
            swept = swept_keys(config)
            told = " ".join(o for o in overrides if o.partition("=")[0].lstrip("+~") in swept) or " ".join(overrides)
            print(f"error: sweep point {num} ({told}): {one_line(exc)}; no point has run", file=sys.stderr, flush=True)
            sys.exit(2)
