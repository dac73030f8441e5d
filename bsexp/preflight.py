"""Checks run before Hydra creates a job's directory, so a bad config writes nothing: the
config's own checks, the batch policy's, and the output directory's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from bsexp.batch.plan import BatchPlan
from bsexp.batch.policy import policy_for
from bsexp.config.checks import check
from bsexp.config.env import env_rank, restarted, under_torchrun
from bsexp.errors import ConfigError, exit_on_config_error

RESULTS = ("summary.json", "metrics.jsonl")


def check_all(cfg: DictConfig) -> BatchPlan | None:
    """Everything that can be checked without data, torch or a process group; the first step's
    plan where the config alone decides it."""
    check(cfg)
    return policy_for(cfg).check()


def check_output_dir(key: str, path: str) -> None:
    """The output directory (of a run, or of a sweep's jobs) must be creatable and must not
    already hold a run's results."""
    directory = Path(path)
    for name in RESULTS:
        found = next(iter(directory.glob(f"**/{name}")), None) if directory.is_dir() else None
        if found is not None:
            raise ConfigError(key, path, f"already holds a run's results ({found.relative_to(directory)}); "
                                         f"choose a new directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(key, path, f"cannot be created ({exc.strerror})") from None
    if not os.access(directory, os.W_OK):
        raise ConfigError(key, path, "is not writable")


class Preflight(Callback):
    """Hydra turns exceptions from callbacks into warnings and carries on, so a failed check
    exits here (SystemExit passes through Hydra untouched)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        with exit_on_config_error():
            check_all(config)
            resuming = config.get("resume") is not None or restarted()  # into the directory it left
            if env_rank() == 0 and not resuming:  # other ranks of a torchrun job write nothing (bsexp.train)
                check_output_dir("hydra.run.dir", config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # The config without the swept values: what is wrong here is wrong for every job.
        with exit_on_config_error():
            if under_torchrun():
                raise ConfigError("--multirun", True, "under torchrun every rank would run the sweep; sweep "
                                  "with distributed=ddp distributed.nproc_per_node=N instead")
            check_all(config)
            check_output_dir("hydra.sweep.dir", config.hydra.sweep.dir)
