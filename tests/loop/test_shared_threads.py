"""A run's share of the cores moves while it trains: a looking thread finds it in the registry of
the machine's bsexp runs, and the training loop applies it between two steps (bsexp.system.cores). Real
registries, a real other process in them, real torch threads."""

import os
import subprocess
import sys
import threading

import pytest
import torch

from bsexp.system import cores
from bsexp.train.loop import TrainState, build_loop, train
from conftest import cli_env
from tiny import TINY

CORES = len(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(CORES < 2, reason="one core: nothing to share")

OTHER = """
import sys, time
from pathlib import Path
from bsexp.system import cores
cores.register(1, True, Path(sys.argv[1]))
print("registered", flush=True)
time.sleep(120)
"""


@pytest.fixture
def restored_threads():
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def looked(threads: cores.Threads) -> None:
    """One look at the registry, on a thread of its own, as the run's watcher takes it."""
    looker = threading.Thread(target=threads.look)
    looker.start()
    looker.join()


def test_the_share_found_by_the_looking_thread_is_applied_by_the_training_loop_between_steps(
    make_cfg, data_root, tmp_path, restored_threads
):
    registry = tmp_path / "registry"
    torch.set_num_threads(2)
    threads = cores.Threads(threads=2, shares=True, ceiling=2, registry=registry)
    cores.register(2, True, registry)
    other = subprocess.Popen(
        [sys.executable, "-c", OTHER, str(registry)], stdout=subprocess.PIPE, text=True, env=cli_env(data_root)
    )
    try:
        assert other.stdout.readline().strip() == "registered"
        looked(threads)
        # Found, not applied: torch.set_num_threads on the looking thread would set only its own count.
        assert threads.wanted[0] == 1 and torch.get_num_threads() == 2
        loop = build_loop(make_cfg(*TINY, "trainer.max_steps=3"), threads=threads)
        assert train(loop, TrainState()) == "completed"
        assert torch.get_num_threads() == 1 and threads.changes == [(0, 1)]
        assert (registry / str(os.getpid())).read_text() == "1 shares"  # what the others now read
        # The other gone, the next look gives the cores back, at the next step boundary.
        other.kill()
        other.wait()
        looked(threads)
        threads.between_steps(3)
        assert torch.get_num_threads() == 2 and threads.changes == [(0, 1), (3, 2)]
    finally:
        other.kill()
        other.wait()


def test_under_a_memory_cap_the_share_only_comes_down(restored_threads, tmp_path):
    # Threads started anew under a cap need room it may not have (bsexp.system.memory.cap_room).
    torch.set_num_threads(1)
    threads = cores.Threads(threads=1, shares=True, ceiling=2, registry=tmp_path / "registry", no_more=True)
    threads.wanted = (2, cores.Sharing(2, 1, ()))
    threads.between_steps(4)
    assert torch.get_num_threads() == 1 and threads.changes == []
