"""Two nodes on one machine: two torchrun agents meeting through a c10d rendezvous on loopback,
one worker each, as the README's two-machine command runs them (both in one directory, as on a
shared file system)."""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import dist_workers
from bsexp.train.loop import TrainState, build_loop, train
from conftest import cli_env
from resuming import SLOW, assert_same_state, final_state, newest_step, records

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
# No BatchNorm: 2 ranks x 32 compute what 1 process x 64 does, up to float rounding in the all-reduce.
NO_NORM = ["data=synthetic", "data.shape=[1,16]", "data.num_samples=1000", "data.val_size=100", "model=mlp",
           "model.norm=none", "model.hidden=[32]", "epochs=2", "batch.size=64", "logger=none",
           "trainer.progress=false"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TwoNodes:
    """`torchrun --nnodes=2 --nproc_per_node=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:<port>
    --rdzv-id=<id> [--max-restarts=N] -m bsexp.train distributed=ddp ARGS`, started twice."""

    def __init__(self, data_root: Path, cwd: Path, *args: str, max_restarts: int = 0):
        self.cwd = cwd
        command = [TORCHRUN, "--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d",
                   f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--rdzv-id=bs-{cwd.name}"]
        command += [f"--max-restarts={max_restarts}"] if max_restarts else []
        command += ["-m", "bsexp.train", "distributed=ddp", *args]
        self.logs = [open(cwd / f"node{n}.log", "w") for n in range(2)]
        self.agents = [subprocess.Popen(command, cwd=cwd, env=cli_env(data_root), stdout=log, stderr=subprocess.STDOUT)
                       for log in self.logs]

    def wait(self, timeout: float = 200) -> list[int]:
        try:
            return [agent.wait(timeout) for agent in self.agents]
        finally:
            self.close()

    def close(self) -> None:
        for agent in self.agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        for log in self.logs:
            log.close()

    def output(self, node: int) -> str:
        return (self.cwd / f"node{node}.log").read_text()

    def worker(self, node: int) -> int:
        """The PID of the one worker that node's agent started."""
        pid = self.agents[node].pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        [worker] = [int(c) for c in children if b"bsexp.train" in Path(f"/proc/{c}/cmdline").read_bytes()]
        return worker


def run_dir_of(cwd: Path) -> Path:
    [run_dir] = [p for p in (cwd / "outputs").glob("*/*") if p.is_dir()]  # one directory for both nodes
    return run_dir


def test_two_agents_train_as_one_world_and_equal_one_process(make_cfg, data_root, tmp_path):
    nodes = TwoNodes(data_root, tmp_path, *NO_NORM)
    codes = nodes.wait()
    assert codes == [0, 0], nodes.output(0)[-2000:] + nodes.output(1)[-2000:]
    run_dir = run_dir_of(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["micro_size"] == 32
    assert sum(nodes.output(n).count("  status ") for n in (0, 1)) == 1  # one final table, rank 0's node's
    # One process of 64, the same run.
    threads = torch.get_num_threads()
    try:
        cfg = make_cfg(*NO_NORM)
        loop, progress = build_loop(cfg), TrainState()
        assert train(loop, progress) == "completed"
    finally:
        torch.set_num_threads(threads)
    assert summary["steps"] == progress.step
    for key, value in loop.step.net.state_dict().items():
        assert torch.allclose(final_state(run_dir)["model"][key], value, atol=1e-5, rtol=0), key
    logged = records(run_dir)
    assert [r["samples_seen"] for r in logged] == [r["samples_seen"] for r in progress.records]
    for mine, theirs in zip(logged, progress.records):
        assert abs(mine["train_loss"] - theirs["train_loss"]) <= 1e-5 * abs(theirs["train_loss"])


@pytest.mark.slow  # 34-36 s on 2 cores, the default tiers' longest: scripts/test_slow.sh (and .ci/run) runs it
def test_a_worker_killed_on_one_node_makes_both_resume_and_finish(make_cfg, data_root, tmp_path):
    # The second node's worker is killed (SIGKILL, as by the OOM killer) mid-epoch, after a periodic
    # checkpoint. Its agent restarts it (--max-restarts=1); the first node's agent sees the new
    # rendezvous round and restarts its own, healthy, worker without counting a restart.
    run = [*SLOW, "batch.size=64", "epochs=2"]
    nodes = TwoNodes(data_root, tmp_path, *run, max_restarts=1)
    try:
        target, deadline = random.Random(3).randrange(20, 45), time.time() + 200
        while not (run_dirs := list((tmp_path / "outputs").glob("*/*"))) or newest_step(run_dirs[0]) < target:
            assert all(a.poll() is None for a in nodes.agents), nodes.output(0)[-2000:] + nodes.output(1)[-2000:]
            assert time.time() < deadline, "the run did not reach its checkpoints in time"
            time.sleep(0.01)
        os.kill(nodes.worker(1), signal.SIGKILL)
        killed_after = newest_step(run_dirs[0])
        codes = nodes.wait()
    finally:
        nodes.close()
    assert codes == [0, 0], nodes.output(0)[-2000:] + nodes.output(1)[-2000:]
    run_dir = run_dir_of(tmp_path)  # the restarted workers went on in the first attempt's directory
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["steps"] == 120
    resumed_at = int(Path(summary["resumed_from"]).stem.split("-")[1])
    assert target <= killed_after <= resumed_at < 120  # the newest checkpoint when the worker died
    assert [r["step"] for r in records(run_dir)] == [60, 120]
    # Bit-identical to two ranks that were never interrupted.
    reference = dist_workers.launch(dist_workers.train_steps, make_cfg(*run, "distributed=ddp"))[0]
    assert_same_state(final_state(run_dir)["model"], reference["params"])
