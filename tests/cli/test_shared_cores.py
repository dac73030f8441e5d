"""Runs that share a machine share its cores by themselves (issue 54): two bsexp runs training at
once each take their share of the cores, the one that started first comes down when the other
starts and goes back up when it leaves, and a run told its threads keeps them. Real runs through
the command line, their thread counts read from their logs and summaries; how fast they run is
scripts/bench_cores.py's to measure, not a test's.

Each test has a registry of its own (conftest's own_cores_registry): its runs see each other, not
the runs of the tests beside it."""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import TINY_RUN, cli_env
from resuming import SLOW

CORES = len(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(CORES < 2, reason="one core: nothing to share")
# A run at torch's default threads, training long enough to be there while another starts.
LONG = [o for o in SLOW if o not in ("epochs=3", "trainer.threads=1")] + ["epochs=100"]


@pytest.fixture
def default_threads(monkeypatch):
    """torch's thread count in a run started here: what a run alone takes."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # torch's own count (gpu_check.sh sets one)
    return torch.get_num_threads()


def started(data_root, cwd, log, *args) -> subprocess.Popen:
    """A run whose output goes to the file `log`, read as it grows."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "bsexp.train", *args],
            cwd=cwd,
            env=cli_env(data_root),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_for(proc: subprocess.Popen, done, log, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while not done():
        assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def thread_lines(log) -> list[str]:
    return [line.strip() for line in log.read_text().splitlines() if "threads: " in line]


def test_two_default_runs_at_once_each_take_their_share_and_the_first_takes_its_cores_back(
    data_root, tmp_path, default_threads
):
    first_log, first_dir = tmp_path / "first.log", tmp_path / "first"
    first = started(data_root, tmp_path, first_log, *LONG, f"hydra.run.dir={first_dir}")
    try:
        wait_for(first, (first_dir / "metrics.jsonl").exists, first_log)  # training, alone
        assert thread_lines(first_log) == []  # alone: torch's default, nothing said
        # The second, at torch's default threads too, finds the first there and takes its share.
        second = subprocess.Popen(
            [sys.executable, "-m", "bsexp.train", *LONG[:-1], "epochs=2", f"hydra.run.dir={tmp_path / 'second'}"],
            cwd=tmp_path,
            env=cli_env(data_root),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = second.communicate(timeout=300)
        assert second.returncode == 0, err[-3000:]
        # Two runs that share: the cores split evenly, an odd one to the earlier process.
        each, odd = divmod(CORES, 2)
        share = min(default_threads, each + (odd if second.pid < first.pid else 0))
        lowered = min(default_threads, each + (odd if first.pid < second.pid else 0))
        summary = json.loads((tmp_path / "second" / "summary.json").read_text())
        assert summary["threads"] == share, summary
        if share < default_threads:
            assert (
                f"threads: {share} of torch's {default_threads} (1 other bsexp run trains on this machine's {CORES} "
                "cores; trainer.threads=N pins the count)" in out
            )
        if lowered == default_threads:  # many cores: half of them is torch's default already
            assert thread_lines(first_log) == []
            return
        # The first came down while the second trained, and goes back up once it has left.
        wait_for(first, lambda: len(thread_lines(first_log)) >= 2, first_log, seconds=60)
        down, up = thread_lines(first_log)[:2]
        assert f"threads: {default_threads} -> {lowered} at step " in down
        assert down.endswith(f"(1 other bsexp run trains on this machine's {CORES} cores)")
        assert f"threads: {lowered} -> {default_threads} at step " in up
        assert up.endswith(f"(no other bsexp run trains on this machine's {CORES} cores)")
        # Stopped (SIGTERM: checkpointed, its summary written), it says where its threads moved.
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 128 + signal.SIGTERM, first_log.read_text()[-3000:]
        summary = json.loads((first_dir / "summary.json").read_text())
        steps = [int(line.split(" at step ")[1].split()[0]) for line in (down, up)]
        assert summary["threads"] == default_threads
        assert summary["threads_changes"] == [
            {"step": steps[0], "threads": lowered},
            {"step": steps[1], "threads": default_threads},
        ]
    finally:
        first.kill()
        first.wait()


@pytest.mark.slow  # three runs beside a fourth, two of them oversubscribed on purpose: 20-90 s on 2 cores
def test_beside_a_pinned_run_a_default_run_takes_the_cores_left_and_a_run_told_its_threads_keeps_them(
    data_root, tmp_path, default_threads
):
    other_log = tmp_path / "other.log"
    other = started(data_root, tmp_path, other_log, *LONG, "trainer.threads=1", f"hydra.run.dir={tmp_path / 'other'}")

    def run(name: str, *args: str) -> tuple[dict, str]:
        out = subprocess.run(
            [sys.executable, "-m", "bsexp.train", *TINY_RUN, *args, f"hydra.run.dir={tmp_path / name}"],
            cwd=tmp_path,
            env=cli_env(data_root),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads((tmp_path / name / "summary.json").read_text()), out.stdout

    try:
        wait_for(other, (tmp_path / "other" / "metrics.jsonl").exists, other_log)
        # trainer.threads unset: the cores the pinned run leaves (1 of them taken).
        summary, _ = run("shares")
        assert summary["threads"] == min(default_threads, CORES - 1)
        # trainer.threads given: kept, even where it asks for every core.
        summary, out = run("pinned", f"trainer.threads={CORES}")
        assert summary["threads"] == CORES and summary["threads_changes"] == []
        assert "other bsexp run" not in out
        # trainer.speed=reproducible: torch's default, bit for bit as alone; told what it costs.
        summary, out = run("reproducible", "trainer.speed=reproducible")
        assert summary["threads"] == default_threads and summary["threads_changes"] == []
        if default_threads + 1 > CORES:
            [line] = [line for line in out.splitlines() if "other bsexp run" in line]
            assert f"1 other bsexp run trains on this machine's {CORES} cores beside this one" in line
            assert f"({default_threads} threads here, 1 there)" in line
            assert line.endswith(f"give each its share with trainer.threads={max(1, CORES // 2)}")
        # The pinned run was never moved.
        assert thread_lines(other_log) == []
    finally:
        other.kill()
        other.wait()


def test_a_run_alone_keeps_openmps_waiting_one_started_beside_another_run_sleeps_and_a_users_policy_is_kept(
    data_root, tmp_path
):
    """OpenMP's waiting is chosen before torch loads (bsexp.system.registry.choose_openmp_waiting):
    alone, OpenMP's default (its threads spin a moment, then sleep: a step's parallel regions don't
    each wait for a wake-up); beside another bsexp run training at the start, PASSIVE."""
    registry = Path(os.environ["BSEXP_CORES_REGISTRY"])

    def policy(name: str, **env: str) -> str:
        run_env = cli_env(data_root)
        run_env.pop("OMP_WAIT_POLICY", None)  # conftest's, for the tests' own crowded cores
        out = subprocess.run(
            [sys.executable, "-m", "bsexp.train", *TINY_RUN, f"hydra.run.dir={tmp_path / name}"],
            cwd=tmp_path,
            env={**run_env, **env},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads((tmp_path / name / "summary.json").read_text())["openmp_wait_policy"]

    assert policy("alone") == "default"
    assert policy("told", OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
    # Another training process, as bsexp.system.cores enters one: a locked file named by its pid.
    with open(registry / str(os.getpid()), "w") as entry:
        fcntl.flock(entry, fcntl.LOCK_EX)
        entry.write("1 pinned")
        entry.flush()
        assert policy("beside") == "PASSIVE"
        assert policy("beside_told", OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
    # Gone (its lock released): alone again, and the dead entry is cleared away.
    assert policy("after") == "default"
    assert not (registry / str(os.getpid())).exists()
