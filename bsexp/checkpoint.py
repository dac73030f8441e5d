"""Checkpoints: everything a run needs to go on as if it had never stopped, written atomically.

A checkpoint (`<run dir>/checkpoints/step-<step>.pt`) holds the model, optimizer, LR scheduler
and loss scaler; every rank's random generators and running sums; where the run is (epoch, the
step within it, samples seen, the records logged so far); the plan in force (after a schedule
change or an OOM recovery) and the noise-scale averages; and the W&B run id. It is written to
a temporary file, flushed to disk and renamed, so a crash leaves the previous one intact; the
newest `checkpoint.keep` are kept.
"""

from __future__ import annotations

import logging
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bsexp.errors import ConfigError, one_line

log = logging.getLogger(__name__)

DIR = "checkpoints"
FORMAT = 1
_NAME = re.compile(r"step-(\d+)\.pt$")


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoints, newest first."""
    directory = Path(run_dir) / DIR
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.search(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def save(run_dir: Path, state: dict[str, Any], keep: int) -> Path:
    directory = Path(run_dir) / DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step-{state['step']:09d}.pt"
    tmp = directory / f".{path.name}.tmp"
    with open(tmp, "wb") as out:
        torch.save({"format": FORMAT, **state}, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    handle = os.open(directory, os.O_RDONLY)  # the rename itself reaches the disk
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
    for old in checkpoints(run_dir)[keep:]:
        old.unlink(missing_ok=True)
    return path


def load(path: Path) -> dict[str, Any]:
    state = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError("not a bsexp checkpoint")
    return state


def newest_readable(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads; unreadable ones (cut short, corrupt) are skipped with a warning."""
    for path in checkpoints(run_dir):
        try:
            return path, load(path)
        except Exception as exc:  # noqa: BLE001 - whatever broke the file, the previous one may do
            log.warning("checkpoint %s is unreadable (%s); trying the one before it",
                        path, one_line(exc)[:160] or type(exc).__name__)
    return None


def restarted() -> bool:
    """Whether torchrun has restarted this job's workers (--max-restarts), or SLURM has requeued
    this job (submitit does after a preemption or time-limit signal): they then resume."""
    counts = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
    return any(int(os.environ.get(name, "0") or 0) > 0 for name in counts)


def find(resume: str | None, run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint to resume from: `resume=auto` (or a torchrun restart) takes the newest
    readable one of the run directory, if any; `resume=PATH` that file (or that run's newest)."""
    if resume is None and not restarted():
        return None
    if resume is None or resume == "auto":
        found = newest_readable(run_dir)
        if found is None:
            log.info("resume: no readable checkpoint in %s; starting from the beginning", Path(run_dir) / DIR)
        return found
    path = Path(resume).expanduser()
    if path.is_dir():  # a run directory, or its checkpoints/
        found = newest_readable(path.parent if path.name == DIR else path)
        if found is None:
            raise ConfigError("resume", resume, "holds no readable checkpoint")
        return found
    if not path.is_file():
        raise ConfigError("resume", resume, "no such checkpoint file; valid: auto, or a path to checkpoints/step-*.pt")
    try:
        return path, load(path)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError("resume", resume, f"is not a readable checkpoint ({one_line(exc)[:160]})") from None


def mismatches(state: dict[str, Any], identity: dict[str, Any]) -> list[str]:
    """What differs between the run that wrote a checkpoint and this one, in the respects that make
    resuming meaningless: the model, its parameters' shapes, the global batch, the world size."""
    theirs = state.get("identity", {})
    found = []
    for key, what in (("model", "model"), ("batch_size", "global batch"), ("world_size", "world size"),
                      ("shapes", "parameter shapes")):
        if theirs.get(key) != identity.get(key):
            shown = "differ" if key == "shapes" else f"{theirs.get(key)} there, {identity.get(key)} here"
            found.append(f"{what} ({shown})")
    return found
