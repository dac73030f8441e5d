"""The one-node SLURM cluster of scripts/slurm_local.sh, as the tests in tests/slurm see it.

Not a conftest.py: a second conftest module would shadow tests/conftest.py, which the other test
files import helpers from. The cluster is not started here: `.ci/run` (or you, as root) starts it:

    scripts/slurm_local.sh start && export SLURM_CONF=/tmp/bsexp-slurm/etc/slurm.conf
    pytest -m slurm tests/slurm
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm_local.sh"
STATE = Path(os.environ.get("BSEXP_SLURM_DIR", "/tmp/bsexp-slurm"))
CONF = os.environ.get("SLURM_CONF") or str(STATE / "etc" / "slurm.conf")
# A node that takes jobs (sinfo's state, without its flag characters).
_UP = ("idle", "mixed", "allocated", "completing")


def why_not() -> str | None:
    """Why the SLURM tests cannot run here, in one line; None when a cluster answers."""
    start = (
        "start one with scripts/slurm_local.sh start"
        if os.geteuid() == 0
        else "not root, so scripts/slurm_local.sh cannot start one"
    )
    missing = [c for c in ("sbatch", "srun", "sacct", "squeue", "scancel", "sinfo", "scontrol") if not shutil.which(c)]
    if missing:
        return f"SLURM packages missing (no {', '.join(missing)}): {start} (it installs them)"
    if not Path(CONF).is_file():  # before asking SLURM: without a config its commands search DNS for a minute
        return f"SLURM cluster not running (no {CONF}): {start}"
    ping = _ask("scontrol", "ping")
    if ping is None or "UP" not in ping:
        return f"SLURM cluster not running (its controller, SLURM_CONF={CONF}, does not answer): {start}"
    states = (_ask("sinfo", "-h", "-N", "-o", "%T") or "").split()
    if not states or states[0].rstrip("*~#!%$@^-") not in _UP:
        return f"the SLURM node of SLURM_CONF={CONF} is {states[0] if states else 'unknown'}, not taking jobs"
    return None


def _ask(*command: str) -> str | None:
    try:
        out = subprocess.run(command, env=os.environ | {"SLURM_CONF": CONF}, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return None
    return out.stdout if out.returncode == 0 else None


REASON = why_not()
# Every test module here: marker slurm, skipped with the one reason when no cluster answers; where
# one must (BSEXP_SLURM_REQUIRED=1, as .ci/run sets once it has started the cluster), failed.
if REASON is not None and os.environ.get("BSEXP_SLURM_REQUIRED") == "1":
    pytest.fail(f"BSEXP_SLURM_REQUIRED=1 but {REASON}", pytrace=False)
MARKS = [pytest.mark.slurm, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def env(data_root: Path) -> dict[str, str]:
    """The CLI's test environment, plus the cluster's SLURM_CONF (sbatch passes it to the jobs)."""
    return cli_env(data_root) | {"SLURM_CONF": CONF}


def slurm(*args: str) -> str:
    """Run a SLURM client command against the cluster; its stdout."""
    out = subprocess.run(list(args), env=os.environ | {"SLURM_CONF": CONF}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{' '.join(args)}: {out.stderr}"
    return out.stdout


def bsexp(data_root: Path, cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m bsexp.train ARGS` on this machine, as a user types it; its jobs go to SLURM."""
    return subprocess.run(
        [sys.executable, "-m", "bsexp.train", *args],
        cwd=cwd,
        env=env(data_root),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cancel(sweep: Path) -> None:
    """Cancel whatever is left of a sweep's jobs (nothing, when it ended as it should)."""
    if (sweep / ".submitit").is_dir() and job_ids(sweep):
        subprocess.run(
            ["scancel", *job_ids(sweep)], env=os.environ | {"SLURM_CONF": CONF}, capture_output=True, timeout=60
        )


def job_ids(sweep: Path) -> list[str]:
    """The SLURM job ids of a sweep's points, from submitit's folders (one per job: <id> or <id>_<task>)."""
    return sorted(p.name for p in (sweep / ".submitit").iterdir() if list(p.glob("*_submitted.pkl")))


_UNSETTLED = {"PENDING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}


def accounting(job: str, tasks: int = 1, timeout: float = 60) -> list[tuple[str, str]]:
    """(job id, state) of every attempt of a job and its array tasks, from sacct (-D: requeued
    attempts too), without the job steps; once SLURM's books hold at least `tasks` job ids and the
    last attempt of each has ended (a job's result reaches submitit before SLURM has finished
    tearing the job down, and slurmdbd records a finished array task a moment after the others)."""
    deadline = time.time() + timeout
    while True:
        lines = slurm("sacct", "-D", "-n", "-X", "-P", "-j", job, "-o", "JobID,State").splitlines()
        attempts = [tuple(line.split("|", 1)) for line in lines if line]  # a state may be "CANCELLED by 0"
        last = {job_id: state for job_id, state in attempts}
        if (len(last) >= tasks and not _UNSETTLED & set(last.values())) or time.time() > deadline:
            return attempts
        time.sleep(0.5)
