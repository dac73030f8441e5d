"""Sweeps and the report: real multiruns named by their overrides, indexed, logged to W&B by sweep,
and reported as a table, a CSV and figures; failed and missing points; every experiment config."""

import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

import wandb_records
from bsexp.config import check
from conftest import CONF, cli_env

# sklearn's digits (1,797 images): an epoch of a small MLP takes well under a second.
DIGITS = ["data=digits", "model=mlp", "epochs=2", "trainer.progress=false"]
PNG = b"\x89PNG\r\n\x1a\n"


def report(data_root, *args):
    return subprocess.run([sys.executable, "-m", "bsexp.report", *map(str, args)], capture_output=True, text=True,
                          env=cli_env(data_root), timeout=300)


def jobs(sweep: Path) -> dict[str, dict]:
    return {d.name: json.loads((d / "summary.json").read_text()) for d in sorted(sweep.iterdir())
            if (d / "summary.json").exists()}


@pytest.fixture(scope="module")
def sweep(data_root, tmp_path_factory):
    """3 batch sizes x 2 seeds, logged to (offline) W&B, then reported."""
    tmp = tmp_path_factory.mktemp("sweep")
    sweep = tmp / "multirun" / "digits" / "sizes"
    out = subprocess.run([sys.executable, "-m", "bsexp.train", "-m", "batch.size=32,64,128", "seed=0,1", *DIGITS,
                          "trainer.noise_scale=always", f"hydra.sweep.dir={sweep}"], cwd=tmp, env=cli_env(data_root), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    reported = report(data_root, sweep)
    assert reported.returncode == 0, reported.stderr[-3000:]
    return sweep, out, reported


def test_each_point_has_a_directory_named_by_its_overrides_and_a_line_in_the_index(sweep):
    sweep, out, _ = sweep
    names = sorted((d.name for d in sweep.iterdir() if (d / ".hydra").is_dir()), key=lambda n: int(n.split("_")[0]))
    assert names == [f"{i}_batch.size={b},seed={s},data=digits,model=mlp,epochs=2,trainer.noise_scale=always"
                     for i, (b, s) in enumerate((b, s) for b in (32, 64, 128) for s in (0, 1))]
    index = [json.loads(line) for line in (sweep / "jobs.jsonl").read_text().splitlines()]
    assert sorted(e["dir"] for e in index) == sorted(names)
    assert all(e["status"] == "completed" for e in index)
    assert {(e["batch_size"], e["seed"]) for e in index} == {(b, s) for b in (32, 64, 128) for s in (0, 1)}
    assert "sweep: 6 points (6 completed)" in out.stdout


def test_each_point_is_a_wandb_run_grouped_under_the_sweep(sweep):
    sweep, _, _ = sweep
    runs = {}
    for run_file in sweep.glob("*/wandb/offline-run-*/run-*.wandb"):
        [run] = [r.run for r in wandb_records.records(run_file) if r.WhichOneof("record_type") == "run"]
        runs[run.display_name] = run
    assert sorted(runs) == sorted(f"bs{b}-seed{s}" for b in (32, 64, 128) for s in (0, 1))
    assert {run.run_group for run in runs.values()} == {"digits/sizes"}  # the sweep, below multirun/
    # The report is a run of the same group, holding the table and the figures.
    [report_file] = sweep.glob("wandb/offline-run-*/run-*.wandb")
    [run] = [r.run for r in wandb_records.records(report_file) if r.WhichOneof("record_type") == "run"]
    assert (run.display_name, run.run_group, run.job_type) == ("report", "digits/sizes", "report")
    logged = set().union(*(row.keys() for row in wandb_records.history(report_file)))
    for name in ("report/table", "report/accuracy", "report/val_loss", "report/throughput_memory"):
        assert any(key == name or key.startswith(name + "/") for key in logged), name  # media: nested keys


def test_the_report_tables_mean_and_std_over_seeds_marks_the_best_and_names_the_breaking_point(sweep):
    sweep, _, reported = sweep
    summaries = jobs(sweep)
    by_batch = {b: [s for s in summaries.values() if s["batch_size"] == b] for b in (32, 64, 128)}
    means = {b: statistics.fmean(s["val_acc"] for s in runs) for b, runs in by_batch.items()}
    stds = {b: statistics.stdev(s["val_acc"] for s in runs) for b, runs in by_batch.items()}
    with open(sweep / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["batch"]) for r in rows] == [32, 64, 128]
    for row in rows:
        b = int(row["batch"])
        assert float(row["val_acc"]) == pytest.approx(means[b]) and float(row["val_acc_std"]) == pytest.approx(stds[b])
        assert row["seeds"] == "2/2" and row["status"] == "2 completed"
        assert float(row["steps"]) == by_batch[b][0]["steps"]
    best = max(means, key=means.get)
    breaking = max(b for b in means if means[b] >= means[best] - stds[best] - 1e-12)
    table = (sweep / "report.md").read_text()
    [starred] = [line for line in table.splitlines() if line.startswith("| ★")]
    assert f"| {best} |" in starred
    assert f"**Breaking point** (all): batch {breaking}," in table
    assert f"{100 * means[best]:.2f} ± {100 * stds[best]:.2f}" in starred
    # The critical batch from the steps each batch needed to reach the lowest best accuracy.
    assert "**Critical batch** (steps to val_acc >=" in table and "B_simple = " in table
    for name in ("accuracy.png", "val_loss.png", "throughput_memory.png", "noise_scale.png"):
        import matplotlib.pyplot as plt

        data = (sweep / name).read_bytes()
        assert data.startswith(PNG) and plt.imread(sweep / name).shape[0] > 100
    assert "report: " in reported.stdout


def test_a_failed_point_is_recorded_the_sweep_goes_on_and_the_report_says_so(run_cli, data_root, tmp_path):
    sweep = tmp_path / "sweep"
    # batch 4000 is larger than the digits training set: that point fails, the other two run.
    out = run_cli("-m", "batch.size=32,4000,64", *DIGITS, "epochs=1", "logger=none", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("error: a sweep point failed (batch.size=4000:")
    index = {e["num"]: e for e in map(json.loads, (sweep / "jobs.jsonl").read_text().splitlines())}
    assert [index[i]["status"] for i in range(3)] == ["completed", "failed", "completed"]
    assert "exceeds the" in index[1]["error"]
    # A point whose summary is gone (its job killed before writing it) is missing, not skipped.
    lost = next(d for d in sweep.iterdir() if d.name.startswith("2_"))
    (lost / "summary.json").unlink()
    reported = report(data_root, sweep, "--no-wandb")
    assert reported.returncode == 0, reported.stderr
    table = (sweep / "report.md").read_text()
    assert f"- `{lost.name}`: missing" in table
    assert "failed (batch.size=4000" in table
    with open(sweep / "report.csv") as f:
        rows = {r["batch"]: r for r in csv.DictReader(f)}
    assert rows["32"]["status"] == "1 completed" and rows["4000"]["status"] == "1 failed"
    assert rows["64"]["status"] == "1 missing" and rows["64"]["val_acc"] == ""


def test_the_report_refuses_a_directory_that_is_not_there(data_root, tmp_path):
    out = report(data_root, tmp_path / "nope")
    assert out.returncode == 2 and out.stderr.strip() == f"error: {tmp_path / 'nope'}: no such directory; valid: " \
                                                         "a multirun directory holding job directories"
    empty = report(data_root, tmp_path)
    assert empty.returncode == 2 and "no sweep points" in empty.stderr and "Traceback" not in empty.stderr


def test_points_side_by_side_share_the_cores(run_cli, tmp_path):
    import os

    sweep = tmp_path / "sweep"
    out = run_cli("-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "batch.size=32,64", *DIGITS, "epochs=1",
                  "logger=none", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    threads = [s["threads"] for s in jobs(sweep).values()]
    assert threads == [max(1, len(os.sched_getaffinity(0)) // 2)] * 2
    assert len((sweep / "jobs.jsonl").read_text().splitlines()) == 2


EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def test_every_arm_of_every_experiment_composes_and_passes_the_checks(data_root, monkeypatch):
    monkeypatch.setenv("BSEXP_DATA", str(data_root))
    assert {"linear_scaling", "scaling_rules", "norm_small_batch", "accumulation_vs_large", "generalization_gap",
            "increase_batch"} <= set(EXPERIMENTS)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for name in EXPERIMENTS:
            arms = sorted(p.stem for p in (CONF / "experiment" / name).glob("*.yaml"))
            for arm in arms or [None]:
                overrides = [f"experiment={name}"] + ([f"experiment/{name}={arm}"] if arm else [])
                cfg = compose("config", overrides=overrides, return_hydra_config=True)
                swept = cfg.hydra.sweeper.params
                assert "seed" in swept, name
                assert (f"experiment/{name}" in swept) == bool(arms), name
                with open_dict(cfg):
                    del cfg["hydra"]
                check(cfg)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_runs_one_step(run_cli, tmp_path, name):
    out = run_cli(f"experiment={name}", "data.num_samples=1500", "data.val_size=100", "trainer.max_steps=1",
                  "logger=none", "trainer.progress=false", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 1


def test_a_sweep_of_two_settings_gets_its_grid(run_cli, data_root, tmp_path):
    sweep = tmp_path / "sweep"
    out = run_cli("-m", "scaling.lr_rule=linear,sqrt", "schedule.warmup_shape=linear,none", *DIGITS, "epochs=1",
                  "batch.size=256", "logger=none", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    reported = report(data_root, sweep)
    assert reported.returncode == 0, reported.stderr
    assert (sweep / "grid.png").read_bytes().startswith(PNG)
    assert "![grid.png](grid.png)" in (sweep / "report.md").read_text()


def test_the_canonical_script_sweeps_and_reports(data_root, tmp_path):
    import os

    sweep = tmp_path / "linear_scaling"
    env = cli_env(data_root) | {"SWEEP_DIR": str(sweep), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run(["bash", str(CONF.parent / "scripts" / "sweep_batch_sizes.sh"), "batch.size=64,128", "seed=0",
                          *DIGITS, "epochs=1", "logger=none"], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == f"report: {sweep}/report.md (figures and report.csv beside it)"
    with open(sweep / "report.csv") as f:
        assert [int(r["batch"]) for r in csv.DictReader(f)] == [64, 128]
    overrides = (next(sweep.glob("0_*")) / ".hydra" / "overrides.yaml").read_text()
    assert "experiment=linear_scaling" in overrides
