"""The registry of the bsexp runs that train on this machine, read without torch.

One locked file per training process, named by its pid, in the temporary directory (or
BSEXP_CORES_REGISTRY), holding its threads and whether it shares the cores (bsexp.system.cores
enters and moves them). Torch-free, so that `python -m bsexp.train` can look before torch loads
and choose how OpenMP's threads wait (`choose_openmp_waiting`), which OpenMP reads only once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Entry:
    """Another training process in the registry: its threads, and whether it shares (moves them)."""

    pid: int
    threads: int
    shares: bool


def registry_dir() -> Path:
    """Where the runs of this machine register: one folder for every process that should see the
    others (BSEXP_CORES_REGISTRY moves it; the tests give each test its own)."""
    return Path(os.environ.get("BSEXP_CORES_REGISTRY") or Path(tempfile.gettempdir()) / "bsexp-runs")


def others(registry: Path | None = None) -> tuple[Entry, ...]:
    """Every other live training process in the registry."""
    registry = registry or registry_dir()
    found = []
    for entry in registry.glob("[0-9]*"):
        if entry.name == str(os.getpid()):
            continue
        with contextlib.suppress(OSError, ValueError):
            found.append(_live_entry(entry))
    return tuple(e for e in found if e is not None and e.threads)


def _live_entry(entry: Path) -> Entry | None:
    """A live process's entry; None for a dead process's, which is removed. An entry of an older
    bsexp (its threads alone) is pinned."""
    handle = os.open(entry, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # held: the process lives
        threads, _, kind = os.read(handle, 32).decode().partition(" ")
        return Entry(int(entry.name), int(threads or 1), kind == "shares")
    else:
        entry.unlink(missing_ok=True)
        return None
    finally:
        os.close(handle)


def choose_openmp_waiting(environ: MutableMapping[str, str], registry: Path | None = None) -> str:
    """How this process's OpenMP threads wait between two parallel regions, set in `environ` before
    torch loads (OpenMP reads it once); returned: the policy in force ("default": OpenMP's own).

    Beside other bsexp runs training at the start, threads that spin take the cores from the others'
    work, so they sleep (OMP_WAIT_POLICY=PASSIVE). Alone, they keep OpenMP's default, spinning a
    moment before they sleep: sleeping at once costs a wake-up at each of a step's parallel regions
    (the default run on 2 AMD EPYC cores: 7-10 s of training sleeping, 3.5-6 s spinning; on 2 Intel
    Xeon cores the same either way). A run that starts alone and gets neighbours later takes its
    share of the cores (bsexp.system.cores), one thread on 2 cores, where nothing waits. A value the
    user set is kept."""
    if environ.get("OMP_WAIT_POLICY"):
        return environ["OMP_WAIT_POLICY"]
    if others(registry):
        environ["OMP_WAIT_POLICY"] = "PASSIVE"
        return "PASSIVE"
    return "default"
