"""bsexp on a real GPU, run as a user runs it (the CLI, in fresh processes): every batch policy in
every precision, a real CUDA OOM recovered mid-run, the finder against a truth found in fresh
processes, accumulation against one large batch, resume after kill -9, torchrun with native
SyncBatchNorm, the noise scale under fp16, and more ranks than GPUs.

Skipped without CUDA. The default tiers hide CUDA (tests/conftest.py), so these run only with
BSEXP_TEST_GPU=1: `BSEXP_TEST_GPU=1 pytest -m cuda tests/gpu` (scripts/gpu_check.sh does).
"""

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import cli_env

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="no CUDA device visible (the default tiers hide it; BSEXP_TEST_GPU=1 pytest -m cuda tests/gpu)",
    ),
]

ON_GPU = ["device=cuda", "logger=none", "trainer.progress=false"]  # trainer.speed=auto: fast on CUDA
# What the equivalences hold bit for bit (or to rounding): the reproducible path (docs: GPUs).
REPRODUCIBLE = "trainer.speed=reproducible"
# ResNet-18 on CIFAR-shaped synthetic images in bf16: memory grows fast with the batch.
RESNET = [
    "data=synthetic",
    "data.shape=[3,32,32]",
    "data.num_samples=12000",
    "data.val_size=512",
    "model=resnet18",
    "precision=bf16",
]


def train(data_root: Path, run_dir: Path, *args: str, torchrun: int = 0, timeout: float = 600):
    """`python -m bsexp.train ARGS` (or under torchrun) into `run_dir`; the process and its summary."""
    launcher = ["-m", "torch.distributed.run", f"--nproc_per_node={torchrun}", "--standalone"] if torchrun else []
    out = subprocess.run(
        [sys.executable, *launcher, "-m", "bsexp.train", *args, f"hydra.run.dir={run_dir}"],
        cwd=run_dir.parent,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    path = run_dir / "summary.json"
    return out, json.loads(path.read_text()) if path.exists() else None


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


POLICIES = {
    "fixed": ["batch.size=256", "trainer.memory_limit_gb=4"],  # a CUDA memory cap crashed on a76dc77
    "accumulation": ["batch=accumulation", "batch.size=256", "batch.micro_size=64"],
    "finder": ["batch=finder", "batch.finder.memory_limit_gb=4"],
    "scheduled": ["batch=scheduled", "batch.size=64", "batch.schedule.milestones=[2,4]", "batch.schedule.factor=2"],
    "adaptive": ["batch=adaptive"],  # its finder caps the memory
}


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_batch_policy_trains_on_the_gpu(data_root, tmp_path, policy, precision):
    out, summary = train(data_root, tmp_path / "run", *ON_GPU, *POLICIES[policy], f"precision={precision}", "epochs=6")
    assert out.returncode == 0, out.stderr[-3000:]
    assert summary["status"] == "completed" and summary["device"] == "cuda:0" and summary["precision"] == precision
    assert summary["peak_memory_mb"] > 0 and math.isfinite(summary["train_loss"])
    assert summary["val_acc"] > 0.6  # MNIST-1D's 10 classes: chance is 0.1


def test_a_real_cuda_oom_mid_run_keeps_the_global_batch_and_trains_as_if_started_at_the_recovered_micro_batch(
    data_root, tmp_path
):
    # The batch grows 256 -> 1024 -> 4096 by schedule; under a 3 GB cap the step of 4096 cannot fit.
    grow = [
        *ON_GPU,
        REPRODUCIBLE,
        *RESNET,
        "batch=scheduled",
        "batch.size=256",
        "batch.schedule.milestones=[1,2]",
        "batch.schedule.factor=4",
        "epochs=3",
        "trainer.memory_limit_gb=3",
    ]
    out, recovered = train(data_root, tmp_path / "recovered", *grow)
    assert out.returncode == 0, out.stderr[-3000:]
    assert recovered["status"] == "completed" and recovered["oom_recoveries"] >= 1
    assert recovered["final_batch_size"] == 4096 and recovered["final_micro_size"] < 4096  # the global batch kept
    micro = recovered["final_micro_size"]
    out, direct = train(data_root, tmp_path / "direct", *grow, f"batch.micro_size={micro}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert direct["oom_recoveries"] == 0 and direct["final_micro_size"] == micro
    # Not bit for bit: under the cap cuDNN picks convolution algorithms by the workspace left, and
    # those round differently; the runs take the same steps on the same samples. Measured on an
    # H200 with a hand-patched a76dc77: 1.4e-3 apart.
    assert recovered["val_loss"] == pytest.approx(direct["val_loss"], rel=1e-2)
    assert [r["step"] for r in records(tmp_path / "recovered")] == [r["step"] for r in records(tmp_path / "direct")]


def test_the_finder_finds_at_least_92_percent_of_the_truth_and_nothing_above_it(data_root, tmp_path):
    cap = [REPRODUCIBLE, "trainer.memory_limit_gb=6", "trainer.oom_recovery=false", "trainer.max_steps=3"]
    out, summary = train(
        data_root,
        tmp_path / "found",
        *ON_GPU,
        *RESNET,
        *cap,
        "batch=finder",
        "batch.finder.memory_limit_gb=6",
        # Memory alone bounds the search: by default it stops at a tenth of the training set (1,148
        # here), far below what 6 GB holds (2,326 on the H200), and found / 0.92 would still fit.
        "batch.finder.data_fraction=null",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = summary["micro_size"]
    assert summary["status"] == "completed" and summary["batch_size"] == found  # the found size trains, capped
    # The truth, in fresh processes under the same cap: the found size runs (three steps and the
    # evaluation), and found / 0.92 does not, so found >= 0.92 x the largest that fits.
    out, at_found = train(data_root, tmp_path / "at_found", *ON_GPU, *RESNET, *cap, f"batch.size={found}")
    assert out.returncode == 0 and at_found["status"] == "completed", out.stderr[-3000:]
    above = math.ceil(found / 0.92) + 1
    out, _ = train(data_root, tmp_path / "above", *ON_GPU, *RESNET, *cap, f"batch.size={above}")
    assert out.returncode == 1 and "out of memory" in out.stderr, out.stderr[-3000:]


# The fast path with and without torch.compile: where CUDA graphs (reduce-overhead) broke
# accumulation on the H200 (pytorch/pytorch#169545), TF32 and the autotuner's algorithms rounding.
SPEEDS = {
    "reproducible": ([REPRODUCIBLE], 1e-2),
    "fast": (["trainer.speed=fast"], 2e-2),
    "compiled": (["trainer.speed=fast", "trainer.compile_mode=default"], 2e-2),
}


@pytest.mark.parametrize("speed", list(SPEEDS))
def test_accumulation_equals_one_large_batch_on_the_gpu(data_root, tmp_path, speed):
    # The default run's set-up (it trains to ~99 % on the GPU), its BatchNorm over ghost batches of
    # 32 so that one batch of 128 normalises as four accumulated micro-batches of 32 do. Eight
    # steps: training this net amplifies rounding about 1.5x a step (on the CPU the two agree to
    # 1e-7 after 8 steps and differ by 2 % after 28), so a longer run compares chaos, not steps.
    # Gradients that lost all but the last micro-batch's (the CUDA-graph failure) move far more.
    overrides, tolerance = SPEEDS[speed]
    common = [*ON_GPU, *overrides, "precision=fp32", "batch.size=128", "trainer.max_steps=8"]
    out, large = train(data_root, tmp_path / "large", *common, "model.ghost_batch=32")
    assert out.returncode == 0, out.stderr[-3000:]
    out, accumulated = train(data_root, tmp_path / "accumulated", *common, "batch=accumulation", "batch.micro_size=32")
    assert out.returncode == 0, out.stderr[-3000:]
    assert large["val_loss"] < 2.1  # it learns (chance: ln 10 = 2.30; the CPU reaches 1.77)
    # Not bit for bit: cuDNN's convolutions run in TF32 (torch's default for them, the
    # reproducible path's too) over 128 samples at once against 32, with algorithms of their own.
    assert accumulated["val_loss"] == pytest.approx(large["val_loss"], rel=tolerance)
    assert accumulated["samples_seen"] == large["samples_seen"] and accumulated["steps"] == large["steps"] == 8


def test_a_run_killed_mid_way_resumes_bit_identically_on_the_gpu(data_root, tmp_path):
    args = [
        *ON_GPU,
        REPRODUCIBLE,
        "data=synthetic",
        "data.shape=[1,128]",
        "data.num_samples=4000",
        "data.val_size=200",
        "model=mlp",
        "model.norm=none",
        "model.hidden=[1024,1024]",
        "epochs=20",
        "batch.size=64",
        "checkpoint.every_steps=7",
        "checkpoint.keep=3",
        "trainer.eval_every_steps=50",
    ]
    out, whole = train(data_root, tmp_path / "whole", *args)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bsexp.train", *args, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=cli_env(data_root),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while not any(int(p.stem.split("-")[1]) >= 100 for p in (run_dir / "checkpoints").glob("step-*.pt")):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    out, resumed = train(data_root, run_dir, *args, "resume=auto")
    assert out.returncode == 0, out.stderr[-3000:]
    assert resumed["status"] == "completed" and resumed["resumed_from"] is not None
    assert [r["val_loss"] for r in records(run_dir)] == [r["val_loss"] for r in records(tmp_path / "whole")]
    assert resumed["val_loss"] == whole["val_loss"]


def test_torchrun_with_one_process_equals_a_plain_run(data_root, tmp_path):
    args = [*ON_GPU, REPRODUCIBLE, "model.norm=batch", "epochs=3"]
    out, plain = train(data_root, tmp_path / "plain", *args)
    assert out.returncode == 0, out.stderr[-3000:]
    out, ranked = train(
        data_root, tmp_path / "torchrun", *args, "distributed=ddp", "distributed.sync_batchnorm=true", torchrun=1
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert ranked["world_size"] == 1 and ranked["device"] == "cuda:0"
    assert ranked["val_loss"] == plain["val_loss"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_ranks_with_native_sync_batchnorm_equal_one_process(data_root, tmp_path):
    args = [*ON_GPU, REPRODUCIBLE, "model.norm=batch", "epochs=3", "batch.size=256", "precision=fp32"]
    out, one = train(data_root, tmp_path / "one", *args)
    assert out.returncode == 0, out.stderr[-3000:]
    out, two = train(
        data_root, tmp_path / "two", *args, "distributed=ddp", "distributed.sync_batchnorm=true", torchrun=2
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert two["world_size"] == 2 and {r["norm_batch"] for r in records(tmp_path / "two")} == {256}
    # SyncBatchNorm normalises over both ranks' 128, as one process over 256: rounding apart.
    assert two["val_loss"] == pytest.approx(one["val_loss"], rel=1e-2)


def test_the_noise_scale_is_finite_under_fp16(data_root, tmp_path):
    out, summary = train(
        data_root,
        tmp_path / "run",
        *ON_GPU,
        "precision=fp16",
        "batch=accumulation",
        "batch.size=128",
        "batch.micro_size=32",
        "trainer.noise_scale=always",
        "epochs=3",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert math.isfinite(summary["noise_b_simple"]) and summary["noise_b_simple"] > 0


def test_more_self_launched_ranks_than_gpus_is_one_line_and_exit_2(data_root, tmp_path):
    ranks = torch.cuda.device_count() + 1
    out, summary = train(
        data_root, tmp_path / "run", *ON_GPU, "distributed=ddp", f"distributed.nproc_per_node={ranks}", timeout=120
    )
    assert out.returncode == 2 and summary is None
    assert out.stderr.strip().splitlines() == [
        f"error: distributed.nproc_per_node={ranks}: {torch.cuda.device_count()} GPU"
        f"{'' if ranks == 2 else 's'} visible and each rank needs its own; valid: at most {ranks - 1}, or "
        f"device=cpu to run the ranks on the CPU"
    ]


def test_the_fast_path_is_cudas_default_trains_as_the_reproducible_one_and_compiles_few_graphs(data_root, tmp_path):
    # ResNet-18 in bf16 while the batch grows 128 -> 256 -> 512, over 5,120 training samples (every
    # epoch ends on a whole step: three training shapes).
    grow = [
        *ON_GPU,
        *RESNET,
        "data.num_samples=5632",
        "batch=scheduled",
        "batch.size=128",
        "batch.schedule.milestones=[1,2]",
        "batch.schedule.factor=2",
        "epochs=3",
    ]
    out, fast = train(data_root, tmp_path / "fast", *grow)
    assert out.returncode == 0, out.stderr[-3000:]
    assert fast["speed"]["fast"] and fast["speed"]["channels_last"] and fast["speed"]["compile"] is None
    out, compiled = train(data_root, tmp_path / "compiled", *grow, "trainer.compile_mode=default")
    assert out.returncode == 0, out.stderr[-3000:]
    assert compiled["speed"]["compile"] == "default"
    # Few graphs as the batch grows: the batch dimension is dynamic, or, where ResNet's code fixes
    # it, one graph a size (three); evaluation (BatchNorm in eval mode) compiles its own.
    assert 1 <= compiled["compiled_graphs"] <= 6, compiled["compiled_graphs"]
    out, slow = train(data_root, tmp_path / "slow", *grow, REPRODUCIBLE)
    assert out.returncode == 0, out.stderr[-3000:]
    assert not slow["speed"]["fast"] and slow["compiled_graphs"] == 0
    # TF32, the autotuner's algorithms and inductor's fused kernels round otherwise than the
    # reproducible path, from the first step. The run ends while its loss still falls steeply (on
    # the CPU, this run's validation loss: 632, 17.9, 0.29 at epochs 1-3; BatchNorm's running
    # statistics lag the weights), so the accuracy is held close and the loss loosely (bounds not
    # yet measured on a GPU).
    for other in (fast, compiled):
        assert other["val_acc"] == pytest.approx(slow["val_acc"], abs=0.05)
        assert other["val_loss"] == pytest.approx(slow["val_loss"], rel=0.3)


# --- the graphed step (trainer.cuda_graphs, issue 59): not yet run on a GPU when written; the
# bounds below are those of the eager tests above, to be tightened from what a GPU measures.
GRAPHED = ["trainer.speed=fast", "trainer.cuda_graphs=on"]


def graphs_ran(summary: dict) -> bool:
    """The run's steps were replayed from captured graphs (summary.json's cuda_graphs)."""
    graphs = summary["cuda_graphs"]
    return graphs is not None and graphs["mode"] == "captured" and graphs["replays"] > 0 and not graphs["disabled"]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_graphed_accumulation_equals_one_large_batch_and_the_eager_step(data_root, tmp_path, precision):
    # As test_accumulation_equals_one_large_batch_on_the_gpu, the whole step captured: the static
    # gradients take every micro-batch's gradient in place (pytorch/pytorch#169545 kept only the
    # last micro-batch's, which moves the loss far more than rounding).
    common = [*ON_GPU, *GRAPHED, f"precision={precision}", "batch.size=128", "trainer.max_steps=8"]
    out, large = train(data_root, tmp_path / "large", *common, "model.ghost_batch=32")
    assert out.returncode == 0, out.stderr[-3000:]
    accumulate = ["batch=accumulation", "batch.micro_size=32"]
    out, accumulated = train(data_root, tmp_path / "accumulated", *common, *accumulate)
    assert out.returncode == 0, out.stderr[-3000:]
    out, eager = train(data_root, tmp_path / "eager", *common, *accumulate, "trainer.cuda_graphs=off")
    assert out.returncode == 0, out.stderr[-3000:]
    assert graphs_ran(large) and graphs_ran(accumulated) and eager["cuda_graphs"] is None
    # Two warm-ups, then one capture replayed for the other six steps.
    assert accumulated["cuda_graphs"]["captured"] == 1 and accumulated["cuda_graphs"]["replays"] == 6
    tolerance = 2e-2 if precision == "fp32" else 5e-2
    assert large["val_loss"] < 2.1
    assert accumulated["val_loss"] == pytest.approx(large["val_loss"], rel=tolerance)
    # The replayed kernels are the eager step's: rounding apart at most (no deterministic algorithms).
    assert accumulated["val_loss"] == pytest.approx(eager["val_loss"], rel=1e-3)


def test_a_batch_that_changes_is_captured_once_a_key_and_trains_as_the_eager_step(data_root, tmp_path):
    # The default run's data, the batch 128 -> 256 -> 512 by epochs, accumulating micro-batches of
    # at most 128: keys (128,), (128, 128), (128,)*4; each epoch's short last step eager.
    grow = [
        *ON_GPU,
        *GRAPHED,
        "batch=scheduled",
        "batch.size=128",
        "batch.micro_size=128",
        "batch.schedule.milestones=[1,2]",
        "batch.schedule.factor=2",
        "epochs=3",
    ]
    out, graphed = train(data_root, tmp_path / "graphed", *grow)
    assert out.returncode == 0, out.stderr[-3000:]
    out, eager = train(data_root, tmp_path / "eager", *grow, "trainer.cuda_graphs=off")
    assert out.returncode == 0, out.stderr[-3000:]
    assert graphs_ran(graphed) and graphed["cuda_graphs"]["captured"] == 3
    assert graphed["final_batch_size"] == 512 and graphed["val_acc"] > 0.5
    assert graphed["val_loss"] == pytest.approx(eager["val_loss"], rel=1e-2)


def test_a_graphed_run_killed_mid_way_resumes_and_ends_as_the_uninterrupted_one(data_root, tmp_path):
    args = [
        *ON_GPU,
        *GRAPHED,
        "data=synthetic",
        "data.shape=[1,128]",
        "data.num_samples=4000",
        "data.val_size=200",
        "model=mlp",
        "model.norm=none",
        "model.hidden=[1024,1024]",
        "epochs=20",
        "batch=accumulation",
        "batch.size=64",
        "batch.micro_size=32",
        "checkpoint.every_steps=7",
        "checkpoint.keep=3",
        "trainer.eval_every_steps=50",
    ]
    out, whole = train(data_root, tmp_path / "whole", *args)
    assert out.returncode == 0, out.stderr[-3000:]
    assert graphs_ran(whole)
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bsexp.train", *args, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=cli_env(data_root),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while not any(int(p.stem.split("-")[1]) >= 100 for p in (run_dir / "checkpoints").glob("step-*.pt")):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    out, resumed = train(data_root, run_dir, *args, "resume=auto")
    assert out.returncode == 0, out.stderr[-3000:]
    assert resumed["status"] == "completed" and resumed["resumed_from"] is not None and graphs_ran(resumed)
    # An MLP in fp32: no cuDNN, the same kernels replayed; bit for bit expected, rounding allowed.
    assert resumed["val_loss"] == pytest.approx(whole["val_loss"], rel=1e-4)


def test_the_finder_measures_the_graphed_step_and_its_size_trains_graphed_without_running_out(data_root, tmp_path):
    # Its trials run the graphed step (warm-ups, the capture, a replay: the graph's pool in the
    # peak), so the size it finds trains graphed under the same cap, with no OOM recovery.
    cap = ["trainer.memory_limit_gb=6", "trainer.max_steps=6"]
    out, summary = train(
        data_root,
        tmp_path / "found",
        *ON_GPU,
        *RESNET,
        *GRAPHED,
        *cap,
        "batch=finder",
        "batch.finder.memory_limit_gb=6",
        "batch.finder.data_fraction=null",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert summary["status"] == "completed" and summary["oom_recoveries"] == 0
    assert graphs_ran(summary) and summary["micro_size"] >= 256  # 6 GB holds ~2,300 eagerly on an H200
