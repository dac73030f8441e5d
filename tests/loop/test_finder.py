"""The batch-size finder under real memory caps: real allocator failures in a child process."""

import math
import os
import subprocess
import sys
import threading

import pytest
import torch
from forkservers import forkservers
from omegaconf import OmegaConf

from bsexp.engine.build import build_data, build_model
from bsexp.engine.distributed import World
from bsexp.errors import ConfigError
from bsexp.finder.find import find_plan
from bsexp.train.loop import TrainState, build_loop, train
from bsexp.train.preflight import check_all as check

# Memory grows fast with the batch and compute does not: one wide hidden layer on 40 inputs.
WIDE = [
    "data=synthetic",
    "data.shape=[1,40]",
    "data.num_samples=8000",
    "data.val_size=200",
    "model=mlp",
    "model.hidden=[8192]",
    "batch=finder",
    "trainer.progress=false",
    "epochs=1",
]
GIB = 2**30


def find(make_cfg, *overrides, limit_gb=None, base=WIDE):
    cfg = make_cfg(*base, *overrides)
    check(cfg)
    splits = build_data(cfg)
    limit = None if limit_gb is None else int(limit_gb * GIB)
    return find_plan(cfg, World(), splits, build_model(cfg, splits), limit, keep_size=cfg.batch.size)


def test_a_real_cpu_oom_is_recognised_and_other_errors_are_not():
    script = """
import torch
from bsexp.system import memory
memory.return_freed_memory()
memory.cap_memory(memory.held() + 200 * memory.MIB)
try:
    torch.empty(2**30, dtype=torch.uint8).fill_(1)
except Exception as exc:
    print("oom" if memory.is_oom(exc) else "other", type(exc).__name__, "|", memory.error_line(exc))
try:
    bytearray(2**30)  # Python's own allocator: a MemoryError without a message
except Exception as exc:
    print("oom" if memory.is_oom(exc) else "other", type(exc).__name__, "|", memory.error_line(exc))
small = torch.empty(10 * memory.MIB, dtype=torch.uint8).fill_(1)  # the process goes on
print("alive", memory.is_oom(RuntimeError("shape mismatch")), memory.is_oom(torch.OutOfMemoryError("x")))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    first, python, second = out.stdout.strip().splitlines()
    assert first.startswith("oom RuntimeError") and "can't allocate memory" in first
    assert python == "oom MemoryError | MemoryError"
    assert second == "alive False True"


def test_finding_leaves_the_run_exactly_as_a_fixed_run_at_that_size(make_cfg):
    finder_cfg = make_cfg(*WIDE, "model.hidden=[64]", "batch.finder.max_size=200", "trainer.max_steps=3")
    finder_loop = build_loop(finder_cfg)
    size = finder_loop.batch_control.current.size
    rng_after_finder = torch.get_rng_state()
    fixed_cfg = make_cfg(
        *[o for o in WIDE if o != "batch=finder"], "model.hidden=[64]", f"batch.size={size}", "trainer.max_steps=3"
    )
    fixed_loop = build_loop(fixed_cfg)
    # 200 (max_size) fits, memory far beyond it: the bound itself (at 3ea6d43: 190, 5 % below it);
    # where the trials measured no edge (once in CI, on a machine busy with an install), 5 % below.
    found = finder_loop.batch_control.found
    assert found.trials and size == (200 if found.edge is not None else 190)
    assert torch.equal(torch.get_rng_state(), rng_after_finder)
    for loop in (finder_loop, fixed_loop):
        train(loop, TrainState())
    for key, value in fixed_loop.step.model.state_dict().items():
        assert torch.equal(finder_loop.step.model.state_dict()[key], value), key


def test_the_probes_fork_from_a_server_that_is_gone_once_the_batch_is_found(make_cfg):
    # The server (bsexp.finder.server) imports torch once for every probe process; it lives
    # while the data and model are built and the finder searches, not while the run trains.
    cfg = make_cfg(*WIDE, "model.hidden=[64]", "batch.finder.max_size=200", "trainer.max_steps=1")
    seen, done = set(), threading.Event()

    def watch():
        while not done.is_set():
            seen.update(forkservers(parent=os.getpid()))
            done.wait(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        loop = build_loop(cfg)
    finally:
        done.set()
        watcher.join()
    assert loop.batch_control.found.trials and len(seen) == 1
    assert forkservers(parent=os.getpid()) == []
    train(loop, TrainState())  # the run trains without it


def test_max_size_reached_while_doubling_is_tried_not_assumed(make_cfg):
    result = find(make_cfg, "model.hidden=[64]", "batch.finder.mode=power", "batch.finder.max_size=100")
    sizes = sorted(t.size for t in result.trials)
    assert sizes == [8, 16, 32, 64, 100]  # 100 tried
    # Memory runs out far above 100 (the machine's free memory): the margin, headroom for memory,
    # leaves 100 itself (at 3ea6d43: 95, the margin below it whatever bounded the search).
    assert result.edge > 100 / 0.95 and result.micro_size == 100


def test_the_probe_processes_read_values_only_this_process_can_resolve(make_cfg):
    """A comparison's run sets its searched keys by `${bsexp_tuned:...}`, a resolver its own process
    registered; the probe processes start without it (every run of a comparison's goodput arm, which
    finds its micro-batch, failed there: "Unsupported interpolation type bsexp_tuned")."""
    OmegaConf.register_new_resolver("only_in_this_process", lambda: 0.05, replace=True)
    try:
        result = find(
            make_cfg, "model.hidden=[64]", "batch.finder.max_size=64", "optimizer.lr=${only_in_this_process:}"
        )
    finally:
        OmegaConf.clear_resolver("only_in_this_process")
    assert len(result.trials) >= 2 and 32 <= result.micro_size <= 64  # searched in the probes, not failed there


def test_the_answer_leaves_room_for_the_kernels_of_the_shapes_the_run_meets_and_the_trials_do_not(make_cfg):
    # A conv net (oneDNN compiles kernels per shape). The default run meets two shapes the trials do
    # not run: an epoch's short last batch, and the test split's evaluation (512 samples, beside
    # the 200 of validation the probe measured): the kernels of one training and one evaluation
    # shape are left below the edge. Without a short batch or a test split, none.
    conv = ["model=cnn1d", "model.width=8", "batch.finder.max_size=64", "batch.finder.data_fraction=null"]
    base = [o for o in WIDE if not o.startswith("model")]
    both = find(make_cfg, *conv, base=base)
    assert both.memory["kernel_cache_mb"] > 0
    assert both.headroom_mb == pytest.approx(both.memory["kernel_cache_mb"])
    neither = find(make_cfg, *conv, "batch.drop_last=true", "data.test_size=0", base=base)
    assert neither.headroom_mb == 0


def test_a_global_batch_is_kept_by_choosing_micro_batch_and_accumulation(make_cfg):
    result = find(make_cfg, "model.hidden=[64]", "batch.size=1000", "batch.finder.max_size=300")
    plan = result.plan
    assert (plan.size, plan.micro_size, plan.accum_steps) == (1000, 250, 4)  # 300 fits; 285 -> divisor 250
    assert max(t.size for t in result.trials if t.ok) == 300  # 250 lies below a size that passed


def test_init_that_does_not_fit_is_a_clear_error(make_cfg):
    from bsexp.system import memory

    room_gb = (memory.held() + 150 * memory.MIB) / GIB  # 4096 samples need about 500 MB
    with pytest.raises(ConfigError) as info:
        find(make_cfg, "batch.finder.init=4096", "batch.finder.data_fraction=null", limit_gb=room_gb)
    assert info.value.key == "batch.finder.init"
    assert "even 4096 samples do not fit" in str(info.value) and "precision=bf16" in str(info.value)


def test_the_evaluation_pass_is_checked_after_the_search_only_where_no_trial_as_large_passed(make_cfg):
    # Evaluation batches of 200 (the validation split): trials of 256 show that it fits (a forward
    # without gradients holds less than a training step at the same size); trials up to 64 do not.
    shown = find(make_cfg, "model.hidden=[64]", "batch.finder.max_size=256").memory
    assert (shown["eval_size"], shown["eval_shown_by"], shown["eval_peak_mb"]) == (200, 256, None)
    checked = find(make_cfg, "model.hidden=[64]", "batch.finder.max_size=64").memory
    assert checked["eval_shown_by"] is None and checked["eval_peak_mb"] > 0


def test_an_evaluation_batch_that_does_not_fit_is_a_clear_error_naming_it(make_cfg):
    from bsexp.system import memory

    # Training steps of up to 16 samples fit in 150 MB; evaluating 4000 at once (~250 MB) does not.
    room_gb = (memory.held() + 150 * memory.MIB) / GIB
    with pytest.raises(ConfigError) as info:
        find(
            make_cfg, "data.val_size=4000", "trainer.eval_batch_size=4000", "batch.finder.max_size=16", limit_gb=room_gb
        )
    assert info.value.key == "trainer.eval_batch_size" and info.value.value == 4000
    assert "evaluation pass (4,000 samples a batch) does not fit" in str(info.value)
    assert "training steps of 16 samples do" in str(info.value)


def test_a_limit_below_what_the_process_holds_is_a_clear_error(make_cfg):
    with pytest.raises(ConfigError) as info:
        find(make_cfg, "batch.finder.memory_limit_gb=0.02")
    assert info.value.key == "batch.finder.memory_limit_gb" and "holds already" in str(info.value)


def test_an_error_that_is_not_out_of_memory_propagates_unchanged(make_cfg, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "raises.yaml").write_text("_target_: user_models.RaisesAbove\nabove: 100\n")
    with pytest.raises(ValueError, match=r"RaisesAbove: batch of \d+ > 100"):
        find(
            make_cfg,
            f"hydra.searchpath=[file://{tmp_path}]",
            "model=raises",
            base=[o for o in WIDE if not o.startswith("model")],
        )


def test_throughput_objective_takes_the_smallest_size_near_the_best_rate(make_cfg):
    result = find(
        make_cfg,
        "model.hidden=[64]",
        "batch.finder.objective=throughput",
        "batch.finder.max_size=512",
        "batch.finder.throughput_tolerance=0.5",
    )
    timed = [t for t in result.trials if t.ok and t.samples_per_s]
    best = max(t.samples_per_s for t in timed)
    near = sorted(t.size for t in timed if t.samples_per_s >= 0.5 * best)
    largest = max(t.size for t in result.trials if t.ok)
    # The smallest size near the best rate, but never above the largest that fit nor the margin
    # below the measured edge (on a busy machine the largest may be the only size near the best rate).
    edge = result.edge or largest
    assert result.micro_size == min(near[0], largest, math.floor(edge * (1 - result.margin)))
    assert "Throughput objective" in result.note


def test_with_activation_checkpointing_the_finder_reports_its_trade(make_cfg):
    # Three conv blocks a stage: checkpointed, each keeps its input alone, not its conv, norm and
    # ReLU outputs, so a sample costs less memory and a second forward.
    result = find(
        make_cfg,
        "model=cnn",
        "model.width=8",
        "model.activation_checkpointing=true",
        "batch.finder.max_size=256",
        base=[o for o in WIDE if not o.startswith(("model", "data.shape"))]
        + ["data.shape=[3,16,16]", "batch.finder.data_fraction=null"],
    )
    c = result.checkpointing
    assert c["checkpointing_found"] == 256 and c["plain_fits_there"] is True and c["checkpointing_compared_at"] <= 128
    assert c["plain_per_sample_mb"] > result.memory["per_sample_mb"] > 0  # the memory it saves, measured
    assert c["slowdown_per_sample"] > 0 and c["plain_size_estimate"] > 0  # (how much slower: a benchmark's question)
    assert "activation checkpointing: 256 fit with it" in result.table()
