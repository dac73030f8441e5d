"""What the process's environment says about the run, read without torch: whether torchrun (or
torch's elastic agent) started it, its rank, its world, and whether it was restarted."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from omegaconf import DictConfig

from bsexp.config.schema import DistributedKind
from bsexp.errors import ConfigError


def under_torchrun() -> bool:
    """True in a worker that torchrun (or torch's elastic agent) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ


def env_rank() -> int:
    return int(os.environ["RANK"]) if under_torchrun() else 0


def restarted() -> bool:
    """Whether torchrun has restarted this job's workers (--max-restarts), or SLURM has requeued
    this job (submitit does after a preemption or time-limit signal): they then resume."""
    counts = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
    return any(int(os.environ.get(name, "0") or 0) > 0 for name in counts)


def launches_workers(cfg: DictConfig) -> bool:
    """Whether this process only starts the ranks (distributed=ddp with several processes per
    node, not under torchrun): bsexp.train.workers, which trains nothing itself."""
    return cfg.distributed.kind == DistributedKind.ddp and not under_torchrun() and cfg.distributed.nproc_per_node > 1


def world_size(cfg: DictConfig) -> int:
    """Ranks of the run: torchrun's WORLD_SIZE when it started us, else the workers bsexp launches."""
    if under_torchrun():
        if cfg.distributed.kind != DistributedKind.ddp:
            raise ConfigError(
                "distributed",
                str(cfg.distributed.kind),
                f"torchrun started {os.environ['WORLD_SIZE']} ranks; add distributed=ddp",
            )
        return int(os.environ["WORLD_SIZE"])
    return cfg.distributed.nproc_per_node if cfg.distributed.kind == DistributedKind.ddp else 1


# torchrun's run id -> the output directory its first attempt chose (outside the outputs).
TORCHRUN_DIRS = Path(tempfile.gettempdir()) / "bsexp-torchrun"


def remember_torchrun_dir(run_dir: Path) -> None:
    """Rank 0 of a torchrun job notes its output directory, for the attempts after a restart."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if under_torchrun() and env_rank() == 0 and run_id != "none":
        TORCHRUN_DIRS.mkdir(parents=True, exist_ok=True)
        (TORCHRUN_DIRS / run_id).write_text(str(run_dir))


def torchrun_first_dir() -> str | None:
    """After torchrun restarted its workers (--max-restarts), the directory of the job's first
    attempt, so that `resume` finds its checkpoints; None otherwise."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    pointer = TORCHRUN_DIRS / run_id
    if run_id == "none" or not restarted() or not pointer.exists():
        return None
    return pointer.read_text().strip()
