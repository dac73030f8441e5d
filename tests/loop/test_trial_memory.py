"""The finder's trial runs the trainer's own training step, so it holds what training holds."""

import resource
import subprocess
import sys

import pytest

from bsexp.engine.build import build_data
from bsexp.finder.probe import ChildProber
from bsexp.system import memory

# 17 M parameters and tiny activations: the gradients dominate what a step adds. Plain SGD
# without weight decay updates in place (with weight decay, its foreach step makes a gradient-sized
# copy of its own, which would hide the buffer this test looks for).
BIG_GRADIENTS = [
    "data=synthetic",
    "data.shape=[1,40]",
    "data.num_samples=600",
    "data.val_size=100",
    "model=mlp",
    "model.hidden=[4096,4096]",
    "model.norm=none",
    "batch=finder",
    "trainer.noise_scale=off",
    "trainer.eval_batch_size=8",
    "distributed=ddp",
    "distributed.nproc_per_node=2",
    "optimizer.momentum=0",
    "optimizer.weight_decay=0",
]


def trial_peak_mb(make_cfg, *overrides) -> float:
    """The training peak of a trial at micro-batch 8 in the real probe process (a DDP run's trial:
    a one-rank process group, the DDP wrapper, gradients reduced as training reduces them)."""
    cfg = make_cfg(*BIG_GRADIENTS, *overrides)
    prober = ChildProber(cfg, build_data(cfg), 16 * memory.GIB, distributed=True)
    try:
        trial = prober.attempt(8)
    finally:
        prober.close()
    assert trial.ok
    return trial.train_peak_mb


def test_a_ddp_trial_with_oom_recovery_holds_what_ddps_own_overlapped_reduction_holds(make_cfg):
    # With OOM recovery on (the default) a DDP step reduces bsexp's gradient buckets, whose views
    # the gradients are: no flat copy of them all (4 bytes a parameter, 64 MB here, which the
    # step made before bsexp.engine.distributed.GradBuckets), so a trial holds what one with
    # DDP's own overlapped reduction holds.
    parameters = 40 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 10 + 10
    flat_mb = 4 * parameters / memory.MIB
    recovering = trial_peak_mb(make_cfg, "trainer.oom_recovery=true")
    overlapped = trial_peak_mb(make_cfg, "trainer.oom_recovery=false")
    assert abs(recovering - overlapped) < 0.1 * flat_mb, (recovering, overlapped, flat_mb)


CONV_NET = [
    "data=synthetic",
    "data.shape=[3,32,32]",
    "data.num_samples=600",
    "data.val_size=100",
    "model=cnn",
    "model.width=16",
    "batch=finder",
    "optimizer=adamw",
    "trainer.eval_batch_size=100",
]


def test_trials_leave_room_for_the_kernels_trainings_onednn_cache_keeps(make_cfg, monkeypatch):
    # The probe process runs with oneDNN's kernel cache off (every trial starts alike); training
    # keeps the kernels of its shape and of the evaluation's (~15 and ~3 MB for this conv net).
    # The finder measures them where the cache is as training has it, and trials get that much
    # less room; a user who turned the cache off has nothing to leave room for.
    def probed(capacity: str | None) -> tuple[float, float]:
        if capacity is None:
            monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
        else:
            monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", capacity)
        cfg = make_cfg(*CONV_NET)
        prober = ChildProber(cfg, build_data(cfg), 4 * memory.GIB, distributed=False)
        prober.close()
        kept = prober.model_memory["kernel_cache_train_bytes"] + prober.model_memory["kernel_cache_eval_bytes"]
        return kept / memory.MIB, prober.budget_bytes / memory.MIB

    cached_mb, cached_budget = probed(None)
    none_mb, uncached_budget = probed("0")
    assert cached_mb > 5, cached_mb
    assert none_mb < 1, none_mb
    # The same parent, the same limit: the budgets differ by what the cache keeps (and the few
    # MB the parent's resident memory moves between two starts).
    assert uncached_budget - cached_budget == pytest.approx(cached_mb - none_mb, abs=6), (
        cached_budget,
        uncached_budget,
        cached_mb,
    )


MATRIX_PRODUCTS = [
    "data=synthetic",
    "data.shape=[3,32,32]",
    "data.num_samples=600",
    "data.val_size=100",
    "model=mlp",
    "model.hidden=[1024,1024]",
    "batch=finder",
    "optimizer=adamw",
    "trainer.eval_batch_size=100",
]


def test_a_trial_leaves_the_room_of_its_own_size_not_mkls_buffers_from_the_sizes_before(make_cfg):
    # MKL keeps the buffers of its matrix products for the next ones, sized by the products so
    # far: a training process holds those of its own batch size, and the probe process, which
    # tries other sizes first, held theirs too (the bench's MLP: ~5 MB, ~100 samples of its edge).
    if not memory.free_blas_buffers():
        pytest.skip("no MKL whose buffers can be freed in this torch")
    cfg = make_cfg(*MATRIX_PRODUCTS)
    prober = ChildProber(cfg, build_data(cfg), 4 * memory.GIB, distributed=False)
    try:
        first = prober.attempt(8, probe=True)
        prober.attempt(512, probe=True)  # MKL's buffers for products of 512 rows: ~5.7 MB
        again = prober.attempt(8, probe=True)
    finally:
        prober.close()
    # What the first step (of 2 samples) adds to every trial's baseline is the optimizer's state,
    # not also the buffers of its own products (4.7 MB).
    measured, state = prober.model_memory["first_step_bytes"], prober.model_memory["state_bytes"]
    assert abs(measured - state) < 1.5 * memory.MIB, (measured / memory.MIB, state / memory.MIB)
    # A trial at 8 leaves the same room after one at 512 as before it.
    assert again.room_mb == pytest.approx(first.room_mb, abs=0.5), (first.room_mb, again.room_mb)


def test_a_kernel_measurement_that_does_not_fit_leaves_the_search_running(make_cfg, caplog):
    # The process that measures the kernel cache is capped like the probe process: where its
    # 64-sample step does not fit (here ~4 MB a sample in 80 MB), it reports nothing, the finder
    # says so, and the trials go on with the room they would have had.
    cfg = make_cfg(
        "data=synthetic",
        "data.shape=[3,64,64]",
        "data.num_samples=300",
        "data.val_size=50",
        "model=cnn",
        "model.width=64",
        "batch=finder",
        "optimizer=adamw",
        "trainer.eval_batch_size=4",
    )
    splits = build_data(cfg)
    with caplog.at_level("WARNING"):
        prober = ChildProber(cfg, splits, memory.held() + 80 * memory.MIB, distributed=False)
    try:
        assert prober.kernels["state_bytes"] is None and prober.model_memory["kernel_cache_train_bytes"] == 0
        assert "did not fit under the limit" in caplog.text
        assert prober.attempt(4).ok
    finally:
        prober.close()


def test_a_probe_process_that_fails_far_sooner_at_a_smaller_size_is_replaced_and_the_size_tried_again(make_cfg, caplog):
    # A bench search of ResNet-18 once saw every trial below a failure fail in 2 ms. Here the
    # probe process loses its room for real: its address-space cap is lowered from outside
    # (prlimit) to a little above what it has mapped, so its next trial fails at once.
    cfg = make_cfg(
        "data=synthetic",
        "data.shape=[3,32,32]",
        "data.num_samples=600",
        "data.val_size=100",
        "model=cnn",
        "model.width=64",
        "batch=finder",
        "optimizer=adamw",
        "trainer.eval_batch_size=8",
    )
    prober = ChildProber(cfg, build_data(cfg), memory.held() + 400 * memory.MIB, distributed=False)
    try:
        assert prober.attempt(64).ok
        first = prober.process.pid
        larger, smaller = prober.attempt(384), prober.attempt(256)  # ~1.4 MB a sample: neither fits
        assert not larger.ok and not smaller.ok and memory.is_oom(RuntimeError(smaller.error)), (larger, smaller)
        # A smaller size failing later in its step (256 about 1 s into it, 384 a few tenths), as
        # memory grows through the step, is no contradiction: the same process goes on.
        assert prober.process.pid == first and "sooner" not in caplog.text, (larger, smaller, caplog.text)
        # Room for small allocations (a few MiB), none for a batch of 32's activations (8 MiB a layer).
        resource.prlimit(first, resource.RLIMIT_AS, (memory.vm_size(first) + 4 * memory.MIB, resource.RLIM_INFINITY))
        with caplog.at_level("WARNING"):
            trial = prober.attempt(32)
        assert trial.ok and prober.process.pid != first, (trial, caplog.text)
        assert "micro-batch 32 failed after" in caplog.text and "far sooner than" in caplog.text
    finally:
        prober.close()


ARENA_SCRIPT = """
import sys, threading
import torch
from bsexp.system import memory

memory.one_arena()  # as bsexp.train.job does where a run is capped, before any other thread allocates
# A thread that allocates (torch's own worker threads do): with an arena of its own, it would
# leave 64 MiB of address space reserved that an allocation refused under the cap can fall back to.
worker = threading.Thread(target=lambda: [bytearray(1000) for _ in range(1000)] and torch.ones(1000).sum())
worker.start(); worker.join()
memory.return_freed_memory()
memory.cap_memory(memory.held() + 16 * memory.MIB)
try:
    print("allocated", torch.ones(12 * memory.MIB).numel())  # 48 MiB
except RuntimeError as exc:
    print("refused", memory.is_oom(exc))
"""


def test_a_capped_process_cannot_outgrow_its_cap_through_another_threads_arena():
    # Before one_arena, glibc retried the refused 48 MiB in the worker thread's arena and it
    # succeeded: a run capped at 1.2 GB held 1.25 GB, and the finder's bench truth was inflated.
    done = subprocess.run(
        [sys.executable, "-c", ARENA_SCRIPT], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["refused", "True"], done.stdout


LIBRARY_PAGES_SCRIPT = """
import mmap, os
import torch
from bsexp.system import memory

memory.return_freed_memory()
limit = memory.held() + 64 * memory.MIB
before = memory.cap_memory(limit)
memory.lift_memory_cap()
# torch's own library, read: its pages become resident, file-backed, as a library's pages do
# (how many of them are resident differs from one process to the next).
with open(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"), "rb") as lib:
    pages = mmap.mmap(lib.fileno(), 0, prot=mmap.PROT_READ)
resident = memory.rss()
sum(pages[i] for i in range(0, len(pages), mmap.PAGESIZE))
grown = memory.rss() - resident
after = memory.cap_memory(limit)
fits = torch.ones(8 * memory.MIB).numel()  # 32 MiB
try:
    torch.ones(32 * memory.MIB).sum()  # 128 MiB
    refused = False
except RuntimeError as exc:
    refused = memory.is_oom(exc)
print(grown // memory.MIB, before // memory.MIB, after // memory.MIB, fits, refused)
"""


def test_a_cap_counts_what_the_process_holds_not_its_librarys_resident_pages():
    # Before, the cap took the room from the resident set, library pages included: 300-311 MB of
    # torch's pages in five runs of one command, which moved every cap and every finder answer.
    done = subprocess.run(
        [sys.executable, "-c", LIBRARY_PAGES_SCRIPT], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    grown_mb, before_mb, after_mb, fits, refused = done.stdout.split()
    assert int(grown_mb) > 200  # the library's pages became resident
    assert abs(int(after_mb) - int(before_mb)) <= 2  # and the cap's room did not move
    assert fits == str(8 * memory.MIB) and refused == "True"  # the room is still a real cap


BAR_SCRIPT = """
import sys, threading
from hydra import compose, initialize_config_dir
from bsexp.config.schema import register_configs
from bsexp.runs.sweep import register_resolvers
from bsexp.train.loop import TrainState, build_loop, train

register_configs()
register_resolvers()
with initialize_config_dir(config_dir=sys.argv[1], version_base="1.3"):
    cfg = compose("config", overrides=["logger=none", "trainer.progress=false", "data=digits", "model=mlp",
                                       "epochs=1", "trainer.max_steps=3"])
loop = build_loop(cfg)
before = {thread.ident for thread in threading.enumerate()}
print(train(loop, TrainState()), [t.name for t in threading.enumerate() if t.ident not in before])
"""


def test_training_starts_no_thread_for_its_progress_bar():
    # tqdm starts a monitor thread with its first bar, even a disabled one: 8 MB of address space
    # (its stack) that a run under trainer.memory_limit_gb loses and the finder's trials never see.
    from pathlib import Path

    import bsexp

    conf = Path(bsexp.__file__).parent / "conf"
    out = subprocess.run(
        [sys.executable, "-c", BAR_SCRIPT, str(conf)], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "completed []", out.stdout
