"""batch=finder through the CLI: each mode under a real cap, the trial table, the cache, the noise-scale objective."""

import json
import math
import subprocess
import sys
import uuid

import pytest
from forkservers import forkservers

from conftest import TINY_RUN, cli_env, limit_for_size

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
    "batch.finder.data_fraction=null",
]  # memory alone bounds the answer here


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
@pytest.mark.parametrize(
    "mode", ["fit", pytest.param("power", marks=pytest.mark.slow), pytest.param("binsearch", marks=pytest.mark.slow)]
)
def test_each_mode_finds_a_size_that_trains_under_the_cap_and_close_to_it(run_cli, tmp_path, calibrated_limit_gb, mode):
    limit = calibrated_limit_gb
    # Find and then train a full epoch with evaluation, all under the same real cap, with no OOM
    # recovery to fall back on: an out-of-memory error at the found size would end the run.
    out, finder = finder_run(
        run_cli,
        tmp_path / "found",
        f"batch.finder.mode={mode}",
        "batch.finder.max_trials=16",
        f"batch.finder.memory_limit_gb={limit}",
        f"trainer.memory_limit_gb={limit}",
        "trainer.oom_recovery=false",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    size = finder["micro_size"]
    passed = [t["size"] for t in finder["trials"] if t["ok"]]
    # The margin below the edge the trials measured (at 3ea6d43: 5 % below the largest pass), never
    # above a size that passed; 5 % below the largest pass where they measured no edge.
    margin, edge = finder["margin"], finder["edge"]
    assert size == (int(max(passed) * 0.95) if edge is None else min(max(passed), math.floor(edge * (1 - margin))))
    assert finder["plan"]["size"] == size and finder["plan"]["accum_steps"] == 1  # the found size is the batch
    summary = json.loads((tmp_path / "found" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["batch_size"] == size and summary["final_micro_size"] == size
    assert summary["epochs"] == 1 and summary["oom_recoveries"] == 0
    # 25 % more does not fit: the finder is near the limit, not far below it. `power` doubles until
    # the first failure, so it is near only to a factor of 2: the next power of two does not fit.
    more = 2 * max(passed) if mode == "power" else int(size * 1.25)
    bigger = run_cli(
        *[o for o in WIDE if not o.startswith("batch")],
        "logger=none",
        f"batch.size={more}",
        f"trainer.memory_limit_gb={limit}",
        "trainer.oom_recovery=false",
        f"hydra.run.dir={tmp_path / 'bigger'}",
    )
    assert bigger.returncode == 1 and "out of memory" in bigger.stderr


@pytest.mark.slow  # 20-70 s on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_a_finder_run_records_its_trials_and_the_input_pipeline_rate(run_cli, tmp_path):
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    # Hidden width 1024: activations of a few KB a sample, above what resident memory resolves.
    args = [
        *[o for o in WIDE if o != "epochs=1"],
        "model.hidden=[1024]",
        "batch.finder.max_size=256",
        "epochs=1",
        "batch.finder.cache=true",
        f"batch.finder.cache_dir={cache}",
    ]
    out = run_cli(*args, f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-2000:]
    finder = json.loads((run_dir / "finder.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    # 256 (max_size) fits with memory far beyond it: the bound itself; 5 % below it (243) where the
    # trials measured no edge (bsexp.finder.search.measured_edge).
    expected = 256 if finder["edge"] is not None else 243
    assert finder["micro_size"] == summary["micro_size"] == summary["batch_size"] == expected
    assert {t["size"] for t in finder["trials"]} >= {8, 32, 128, 256} and 243 not in {
        t["size"] for t in finder["trials"]
    }
    # The small sizes are probes (one step, to measure the peak); the size the answer stands on
    # passed a full trial.
    assert [t["size"] for t in finder["trials"] if t["probe"]] == [8, 32, 128]
    assert [t["probe"] for t in finder["trials"] if t["size"] == 256] == [False] and "ok (probe)" in out.stdout
    # The evaluation pass (200 samples a batch) needed no check of its own: the trial at 256 passed.
    assert (
        finder["eval_shown_by"] == 256
        and "evaluation (200 samples a batch): no check needed, the trial at 256" in out.stdout
    )
    # Where the memory goes, measured beside the analytic estimate (4 + 4 B a parameter and SGD's
    # momentum, 4 B), in finder.json, summary.json and the W&B summary.
    assert finder["params"] == summary["finder"]["params"] > 0 and finder["optimizer"] == "SGD"
    assert finder["fixed_analytic_mb"] == pytest.approx(12 * finder["params"] / 2**20)
    assert finder["per_sample_mb"] > 0 and finder["fixed_mb"] is not None and "memory: fixed" in out.stdout
    assert summary["finder"]["trials"] == len(finder["trials"]) and summary["finder"]["cached"] is False
    assert summary["finder"]["loader_samples_per_s"] > 0 and summary["finder"]["step_samples_per_s"] > 0
    assert "finder (fit, objective max" in out.stdout and f"chosen: micro-batch {expected}" in out.stdout
    # What the first trial waits for, by part, and each passing trial's forward, backward and
    # optimizer seconds: parts of what the trial itself timed.
    assert set(finder["startup"]) == {"process_s", "model_s", "first_step_s", "kernel_cache_wait_s"}
    # What training's oneDNN kernel cache will hold (none for an MLP: its matmuls are not oneDNN's
    # but MKL's, whose buffers the evaluation shares with the training step: 13 MB here once
    # counted as kernels).
    assert 0 <= finder["kernel_cache_mb"] < 2 and "oneDNN's kernel cache" in out.stdout
    assert finder["startup"]["process_s"] > 0 and all(v >= 0 for v in finder["startup"].values())
    assert "before the first trial: process" in out.stdout
    for trial in (t for t in finder["trials"] if t["ok"]):
        parts = [trial["forward_s"], trial["backward_s"], trial["optimizer_s"]]
        assert all(p >= 0 for p in parts) and trial["forward_s"] > 0 and sum(parts) <= trial["seconds"], trial
    [run_file] = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    import wandb_records

    recorded = wandb_records.summary(run_file)
    assert recorded["finder/micro_size"] == expected and recorded["finder/per_sample_mb"] == finder["per_sample_mb"]
    # The same setup again: the cached result, no probing.
    again = run_cli(*args, f"hydra.run.dir={tmp_path / 'again'}")
    assert again.returncode == 0, again.stderr[-2000:]
    cached = json.loads((tmp_path / "again" / "finder.json").read_text())
    assert cached["cached"] is True and cached["micro_size"] == expected and " fits" not in again.stdout
    # Keeping a global batch is another question: its micro-batch must divide it (not the cached one).
    kept = run_cli(*args, "batch.size=200", f"hydra.run.dir={tmp_path / 'kept'}")
    assert kept.returncode == 0, kept.stderr[-2000:]
    kept_summary = json.loads((tmp_path / "kept" / "summary.json").read_text())
    # 200 per step fits, memory far beyond it: 200 itself, one step; where no edge was measured,
    # 5 % below it, whose largest divisor of 200 is 100: 2 micro-steps of 100.
    micro = 200 if json.loads((tmp_path / "kept" / "finder.json").read_text())["edge"] is not None else 100
    assert (kept_summary["batch_size"], kept_summary["micro_size"], kept_summary["accum_steps"]) == (
        200,
        micro,
        200 // micro,
    )
    assert kept_summary["finder"]["cached"] is False


@pytest.mark.slow  # 20-70 s on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_the_finder_trains_at_the_batch_nearest_the_measured_noise_scale(run_cli, tmp_path):
    common = ["data=digits", "model=mlp", "epochs=2", "logger=none", "trainer.progress=false"]
    out = run_cli(
        *common,
        "batch=finder",
        "batch.finder.objective=noise_scale",
        "batch.finder.noise_steps=100",  # at the batch now chosen (1 % below the edge) 60 were too few
        "batch.finder.max_size=400",
        f"hydra.run.dir={tmp_path / 'found'}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "found" / "summary.json").read_text())
    measured, fits = summary["finder"]["noise_b_simple"], summary["finder"]["micro_size"]
    size = summary["batch_size"]
    assert measured > 0 and size == min(max(round(measured), 2), fits)
    assert f"training at batch {size}" in out.stdout
    # Measuring left no trace: the run is the fixed run at that batch.
    fixed = run_cli(*common, f"batch.size={size}", f"hydra.run.dir={tmp_path / 'fixed'}")
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    again = json.loads((tmp_path / "fixed" / "summary.json").read_text())
    assert (again["train_loss"], again["val_acc"], again["steps"]) == (
        summary["train_loss"],
        summary["val_acc"],
        summary["steps"],
    )


def test_a_finder_run_refused_by_its_checks_leaves_no_probe_server_behind(data_root, tmp_path):
    # The probe server starts before the checks, to import torch beside them; a bad value must
    # not leave it importing on its own (holding the terminal's output open) after the error.
    marker = uuid.uuid4().hex
    stderr = tmp_path / "stderr"
    with stderr.open("w") as err:  # not a pipe: the command's end, not its output's, is waited for
        code = subprocess.run(
            [
                sys.executable,
                "-m",
                "bsexp.train",
                *WIDE,
                "logger=none",
                "batch.finder.margin=2",
                f"hydra.run.dir={tmp_path / 'run'}",
            ],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=cli_env(data_root) | {"BSEXP_TEST_MARKER": marker},
            timeout=300,
        ).returncode
    assert forkservers(marker=marker) == []
    assert code == 2 and stderr.read_text().splitlines() == [
        "error: batch.finder.margin=2.0: must be a finite number in [0, 0.9]"
    ]
    assert not (tmp_path / "run").exists()


def test_the_probe_process_works_from_the_runs_data_without_loading_it_again(run_cli, tmp_path):
    # Trials need a few real samples, the input's shape and the evaluation's size: the training
    # process hands them over, so a dataset is loaded once per run, not again per probe process.
    conf = tmp_path / "my_conf" / "data"
    conf.mkdir(parents=True)
    loads = tmp_path / "loads"
    (conf / "logged.yaml").write_text(
        f"_target_: user_models.logged_synthetic\nlog: {loads}\nshape: [1, 40]\n"
        "num_classes: 10\nnum_samples: 2000\nval_size: 200\ntest_size: 0\nnoise: 1.0\n"
        "seed: 0\nin_memory: true\nnum_workers: 0\n"
    )
    out = run_cli(
        f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]",
        "data=logged",
        "model=mlp",
        "model.hidden=[64]",
        "batch=finder",
        "batch.finder.max_size=256",
        "batch.finder.data_fraction=null",
        "batch.finder.margin=0",  # else 5 % below 256 where the CPU's noisy room measured no edge (243 in CI)
        "logger=none",
        "trainer.progress=false",
        "epochs=1",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    finder = json.loads((tmp_path / "run" / "finder.json").read_text())
    # max_size, where memory is far (64 hidden units: the peaks barely grow): the answer itself.
    assert [t["size"] for t in finder["trials"]][:3] == [8, 32, 128] and finder["micro_size"] == 256
    assert len(loads.read_text().split()) == 1


@pytest.mark.slow  # 17-32 s on 2 cores: scripts/test_slow.sh (the default tiers' time)
def test_the_finder_searches_in_a_joblib_sweep(run_cli, tmp_path):
    # Hydra's joblib launcher runs each point in a loky worker, whose default start method (loky's)
    # a forkserver child cannot set again: every capped finder in such a sweep failed with
    # "cannot find context for 'loky'" before bsexp.finder.server.own_start_method.
    sweep = tmp_path / "sweep"
    out = run_cli(
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "batch=finder",
        "batch.finder.memory_limit_gb=3",
        "seed=0,1",
        "epochs=1",
        "logger=none",
        "trainer.progress=false",
        f"hydra.sweep.dir={sweep}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = [json.loads(line) for line in (sweep / "jobs.jsonl").read_text().splitlines()]
    assert [job["status"] for job in jobs] == ["completed", "completed"]
    for job in jobs:
        finder = json.loads((sweep / job["dir"] / "finder.json").read_text())
        assert finder["micro_size"] >= 1 and finder["trials"], finder


def test_on_the_default_data_the_finder_says_the_data_fraction_not_memory_set_the_batch(run_cli, tmp_path):
    # MNIST-1D's training set is small: batch.finder.data_fraction (0.1 of it) bounds the search
    # long before memory does. The answer is that bound itself (the margin is headroom for memory),
    # and the finder's chosen line names the key (issue 54: it said nothing of it).
    out = run_cli(*TINY_RUN, "batch=finder", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr[-2000:]
    finder = json.loads((tmp_path / "run" / "finder.json").read_text())
    bound = finder["max_size"]
    assert "batch.finder.data_fraction=0.1" in finder["max_size_by"] and finder["micro_size"] == bound
    assert finder["edge"] > 10 * bound  # memory's edge, far beyond
    [line] = [line for line in out.stdout.splitlines() if "chosen: micro-batch" in line]
    assert f"chosen: micro-batch {bound}, the largest batch.finder.data_fraction=0.1 of " in line
    assert f"allows; memory is not met (the trials put its edge near {finder['edge']:,})" in line
