"""The batch-size finder under real memory caps: real allocator failures in a child process."""

import json
import math
import subprocess
import sys

import pytest
import torch

import dist_workers
from bsexp.config import check
from bsexp.distributed import World
from bsexp.errors import ConfigError
from bsexp.finder import find_plan
from bsexp.run import build_data, build_loop, build_model
from bsexp.trainer import Progress, train
from conftest import limit_for_size

# Memory grows fast with the batch and compute does not: one wide hidden layer on 40 inputs.
WIDE = ["data=synthetic", "data.shape=[1,40]", "data.num_samples=8000", "data.val_size=200",
        "model=mlp", "model.hidden=[8192]", "batch=finder", "trainer.progress=false", "epochs=1"]
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
from bsexp import memory
memory.return_freed_memory()
memory.cap_memory(memory.rss() + 200 * memory.MIB)
try:
    torch.empty(2**30, dtype=torch.uint8).fill_(1)
except Exception as exc:
    print("oom" if memory.is_oom(exc) else "other", type(exc).__name__, "|", str(exc).splitlines()[0][:160])
small = torch.empty(10 * memory.MIB, dtype=torch.uint8).fill_(1)  # the process goes on
print("alive", memory.is_oom(RuntimeError("shape mismatch")), memory.is_oom(torch.OutOfMemoryError("x")))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.strip().splitlines()
    assert first.startswith("oom RuntimeError") and "can't allocate memory" in first
    assert second == "alive False True"


def finder_run(run_cli, run_dir, *overrides):
    """`python -m bsexp.train batch=finder ...`: find, then train for an epoch, in one process."""
    out = run_cli(*WIDE, "logger=none", f"hydra.run.dir={run_dir}", *overrides)
    finder = json.loads((run_dir / "finder.json").read_text()) if (run_dir / "finder.json").exists() else None
    return out, finder


@pytest.fixture(scope="module")
def calibrated_limit_gb(data_root, tmp_path_factory):
    """A memory limit under which the largest batch that fits lies between 2048 and 2048 x 1.15,
    so that doubling ends close to it too (2048 fits, 4096 does not)."""
    return limit_for_size(data_root, tmp_path_factory.mktemp("calibration"), WIDE, 2048 * 1.08)


# fit is the default; power and binsearch run with scripts/test_slow.sh (and scripts/bench_finder.py).
@pytest.mark.parametrize("mode", ["fit", pytest.param("power", marks=pytest.mark.slow),
                                  pytest.param("binsearch", marks=pytest.mark.slow)])
def test_each_mode_finds_a_size_that_trains_under_the_cap_and_close_to_it(run_cli, tmp_path, calibrated_limit_gb, mode):
    limit = calibrated_limit_gb
    # Find and then train a full epoch with evaluation, all under the same real cap.
    out, finder = finder_run(run_cli, tmp_path / "found", f"batch.finder.mode={mode}", "batch.finder.max_trials=16",
                             f"batch.finder.memory_limit_gb={limit}", f"trainer.memory_limit_gb={limit}")
    assert out.returncode == 0, out.stderr[-2000:]
    size = finder["micro_size"]
    assert {t["size"]: t["ok"] for t in finder["trials"]}[size] is True  # never an untried size
    assert finder["plan"]["size"] == size and finder["plan"]["accum_steps"] == 1  # the found size is the batch
    summary = json.loads((tmp_path / "found" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["batch_size"] == size
    # 25 % more does not fit: the finder is near the limit, not far below it.
    bigger = run_cli(*[o for o in WIDE if o != "batch=finder"], "logger=none", f"batch.size={int(size * 1.25)}",
                     f"trainer.memory_limit_gb={limit}", "trainer.oom_recovery=false", f"hydra.run.dir={tmp_path / 'bigger'}")
    assert bigger.returncode == 1 and "out of memory" in bigger.stderr


def test_finding_leaves_the_run_exactly_as_a_fixed_run_at_that_size(make_cfg):
    finder_cfg = make_cfg(*WIDE, "model.hidden=[64]", "batch.finder.max_size=200", "trainer.max_steps=3")
    finder_loop = build_loop(finder_cfg, check(finder_cfg))
    size = finder_loop.plan.size
    rng_after_finder = torch.get_rng_state()
    fixed_cfg = make_cfg(*[o for o in WIDE if o != "batch=finder"], "model.hidden=[64]", f"batch.size={size}",
                         "trainer.max_steps=3")
    fixed_loop = build_loop(fixed_cfg, check(fixed_cfg))
    assert size == 190 and finder_loop.finder.trials  # 200 fits; 5 % below it
    assert torch.equal(torch.get_rng_state(), rng_after_finder)
    for loop in (finder_loop, fixed_loop):
        train(loop, Progress())
    for key, value in fixed_loop.model.state_dict().items():
        assert torch.equal(finder_loop.model.state_dict()[key], value), key


def test_max_size_reached_while_doubling_is_tried_not_assumed(make_cfg):
    result = find(make_cfg, "model.hidden=[64]", "batch.finder.mode=power", "batch.finder.max_size=100")
    sizes = sorted(t.size for t in result.trials)
    assert sizes == [8, 16, 32, 64, 95, 100] and result.micro_size == 95  # 100 tried; 5 % margin below it


def test_a_global_batch_is_kept_by_choosing_micro_batch_and_accumulation(make_cfg):
    result = find(make_cfg, "model.hidden=[64]", "batch.size=1000", "batch.finder.max_size=300")
    plan = result.plan
    assert (plan.size, plan.micro_size, plan.accum_steps) == (1000, 250, 4)  # 300 fits; 285 -> divisor 250
    assert {t.size: t.ok for t in result.trials}[250] is True


def test_init_that_does_not_fit_is_a_clear_error(make_cfg):
    from bsexp import memory

    room_gb = (memory.rss() + 150 * memory.MIB) / GIB  # 4096 samples need about 500 MB
    with pytest.raises(ConfigError) as info:
        find(make_cfg, "batch.finder.init=4096", limit_gb=room_gb)
    assert info.value.key == "batch.finder.init"
    assert "even 4096 samples do not fit" in str(info.value) and "precision=bf16" in str(info.value)


def test_a_limit_below_what_the_process_holds_is_a_clear_error(make_cfg):
    with pytest.raises(ConfigError) as info:
        find(make_cfg, "batch.finder.memory_limit_gb=0.02")
    assert info.value.key == "batch.finder.memory_limit_gb" and "holds already" in str(info.value)


def test_an_error_that_is_not_out_of_memory_propagates_unchanged(make_cfg, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "raises.yaml").write_text("_target_: user_models.RaisesAbove\nabove: 100\n")
    with pytest.raises(ValueError, match=r"RaisesAbove: batch of \d+ > 100"):
        find(make_cfg, f"hydra.searchpath=[file://{tmp_path}]", "model=raises",
             base=[o for o in WIDE if not o.startswith("model")])


def test_throughput_objective_takes_the_smallest_size_near_the_best_rate(make_cfg):
    result = find(make_cfg, "model.hidden=[64]", "batch.finder.objective=throughput", "batch.finder.max_size=512",
                  "batch.finder.throughput_tolerance=0.5")
    timed = [t for t in result.trials if t.ok and t.samples_per_s]
    best = max(t.samples_per_s for t in timed)
    near = sorted(t.size for t in timed if t.samples_per_s >= 0.5 * best)
    largest = max(t.size for t in result.trials if t.ok)
    # The smallest size near the best rate, but never above the margin below the largest that fit
    # (on a busy machine the largest may be the only size near the best rate).
    assert result.micro_size == min(near[0], math.floor(largest * (1 - 0.05)))
    assert "Throughput objective" in result.note


def test_two_ranks_with_different_memory_agree_on_a_size_that_fits_both(make_cfg, calibrated_limit_gb):
    # Rank 1 has 200 MB less than rank 0: a size passes only if it passed on both.
    limits = [calibrated_limit_gb + 0.15, calibrated_limit_gb - 0.05]
    cfg = make_cfg(*WIDE, "distributed=ddp", "batch.finder.max_trials=14")
    results = dist_workers.launch(dist_workers.find_and_train, cfg, limits)
    plans = [results[rank]["plan"] for rank in (0, 1)]
    assert plans[0] == plans[1] and plans[0].world_size == 2 and plans[0].size == 2 * plans[0].micro_size
    assert all(results[rank]["status"] == "completed" for rank in (0, 1))  # trained under each rank's own cap
    tried = results[0]["tried"]
    assert tried[plans[0].micro_size] is True and tried == results[1]["tried"]  # one search, agreed
    too_big = [size for size, ok in tried.items() if not ok]
    assert too_big and min(too_big) < 2 * plans[0].micro_size  # the tighter rank bounded it


def test_a_finder_run_records_its_trials_and_the_input_pipeline_rate(run_cli, tmp_path):
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    args = [*[o for o in WIDE if o != "epochs=1"], "model.hidden=[64]", "batch.finder.max_size=256", "epochs=1",
            "batch.finder.cache=true", f"batch.finder.cache_dir={cache}"]
    out = run_cli(*args, f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-2000:]
    finder = json.loads((run_dir / "finder.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert finder["micro_size"] == summary["micro_size"] == summary["batch_size"] == 243  # 256 fits; 5 % below
    assert {t["size"] for t in finder["trials"]} >= {8, 32, 128, 243, 256}
    assert summary["finder"]["trials"] == len(finder["trials"]) and summary["finder"]["cached"] is False
    assert summary["finder"]["loader_samples_per_s"] > 0 and summary["finder"]["step_samples_per_s"] > 0
    assert "finder (fit, objective max" in out.stdout and "chosen: micro-batch 243" in out.stdout
    [run_file] = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    import wandb_records

    assert wandb_records.summary(run_file)["finder/micro_size"] == 243
    # The same setup again: the cached result, no probing.
    again = run_cli(*args, f"hydra.run.dir={tmp_path / 'again'}")
    assert again.returncode == 0, again.stderr[-2000:]
    cached = json.loads((tmp_path / "again" / "finder.json").read_text())
    assert cached["cached"] is True and cached["micro_size"] == 243 and " fits" not in again.stdout
    # Keeping a global batch is another question: its micro-batch must divide it (not the cached 243).
    kept = run_cli(*args, "batch.size=200", f"hydra.run.dir={tmp_path / 'kept'}")
    assert kept.returncode == 0, kept.stderr[-2000:]
    kept_summary = json.loads((tmp_path / "kept" / "summary.json").read_text())
    # 200 per step fits; 5 % below it, the largest divisor of 200 is 100: 2 micro-steps of 100.
    assert (kept_summary["batch_size"], kept_summary["micro_size"], kept_summary["accum_steps"]) == (200, 100, 2)
    assert kept_summary["finder"]["cached"] is False
