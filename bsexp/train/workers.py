"""Self-launch: a job that starts its own DDP workers through torch's elastic launch API.

`python -m bsexp.train distributed=ddp distributed.nproc_per_node=N` (outside torchrun) runs
the Hydra job in this process and the training in N worker processes, which find each other the
way torchrun's workers do. So each point of a multirun sweep is its own worker group, and no
process group or W&B run outlives its job.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from omegaconf import DictConfig
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from bsexp.config.env import env_rank
from bsexp.system.io import write_json
from bsexp.system.signals import stop_on_signals
from bsexp.train.job import run

log = logging.getLogger(__name__)


class WorkersFailed(RuntimeError):
    """A rank of a self-launched job failed; the message names the rank and its error."""


def launch_workers(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Train on `distributed.nproc_per_node` local workers; rank 0's summary."""
    nproc = cfg.distributed.nproc_per_node
    log.info("launching %d workers (torch elastic launch)", nproc)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.5,
    )
    # SIGUSR1 (SLURM's warning, sent to every process of the job) makes the workers checkpoint and
    # stop; a handler here before (submitit's, which requeues the job) runs once they have.
    preemption = SimpleNamespace(stop_signal=0)
    try:
        with stop_on_signals(preemption):
            results = elastic_launch(config, _worker)(cfg, str(run_dir))
    except ChildFailedError as exc:
        rank, reason = _root_cause(exc)
        # The cause, in rank 0's summary (its own error may be a peer's hang-up), or in one of its
        # own where rank 0 was stopped before it could write one.
        path = run_dir / "summary.json"
        summary = (
            json.loads(path.read_text())
            if path.exists()
            else {"status": "failed", "world_size": nproc, "seed": cfg.seed}
        )
        write_json(path, {**summary, "error": f"rank {rank}: {reason}"})
        raise WorkersFailed(f"rank {rank} failed: {reason}") from None
    return results[0]


def _root_cause(exc: ChildFailedError) -> tuple[int, str]:
    """The rank that raised, and its error: a rank that reported an exception comes before one
    that was killed (its peers are stopped, or abort, when it dies)."""

    def key(item):
        rank, failure = item
        return (not failure.error_file_data.get("message"), failure.timestamp, rank)

    rank, failure = min(exc.failures.items(), key=key)
    message = failure.message if isinstance(failure.message, str) else failure.message.get("message", "")
    return rank, " ".join(str(message).split()) or f"exit code {failure.exitcode}"


@record  # writes the worker's error to the file the launcher reads, for the message above
def _worker(cfg: DictConfig, run_dir: str) -> dict[str, Any]:
    _worker_logging(Path(run_dir), env_rank())
    if "OMP_NUM_THREADS" not in os.environ and not cfg.trainer.threads:
        # As torchrun does: the node's cores shared by its workers, not each taking them all; each
        # worker's share beside other bsexp runs rises to this at most (bsexp.system.cores).
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"])))
    return run(cfg, Path(run_dir))


def _worker_logging(run_dir: Path, rank: int) -> None:
    """Rank 0 logs as the Hydra job does (console, and train.log); others only warnings."""
    root = logging.getLogger()
    root.handlers.clear()
    if rank == 0:
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(logging.Formatter("%(message)s"))
        file = logging.FileHandler(run_dir / "train.log")
        file.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
        root.handlers[:] = [console, file]
        root.setLevel(logging.INFO)
    else:
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(logging.Formatter(f"[rank {rank}] %(levelname)s %(message)s"))
        root.handlers[:] = [console]
        root.setLevel(logging.WARNING)
