"""Sweeps and the report: real multiruns named by their overrides, indexed, logged to W&B by sweep,
and reported as a table, a CSV and figures; failed and missing points; every experiment config."""

import csv
import json
import math
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

import wandb_records
from bsexp.train.preflight import check_all as check
from conftest import CONF, ROOT, TINY_RUN, cli_env

# sklearn's digits (1,797 images): an epoch of a small MLP takes well under a second.
DIGITS = ["data=digits", "model=mlp", "epochs=2", "trainer.progress=false"]
PNG = b"\x89PNG\r\n\x1a\n"


def report(data_root, *args):
    return subprocess.run(
        [sys.executable, "-m", "bsexp.report", *map(str, args)],
        capture_output=True,
        text=True,
        env=cli_env(data_root),
        timeout=300,
    )


def jobs(sweep: Path) -> dict[str, dict]:
    return {
        d.name: json.loads((d / "summary.json").read_text())
        for d in sorted(sweep.iterdir())
        if (d / "summary.json").exists()
    }


@pytest.fixture(scope="module")
def sweep(data_root, tmp_path_factory):
    """3 batch sizes x 2 seeds, logged to (offline) W&B, then reported."""
    tmp = tmp_path_factory.mktemp("sweep")
    sweep = tmp / "multirun" / "digits" / "sizes"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bsexp.train",
            "-m",
            "batch.size=32,64,128",
            "seed=0,1",
            *DIGITS,
            "trainer.noise_scale=always",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    reported = report(data_root, sweep)
    assert reported.returncode == 0, reported.stderr[-3000:]
    return sweep, out, reported


def test_each_point_has_a_directory_named_by_its_overrides_and_a_line_in_the_index(sweep):
    sweep, out, _ = sweep
    names = sorted((d.name for d in sweep.iterdir() if (d / ".hydra").is_dir()), key=lambda n: int(n.split("_")[0]))
    assert names == [
        f"{i}_batch.size={b},seed={s},data=digits,model=mlp,epochs=2,trainer.noise_scale=always"
        for i, (b, s) in enumerate((b, s) for b in (32, 64, 128) for s in (0, 1))
    ]
    index = [json.loads(line) for line in (sweep / "jobs.jsonl").read_text().splitlines()]
    assert sorted(e["dir"] for e in index) == sorted(names)
    assert all(e["status"] == "completed" for e in index)
    assert {(e["batch_size"], e["seed"]) for e in index} == {(b, s) for b in (32, 64, 128) for s in (0, 1)}
    assert "sweep: 6 points (6 completed)" in out.stdout


def test_each_point_is_a_wandb_run_grouped_under_the_sweep(sweep):
    sweep, _, _ = sweep
    runs = {}
    for run_file in sweep.glob("*/wandb/offline-run-*/run-*.wandb"):
        [run] = wandb_records.of_type(run_file, "run")
        runs[run["display_name"]] = run
    assert sorted(runs) == sorted(f"bs{b}-seed{s}" for b in (32, 64, 128) for s in (0, 1))
    assert {run["run_group"] for run in runs.values()} == {"digits/sizes"}  # the sweep, below multirun/
    # The report is a run of the same group, holding the table and the figures.
    [report_file] = sweep.glob("wandb/offline-run-*/run-*.wandb")
    [run] = wandb_records.of_type(report_file, "run")
    assert (run["display_name"], run["run_group"], run["job_type"]) == ("report", "digits/sizes", "report")
    logged = set().union(*(row.keys() for row in wandb_records.history(report_file)))
    for name in ("report/table", "report/accuracy", "report/val_loss", "report/throughput_memory"):
        assert any(key == name or key.startswith(name + ".") for key in logged), name  # media: nested keys


def test_the_report_tables_mean_and_std_over_seeds_marks_the_best_and_names_the_breaking_point(sweep):
    sweep, _, reported = sweep
    summaries = jobs(sweep)
    by_batch = {b: [s for s in summaries.values() if s["batch_size"] == b] for b in (32, 64, 128)}
    means = {b: statistics.fmean(s["val_acc"] for s in runs) for b, runs in by_batch.items()}
    stds = {b: statistics.stdev(s["val_acc"] for s in runs) for b, runs in by_batch.items()}
    with open(sweep / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["batch"]) for r in rows] == [32, 64, 128]
    for row in rows:  # in %, as report.md shows them
        b = int(row["batch"])
        assert float(row["val_acc_pct"]) == pytest.approx(100 * means[b])
        assert float(row["val_acc_std_pct"]) == pytest.approx(100 * stds[b])
        assert row["seeds"] == "2/2" and row["status"] == "2 completed"
        assert float(row["steps"]) == by_batch[b][0]["steps"]
    best = max(means, key=means.get)
    # The first batch above the best more than 2 standard errors of the difference below it.
    breaking = next(
        (b for b in means if b > best and means[best] - means[b] > 2 * (stds[best] ** 2 / 2 + stds[b] ** 2 / 2) ** 0.5),
        None,
    )
    table = (sweep / "report.md").read_text()
    # Starred where Welch's t-test on the seeds tells the best apart from every other batch.
    from scipy.stats import ttest_ind

    values = {b: [s["val_acc"] for s in runs] for b, runs in by_batch.items()}
    apart = all(ttest_ind(values[best], values[b], equal_var=False).pvalue < 0.05 for b in values if b != best)
    [best_line] = [line for line in table.splitlines() if line.startswith(("| ★", f"|  | {best} |"))]
    assert f"| {best} |" in best_line and best_line.startswith("| ★") is apart
    assert (
        f"**Breaking point**: batch {breaking}, the first batch above the best, batch {best},"
        if breaking
        else "**Breaking point**: none within the swept range"
    ) in table
    assert f"{100 * means[best]:.2f} ± {100 * stds[best]:.2f}" in best_line
    # The critical batch (fitted or refused, with its reason) beside the noise scale the runs measured.
    assert "**Critical batch**: " in table and "**Gradient noise scale**: B_simple = " in table
    for name in ("accuracy.png", "val_loss.png", "throughput_memory.png", "noise_scale.png"):
        import matplotlib.pyplot as plt

        data = (sweep / name).read_bytes()
        assert data.startswith(PNG) and plt.imread(sweep / name).shape[0] > 100
    assert "report: " in reported.stdout


def test_a_refused_point_is_recorded_the_sweep_goes_on_and_the_report_says_so(run_cli, data_root, tmp_path):
    sweep = tmp_path / "sweep"
    # batch 4000 is larger than the digits training set: that point is refused (its own values: running
    # it again gives the same), the other two run.
    out = run_cli("-m", "batch.size=32,4000,64", *DIGITS, "epochs=1", "logger=none", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: a sweep point was refused (batch.size=4000:")
    ran = "ran: 3 points (2 completed, 1 refused: 1)"
    assert last.endswith(f"{ran}; each point's outcome is in {sweep / 'jobs.jsonl'}")
    index = {e["num"]: e for e in map(json.loads, (sweep / "jobs.jsonl").read_text().splitlines())}
    assert [index[i]["status"] for i in range(3)] == ["completed", "refused", "completed"]
    assert "exceeds the" in index[1]["error"]
    # A point whose summary is gone (its job killed before writing it) is missing, not skipped.
    lost = next(d for d in sweep.iterdir() if d.name.startswith("2_"))
    (lost / "summary.json").unlink()
    reported = report(data_root, sweep, "--no-wandb")
    assert reported.returncode == 0, reported.stderr
    table = (sweep / "report.md").read_text()
    assert f"- `{lost.name}`: missing" in table
    assert "refused (batch.size=4000" in table
    with open(sweep / "report.csv") as f:
        rows = {r["batch"]: r for r in csv.DictReader(f)}
    assert rows["32"]["status"] == "1 completed" and rows["4000"]["status"] == "1 refused"
    assert rows["64"]["status"] == "1 missing" and rows["64"]["val_acc_pct"] == ""
    # A summary.json edited by hand (or another tool's) is a point that failed, said, not a traceback
    # (which used to come after the figures had been written over).
    edited = next(d for d in sweep.iterdir() if d.name.startswith("0_"))
    (edited / "summary.json").write_text('{"status": "completed", "batch_size": "32"}')
    reported = report(data_root, sweep, "--no-wandb")
    assert reported.returncode == 0, reported.stderr
    table = (sweep / "report.md").read_text()
    assert "summary.json lacks a whole number for batch_size" in table


def test_a_stopped_sweep_s_report_names_every_point_in_batch_order_with_its_seeds(data_root, tmp_path):
    """A sweep stopped (Ctrl-C) after its first point: each row shows its batch and the sweep's
    seeds, in batch order, the heading counts the sweep's grid, and the report says how to continue.
    On 3ea6d43 the rows never started came first, their batch `-`, under "seed 0" and a footnote
    advising "sweep seed=0,1,2" for a sweep that already did."""
    sweep = tmp_path / "sweep"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bsexp.train", "-m", "batch.size=32,64,128", "seed=0,1,2", *DIGITS, "epochs=1"]
        + ["logger=none", f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path,
        env=cli_env(data_root),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal: pytest-xdist's workers ignore SIGINT, and a child inherits that (Python
        # then installs no handler of its own), so between points the sweep ignored the Ctrl-C and
        # ran through (three times in CI; never with one process)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 300
    while not list(sweep.glob("0_*/summary.json")):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # as Ctrl-C: the point it is in saves a checkpoint, the rest never start
    proc.communicate(timeout=120)
    done = sorted(s["seed"] for s in jobs(sweep).values() if s["status"] == "completed")
    assert done and len(done) < 9, "the sweep ended before it was stopped"
    out = report(data_root, sweep, "--no-wandb")
    assert out.returncode == 0, out.stderr[-3000:]
    with open(sweep / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["batch"], r["seed_list"]) for r in rows] == [("32", "0 1 2"), ("64", "0 1 2"), ("128", "0 1 2")]
    table = (sweep / "report.md").read_text()
    lines = [line for line in table.splitlines() if line.startswith("|  | ") and "| batch |" not in line]
    assert [line.split(" | ")[1] for line in lines] == ["32", "64", "128"]
    assert all(" (0, 1, 2) | " in line for line in lines), lines
    assert "| 0/3 (0, 1, 2) | 3 missing |" in lines[-1]
    # The heading says the seeds that completed among the sweep's, and how many points did.
    assert f"seed{'s' if len(set(done)) > 1 else ''} {', '.join(map(str, sorted(set(done))))} of 0, 1, 2" in table
    assert f"{len(done)} of the sweep's 9 points completed" in table and "of 3 seeds)" in table
    assert "sweep seed=0,1,2" not in table
    if len(done) == 1:  # a timing of one seed: the footnote says the others did not complete
        assert "(one seed of each row completed)" in table and "the sweep's other seeds did not complete" in table
    # The points that did not complete, in the table's order, and the command that continues the sweep.
    listed = re.findall(r"^- `(\d+)_batch\.size=(\d+),seed=(\d+)", table, flags=re.M)
    order = [(int(b), int(s)) for _, b, s in listed]
    assert len(order) == 9 - len(done) and order == sorted(order)
    assert f"python -m bsexp.train -m resume=auto hydra.sweep.dir={sweep}" in table


def test_the_best_is_starred_only_where_its_seeds_tell_it_apart(data_root, tmp_path):
    """Two runs of one sweep whose rows differ by less than their spread: on 3ea6d43 the star went
    to 256, then to 32. Now neither is starred, and the report names the batches it cannot
    separate, with the p-value of Welch's t-test on the seeds (scipy's, here); a clear best is."""
    from scipy.stats import ttest_ind

    from report_runs import synthetic_run

    first = {32: (0.980, 0.975, 0.985), 256: (0.982, 0.978, 0.986)}
    second = {32: (0.983, 0.978, 0.986), 256: (0.980, 0.975, 0.984)}
    clear = {32: (0.980, 0.981, 0.979), 256: (0.950, 0.953, 0.947)}
    tables = {}
    for name, values in (("first", first), ("second", second), ("clear", clear)):
        runs = [
            synthetic_run(b, seed, 1, lambda s, a=acc: a) for b, accs in values.items() for seed, acc in enumerate(accs)
        ]
        sweep = write_sweep(tmp_path / name, runs)
        out = report(data_root, sweep, "--no-wandb")
        assert out.returncode == 0, out.stderr[-3000:]
        tables[name] = (sweep / "report.md").read_text()
    for name, values in (("first", first), ("second", second)):
        table = tables[name]
        assert not [line for line in table.splitlines() if line.startswith("| ★")], table
        best, other = sorted(values, key=lambda b: -sum(values[b]))
        p = ttest_ind(values[best], values[other], equal_var=False).pvalue
        assert (
            f"**Best**: none starred: batch {best} has the highest mean, val_acc" in table
            and f"do not tell it apart from batch {other} (p = {p:.2g})" in table
        ), table
    table = tables["clear"]
    [starred] = [line for line in table.splitlines() if line.startswith("| ★")]
    assert starred.startswith("| ★ | 32 |")
    p = ttest_ind(clear[32], clear[256], equal_var=False).pvalue
    assert p < 0.05 and "its seeds tell it apart from every other row (Welch's t-test" in table
    assert f"p ≤ {p:.2g})" in table


def test_the_report_given_one_run_names_the_command_that_compares_runs(run_cli, data_root, tmp_path):
    run_dir = tmp_path / "run"
    assert run_cli(*TINY_RUN, f"hydra.run.dir={run_dir}").returncode == 0
    out = report(data_root, run_dir)
    assert out.returncode == 2 and out.stderr.splitlines() == [
        f"error: {run_dir}: one run, not a sweep; compare it with another run: "
        f"python -m bsexp.diff {run_dir} <another run's directory>"
    ]
    assert not (run_dir / "report.md").exists()


def test_the_report_refuses_a_directory_that_is_not_there(data_root, tmp_path):
    helped = report(data_root, "--help")
    assert helped.returncode == 0 and "--tolerance" in helped.stdout and "first half" in helped.stdout
    out = report(data_root, tmp_path / "nope")
    assert (
        out.returncode == 2
        and out.stderr.strip()
        == f"error: {tmp_path / 'nope'}: no such directory; valid: a multirun directory holding job directories"
    )
    empty = report(data_root, tmp_path)
    assert empty.returncode == 2 and "no sweep points" in empty.stderr and "Traceback" not in empty.stderr
    (tmp_path / "a_file").write_text("")
    (tmp_path / "sweep" / "0_batch.size=32" / ".hydra").mkdir(parents=True)  # a point, never finished
    for dirs, line in (
        ([tmp_path / "a_file"], f"error: {tmp_path / 'a_file'}: not a directory"),
        ([tmp_path / "sweep", tmp_path / "sweep"], f"error: {tmp_path / 'sweep'}: given twice"),  # counted twice
    ):
        out = report(data_root, *dirs)
        assert out.returncode == 2 and out.stderr.startswith(line) and len(out.stderr.splitlines()) == 1, out.stderr


def test_points_side_by_side_share_the_cores(run_cli, tmp_path):
    import os

    sweep = tmp_path / "sweep"
    out = run_cli(
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "batch.size=32,64",
        *DIGITS,
        "epochs=1",
        "logger=none",
        f"hydra.sweep.dir={sweep}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    threads = [s["threads"] for s in jobs(sweep).values()]
    assert threads == [max(1, len(os.sched_getaffinity(0)) // 2)] * 2
    assert len((sweep / "jobs.jsonl").read_text().splitlines()) == 2


EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
CRITICAL = ("critical_batch", "lm_critical_batch")  # the critical batch by branches: MNIST-1D's, a GPT's
# A small data set of each experiment's kind: text counts tokens, the others samples.
SMALL_DATA = {"lm_critical_batch": ["data.train_tokens=8192", "data.val_size=64"]}
# Experiments run in stages, one command each (not arms swept side by side): stage -> the overrides
# it needs besides its own (the branches need their trunks).
STAGED = {name: {"trunk": [], "branches": ["branch.trunk=/the/trunk/sweep"]} for name in CRITICAL}
# Experiments a driver sweeps (its own -m command line, not the experiment's sweeper params).
DRIVEN = {"steps_to_result": "bsexp.tune"}


def test_every_arm_of_every_experiment_composes_and_passes_the_checks(data_root, monkeypatch):
    monkeypatch.setenv("BSEXP_DATA", str(data_root))
    assert {
        "linear_scaling",
        "scaling_rules",
        "norm_small_batch",
        "accumulation_vs_large",
        "generalization_gap",
        "increase_batch",
    } <= set(EXPERIMENTS)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for name in EXPERIMENTS:
            arms = sorted(p.stem for p in (CONF / "experiment" / name).glob("*.yaml"))
            stages = STAGED.get(name, {})
            assert sorted(stages) == (arms if stages else sorted(stages)), name
            for arm in arms or [None]:
                overrides = [f"experiment={name}"] + ([f"experiment/{name}={arm}"] if arm else [])
                cfg = compose("config", overrides=overrides + stages.get(arm, []), return_hydra_config=True)
                swept = cfg.hydra.sweeper.params
                if name in DRIVEN:
                    assert swept is None, name
                else:
                    assert "seed" in swept, name
                    assert (f"experiment/{name}" in swept) == bool(arms and not stages), name
                with open_dict(cfg):
                    del cfg["hydra"]
                check(cfg)


@pytest.mark.parametrize("stage", sorted(STAGED["critical_batch"]))
def test_the_critical_batch_experiment_composes_unchanged_with_resnet18_on_cifar10(stage):
    # "On a GPU the same commands run with model=resnet18 data=cifar10": both stages compose and pass
    # every check the config alone allows (the data itself needs a download, so it is not built).
    overrides = [
        "experiment=critical_batch",
        f"experiment/critical_batch={stage}",
        *STAGED["critical_batch"][stage],
        "model=resnet18",
        "data=cifar10",
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    assert cfg.data.name == "cifar10" and cfg.model._target_.endswith("resnet18")
    assert cfg.trainer.noise_scale == "always" and cfg.batch.size == 32
    with open_dict(cfg):
        del cfg["hydra"]
    check(cfg)


def test_experiments_that_fit_the_critical_batch_evaluate_often_enough_to_resolve_steps_to_target(
    data_root, monkeypatch
):
    """An experiment sweeping 3 or more batch sizes gets a B_crit fit, whose target every point
    reaches within the first half of its run, so the largest batch within half its steps; S_min
    is at most that. Every batch must then evaluate at least every tenth of those steps, or its
    steps to target are not resolved on the scale of S_min (evaluating once an epoch, a batch of
    32 on MNIST-1D reaches the target before its first evaluation)."""
    from hydra.utils import instantiate

    monkeypatch.setenv("BSEXP_DATA", str(data_root))
    fitted = []
    # Each experiment as composed, and each of its arms (a sweep of its own, such as
    # experiment/adaptive_vs_fixed=fixed: the fixed batches the B_crit fit reads).
    sweeps = [(name, [f"experiment={name}"]) for name in EXPERIMENTS]
    sweeps += [
        (f"{name}/{arm.stem}", [f"experiment={name}", f"experiment/{name}={arm.stem}"])
        for name in EXPERIMENTS
        for arm in sorted((CONF / "experiment" / name).glob("*.yaml"))
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for name, overrides in sweeps:
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
            swept = cfg.hydra.sweeper.params or {}  # none: a driver's (DRIVEN)
            batches = [int(b) for b in str(swept.get("batch.size", "")).split(",") if b]
            if len(batches) < 3 or cfg.branch.samples is not None:  # branches: bsexp.report.critical, no fit
                continue
            fitted.append(name)
            n_train = len(instantiate(cfg.data).train)
            steps_per_epoch = {b: -(-n_train // b) for b in batches}  # the smaller last step kept
            half_of_largest = cfg.epochs * steps_per_epoch[max(batches)] / 2
            for batch in batches:
                between = cfg.trainer.eval_every_steps or steps_per_epoch[batch]
                assert between <= half_of_largest / 10, (name, batch, between, half_of_largest)
    assert "linear_scaling" in fitted and "adaptive_vs_fixed/fixed" in fitted


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_runs_one_step(run_cli, tmp_path, name):
    common = [
        *SMALL_DATA.get(name, ["data.num_samples=1500", "data.val_size=100"]),
        "trainer.max_steps=1",
        "logger=none",
        "trainer.progress=false",
    ]
    trunk = tmp_path / "run"
    first = [f"experiment/{name}=trunk"] if name in STAGED else []  # the trunk, then a branch of it
    out = run_cli(f"experiment={name}", *first, *common, f"hydra.run.dir={trunk}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((trunk / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 1
    if name in STAGED:
        out = run_cli(
            f"experiment={name}",
            *common,
            f"branch.trunk={trunk}",
            "branch.at_samples=0",
            f"branch.samples={summary['samples_seen']}",  # the trunk's one step
            f"hydra.run.dir={tmp_path / 'branch'}",
        )
        assert out.returncode == 0, out.stderr[-3000:]
        trained = summary["samples_seen"]
        summary = json.loads((tmp_path / "branch" / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["branch"]["samples_trained"] == trained


def test_a_sweep_of_two_settings_gets_its_grid(run_cli, data_root, tmp_path):
    sweep = tmp_path / "sweep"
    out = run_cli(
        "-m",
        "scaling.lr_rule=linear,sqrt",
        "schedule.warmup_shape=linear,none",
        *DIGITS,
        "epochs=1",
        "batch.size=256",
        "logger=none",
        f"hydra.sweep.dir={sweep}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    reported = report(data_root, sweep)
    assert reported.returncode == 0, reported.stderr
    assert (sweep / "grid.png").read_bytes().startswith(PNG)
    assert "![grid.png](grid.png)" in (sweep / "report.md").read_text()


def test_the_canonical_script_sweeps_and_reports(data_root, tmp_path):
    import os

    sweep = tmp_path / "linear_scaling"
    env = cli_env(data_root) | {"SWEEP_DIR": str(sweep), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "sweep_batch_sizes.sh"),
            "batch.size=64,128",
            "seed=0",
            *DIGITS,
            "epochs=1",
            "logger=none",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == f"report: {sweep}/report.md (figures and report.csv beside it)"
    with open(sweep / "report.csv") as f:
        assert [int(r["batch"]) for r in csv.DictReader(f)] == [64, 128]
    overrides = (next(sweep.glob("0_*")) / ".hydra" / "overrides.yaml").read_text()
    assert "experiment=linear_scaling" in overrides


# ----------------------------------------------------------------------------- the report on synthetic sweeps
# Sweeps written as bsexp writes them, from known truths (tests/test_report_analysis.py makes the
# runs), then reported by the real CLI.


def write_sweep(sweep: Path, runs: list[dict], config: dict | None = None) -> Path:
    """Each run as a job directory (.hydra/, summary.json, metrics.jsonl) and a line of jobs.jsonl."""
    config = config or {
        "data": {"_target_": "bsexp.engine.datasets.mnist1d"},
        "trainer": {"noise_scale": "auto"},
        "logger": {"kind": "none"},
    }
    sweep.mkdir(parents=True)
    with open(sweep / "jobs.jsonl", "w") as index:
        for num, run in enumerate(runs):
            job = sweep / f"{num}_{','.join(run['overrides'])}"
            (job / ".hydra").mkdir(parents=True)
            OmegaConf.save(OmegaConf.create(run["overrides"]), job / ".hydra" / "overrides.yaml")
            OmegaConf.save(OmegaConf.create(config), job / ".hydra" / "config.yaml")
            (job / "summary.json").write_text(json.dumps(run["summary"]))
            (job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run["records"]))
            index.write(
                json.dumps(
                    {"num": num, "dir": job.name, "overrides": run["overrides"], "status": run["summary"]["status"]}
                )
                + "\n"
            )
    return sweep


@pytest.fixture(scope="module")
def known_b_crit(data_root, tmp_path_factory):
    """5 batches x 2 seeds from a known B_crit of 5,000 on 3,500 samples (each epoch's last step
    smaller: a "1024" takes 875 samples a step), evaluated every 2 steps, then reported."""
    from report_runs import known_b_crit_runs

    sweep = write_sweep(tmp_path_factory.mktemp("known") / "sweep", known_b_crit_runs(b_crit=5000, eval_every=2))
    out = report(data_root, sweep, "--no-wandb")
    assert out.returncode == 0, out.stderr[-3000:]
    return sweep, (sweep / "report.md").read_text()


def test_the_report_finds_a_known_critical_batch_from_the_samples_each_step_took(known_b_crit):
    _, table = known_b_crit
    found = re.search(r"B_crit = E_min / S_min = ([\d,]+)", table)
    assert found, table
    assert float(found[1].replace(",", "")) == pytest.approx(5000, rel=0.03)  # nominal batches: about 2,800


def test_the_report_s_target_is_reached_by_every_point_within_the_first_half_of_its_samples(known_b_crit):
    sweep, table = known_b_crit
    target = float(re.search(r"val_acc >= ([\d.]+) %", table)[1]) / 100
    for job in (d for d in sweep.iterdir() if d.is_dir()):
        records = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
        total = json.loads((job / "summary.json").read_text())["samples_seen"]
        assert any(r["val_acc"] >= target - 5e-5 for r in records if r["samples_seen"] <= total / 2), job.name
    assert "within the first half of its training samples" in table


@pytest.fixture(scope="module")
def dip(data_root, tmp_path_factory):
    """Means 98.0 / 97.6 / 90.0 / 98.0 / 95.0 % for batches 32 ... 512 (3 seeds, 0.3 points apart),
    and batch 1024 at chance, every point evaluated once."""
    from report_runs import synthetic_run

    means = {32: 0.980, 64: 0.976, 128: 0.900, 256: 0.980, 512: 0.950, 1024: 0.101}
    runs = [
        synthetic_run(b, seed, 1, lambda s, a=m + 0.003 * (seed - 1): a) for b, m in means.items() for seed in range(3)
    ]
    sweep = write_sweep(tmp_path_factory.mktemp("dip") / "sweep", runs)
    out = report(data_root, sweep, "--no-wandb")
    assert out.returncode == 0, out.stderr[-3000:]
    return sweep, (sweep / "report.md").read_text()


def test_the_breaking_point_is_the_first_batch_above_the_best_that_falls_outside_the_tolerance(dip):
    _, table = dip
    assert "**Breaking point**: batch 128, the first batch above the best, batch 32," in table
    assert "2 standard errors of the difference" in table
    # The best is the smallest batch: the breaking point is never the best itself, and the report
    # says that the flat part may lie below the sweep.
    assert "The best is the smallest batch swept: accuracy may be flat only below it." in table


def test_the_table_flags_rows_at_chance_and_has_no_placeholders(dip):
    _, table = dip
    lines = table.splitlines()
    [header] = [line for line in lines if line.startswith("| ") and "batch" in line]
    assert "configuration" not in header  # the sweep varies the batch alone
    [row_1024] = [line for line in lines if line.startswith("|") and "| 1024 |" in line]
    assert "did not train" in row_1024
    assert sum("did not train" in line for line in lines if line.startswith("|")) == 1
    for placeholder in ("(-)", "(all)", "configuration: -", " all"):
        assert placeholder not in table, placeholder
    # Batch 256's seeds equal 32's, and 64's lie within their spread: none is starred.
    assert "**Best**: none starred: batch 32 has the highest mean, val_acc 98.00 ± 0.30 % (3 seeds)" in table
    assert "do not tell it apart from batch 256 (p = 1), batch 64 (p = 0.18)" in table
    assert "mnist1d, CNN1d, 1 epochs, seeds 0, 1, 2" in table


def test_report_csv_and_report_md_give_accuracies_in_the_same_unit(dip):
    sweep, table = dip
    with open(sweep / "report.csv") as f:
        rows = list(csv.DictReader(f))
    [column] = [c for c in rows[0] if c.startswith("val_acc") and "std" not in c]
    [std_column] = [c for c in rows[0] if c.startswith("val_acc") and "std" in c]
    for row in rows:
        [line] = [line for line in table.splitlines() if line.startswith("|") and f"| {row['batch']} |" in line]
        assert f"| {float(row[column]):.2f} ± {float(row[std_column]):.2f} |" in line


def test_a_batch_that_grew_in_training_shows_where_it_ended(data_root, tmp_path):
    # batch=adaptive starts at 32 and ends where the controller took it, on each seed its own.
    from report_runs import synthetic_run

    runs = [synthetic_run(32, seed, 1, lambda s: 0.97, final_batch_size=final) for seed, final in enumerate((250, 290))]
    runs += [synthetic_run(128, seed, 1, lambda s: 0.96, final_batch_size=128) for seed in range(2)]
    sweep = write_sweep(tmp_path / "sweep", runs)
    out = report(data_root, sweep, "--no-wandb")
    assert out.returncode == 0, out.stderr[-3000:]
    table = (sweep / "report.md").read_text()
    assert "| 32 → 250-290 |" in table and "| 128 |" in table and "Batch a → b:" in table
    with open(sweep / "report.csv") as f:
        finals = {row["batch"]: row["final_batch"] for row in csv.DictReader(f)}
    assert finals == {"32": "250-290", "128": ""}


@pytest.fixture(scope="module")
def two_batches(data_root, tmp_path_factory):
    """Batches 32 and 64 of a plain sweep on one process; the larger is the better."""
    from report_runs import known_b_crit_runs

    sweep = write_sweep(tmp_path_factory.mktemp("two") / "sweep", known_b_crit_runs(batches=(32, 64), b_crit=10))
    out = report(data_root, sweep, "--no-wandb")
    assert out.returncode == 0, out.stderr[-3000:]
    return sweep, (sweep / "report.md").read_text()


def test_two_batch_sizes_get_no_critical_batch_and_the_report_says_why(two_batches):
    _, table = two_batches
    assert "B_crit =" not in table
    assert "**Critical batch**: not fitted: fewer than 3 batch sizes trained (32, 64)" in table


def test_no_breaking_point_within_the_sweep_is_said_so(two_batches):
    _, table = two_batches
    assert "**Breaking point**: none within the swept range" in table


def test_a_plain_sweep_says_why_it_has_no_noise_scale_and_how_to_get_it(two_batches):
    _, table = two_batches
    [line] = [line for line in table.splitlines() if line.startswith("**Gradient noise scale**")]
    assert "not measured" in line and "no two batch sizes" in line and "`trainer.noise_scale=always`" in line


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "1.5"], "error: --target=1.5: valid: an accuracy fraction in (0, 1]"),
        (["--tolerance", "abc"], "error: --tolerance=abc: valid: an accuracy fraction in [0, 1)"),
        (["--metric", "loss"], "error: --metric=loss: valid: val_acc, test_acc, val_loss, test_loss or val_bpb"),
    ],
)
def test_bad_report_arguments_get_one_line_naming_the_argument_value_and_what_is_valid(
    two_batches, data_root, args, message
):
    sweep, _ = two_batches
    out = report(data_root, sweep, "--no-wandb", *args)
    assert out.returncode == 2 and out.stderr.strip() == message


LOSS_TARGET = "valid: a val_loss above 0 (a loss, reached at or below it)"
LOSS_TOLERANCE = "valid: a difference of val_loss of 0 or more (in its own units)"


@pytest.mark.parametrize(
    "args, valid",
    [
        (["--target", "-1"], LOSS_TARGET),
        (["--target", "0"], LOSS_TARGET),
        (["--target", "nan"], LOSS_TARGET),
        (["--tolerance", "-0.1"], LOSS_TOLERANCE),
        (["--tolerance", "inf"], LOSS_TOLERANCE),
    ],
)
def test_bad_loss_targets_get_one_line_naming_the_flag_value_and_what_a_loss_may_be(
    two_batches, data_root, args, valid
):
    sweep, _ = two_batches
    before = sorted(p.name for p in sweep.iterdir())
    out = report(data_root, sweep, "--no-wandb", "--metric", "val_loss", *args)
    assert out.returncode == 2 and out.stderr.strip() == f"error: {args[0]}={args[1]}: {valid}"
    assert sorted(p.name for p in sweep.iterdir()) == before  # nothing written


# ----------------------------------------------------------------------------- the figures


def analysis_of(runs, **kwargs):
    from bsexp.report.analysis import analyse
    from report_runs import points

    return analyse(points(runs), **kwargs)


def test_the_accuracy_figure_names_its_data_marks_best_and_breaking_point_and_says_what_its_error_bars_are():
    import matplotlib.pyplot as plt

    from bsexp.report import render
    from report_runs import synthetic_run

    def legend(means):
        analysis = analysis_of(
            [synthetic_run(b, s, 4, lambda st, a=m + 0.003 * (s - 1): a) for b, m in means.items() for s in range(3)]
        )
        fig = render.accuracy_figure(analysis)
        try:
            assert all(w in fig._suptitle.get_text() for w in ("mnist1d", "CNN1d", "4 epochs", "seeds 0, 1, 2"))
            acc_ax = fig.axes[0]
            assert "mean ± std over 3 seeds" in acc_ax.get_title()
            return acc_ax.get_legend_handles_labels()[1]
        finally:
            plt.close(fig)

    # Batch 256's seeds equal 32's: the highest mean is ringed, not starred, and the legend says why.
    labels = legend({32: 0.980, 64: 0.976, 128: 0.900, 256: 0.980})
    assert "highest mean: batch 32 (seeds do not tell it from batch 256, batch 64)" in labels
    assert "breaking point: batch 128" in labels
    assert not any(label.endswith(" all") or label.endswith(" -") for label in labels), labels
    labels = legend({32: 0.980, 64: 0.950, 128: 0.900})  # 10 standard deviations apart: starred
    assert "best: batch 32" in labels and "breaking point: batch 64" in labels


def test_a_point_evaluated_once_shows_on_the_loss_figure_and_throughput_and_memory_start_at_zero():
    import matplotlib.pyplot as plt

    from bsexp.report import render
    from report_runs import synthetic_run

    analysis = analysis_of([synthetic_run(b, 0, 1, lambda s: 0.5, eval_every=10**6) for b in (64, 128, 256)])
    assert all(len(p.records) == 1 for p in analysis.points)
    fig = render.val_loss_figure(analysis)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 3 and all(line.get_marker() not in (None, "None", "", " ") for line in lines)
    assert "1 epochs" in fig._suptitle.get_text()
    plt.close(fig)
    fig = render.throughput_memory_figure(analysis)
    assert [ax.get_ylim()[0] for ax in fig.axes] == [0, 0]
    assert all(max(line.get_ydata()) < ax.get_ylim()[1] for ax in fig.axes for line in ax.get_lines())
    plt.close(fig)


def test_runs_that_measured_the_noise_scale_get_its_figure_beside_the_critical_batch(tmp_path):
    from bsexp.report import render
    from report_runs import synthetic_run

    runs = [synthetic_run(b, 0, 2, lambda s: 0.5, noise_b_simple_mean=100.0 + b) for b in (32, 64, 128)]
    for run in runs:
        for i, record in enumerate(run["records"]):
            record["noise/b_simple"] = 50.0 + i
    analysis = analysis_of(runs)
    assert render.figures(analysis, tmp_path)[-1] == "noise_scale.png"
    assert "**Gradient noise scale**: B_simple = 175 " in render.markdown(analysis, [tmp_path], [])


def test_a_sweep_at_one_batch_draws_a_bar_per_configuration_not_points_against_the_batch():
    import matplotlib.pyplot as plt

    from bsexp.report import render
    from report_runs import synthetic_run

    runs = []
    for rule, acc in (("linear", 0.9), ("sqrt", 0.8), ("none", 0.5)):
        for seed in (0, 1):
            run = synthetic_run(1024, seed, 2, lambda s, a=acc + 0.01 * seed: a)
            run["overrides"] = [f"scaling.lr_rule={rule}", f"seed={seed}"]
            runs.append(run)
    analysis = analysis_of(runs)
    for make in (render.accuracy_figure, render.throughput_memory_figure):
        fig = make(analysis)
        names = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        assert names == [f"scaling.lr_rule={rule} (batch 1024)" for rule in ("linear", "none", "sqrt")]
        assert len(fig.axes[0].patches) == 3 and "mnist1d, CNN1d, 2 epochs" in fig._suptitle.get_text()
        plt.close(fig)


def readme_sweep_runs(**evaluation) -> list[dict]:
    """The README's sweep: batches 32 ... 1024, 3 seeds, accuracy rising with a known critical
    batch (300: the steps to any target are S_min (1 + 300 / B)); seed 2 of batch 1024 fails
    (stays at 30 %), and batch 1024 fits the training set poorly (train acc 86 %). Wall time and
    throughput differ between seeds, as on a busy machine."""
    from report_runs import effective_batch, synthetic_run

    runs = []
    for batch in (32, 64, 128, 256, 512, 1024):
        scale = 20 * (1 + 300 / effective_batch(batch))  # steps per e-fold of the error
        for seed in range(3):
            top = 0.30 if (batch, seed) == (1024, 2) else 0.98
            curve = lambda s, scale=scale, top=top: 0.1 + (top - 0.1) * (1 - math.exp(-s / scale))  # noqa: E731
            extra = {"train_acc": 0.86, "gen_gap": 0.86 - 0.84} if batch == 1024 else {}
            runs.append(
                synthetic_run(
                    batch,
                    seed,
                    20,
                    curve,
                    **{"eval_every": math.ceil(3500 / batch)} | evaluation,
                    wall_time_s=10.0 + seed,
                    samples_per_s=1000.0 + 100 * seed,
                    **extra,
                )
            )
    return runs


@pytest.fixture(scope="module")
def epoch_end_sweep(data_root, tmp_path_factory):
    """The README's sweep as it trains with its default evaluation, once an epoch (a batch of 32:
    every 110 steps)."""
    sweep = write_sweep(tmp_path_factory.mktemp("epoch_end") / "sweep", readme_sweep_runs())
    out = report(data_root, sweep, "--no-wandb")
    assert out.returncode == 0, out.stderr[-3000:]
    return sweep, (sweep / "report.md").read_text()


def test_a_critical_batch_from_first_evaluation_bounds_is_refused_with_the_interval_that_resolves_them(epoch_end_sweep):
    _, table = epoch_end_sweep
    [line] = [line for line in table.splitlines() if line.startswith("**Critical batch**")]
    assert "B_crit =" not in table  # on a76dc77: "B_crit = E_min / S_min = ..." from the upper bounds
    assert "not fitted: the steps to the target of batches 32, 64, 128, 256" in line and "are upper bounds" in line
    # Advice a user can follow (on 3ea6d43: "evaluate every 1 step or fewer"): evaluations at steps
    # 5 % apart, or a target the points reach later.
    assert "evaluate at steps 5 % apart from the first (trainer.eval_growth=0.05)" in line
    assert "or name a target they reach later (--target)" in line and "every 1 step" not in line
    # The target is low because a failed seed set it; the report says so.
    assert "Caution: the target was set by `" in line and "far below the other seeds of batch 1024" in line


def test_the_readme_sweep_evaluated_as_the_refusal_advises_fits_its_critical_batch(data_root, tmp_path):
    """The same truth evaluated at steps 5 % apart (trainer.eval_growth=0.05), reported with a
    target named (--target 0.9, as the README's sweep does): B_crit is fitted, near the truth, 300."""
    sweep = write_sweep(tmp_path / "sweep", readme_sweep_runs(eval_growth=0.05))
    out = report(data_root, sweep, "--no-wandb", "--target", "0.9")
    assert out.returncode == 0, out.stderr[-3000:]
    table = (sweep / "report.md").read_text()
    found = re.search(r"B_crit = E_min / S_min = ([\d,]+)", table)
    assert found, table
    assert float(found[1].replace(",", "")) == pytest.approx(300, rel=0.05)
    assert "Left out: batch 1024: a seed never reached the target" in table  # its failed seed


def test_timings_show_their_spread_and_an_under_trained_batch_is_not_read_as_generalising(epoch_end_sweep):
    sweep, table = epoch_end_sweep
    assert "Wall time and samples/s: mean ± std over the seeds of a row." in table
    [row_32] = [line for line in table.splitlines() if line.startswith("|") and "| 32 |" in line]
    assert "| 11.0 ± 1.0 |" in row_32 and "| 1,100 ± 100 |" in row_32
    with open(sweep / "report.csv") as f:
        assert {float(r["wall_time_std_s"]) for r in csv.DictReader(f)} == {1.0}
    assert "**Under-trained**: batch 1024, train acc 86.00 %" in table and "did not fit the training set" in table
    # throughput_memory.png: samples/s with its spread over the seeds as error bars (batch 32: 1,100 ± 100).
    from matplotlib.container import ErrorbarContainer

    from bsexp.report.analysis import analyse
    from bsexp.report.load import load_points
    from bsexp.report.render import throughput_memory_figure

    rate_ax = throughput_memory_figure(analyse(load_points(sweep))).axes[0]
    [bars] = [c for c in rate_ax.containers if isinstance(c, ErrorbarContainer)]
    assert bars.has_yerr and "mean ± std over seeds" in bars.get_label()
    assert sorted(bars.lines[2][0].get_segments()[0][:, 1]) == pytest.approx([1000.0, 1200.0])
    # One seed a point: the table says its timings are single measurements.
    from bsexp.report.render import markdown

    single = analyse([p for p in load_points(sweep) if p.summary["seed"] == 0])
    assert "Wall time and samples/s: one measurement a point (one seed each)" in markdown(single, [sweep], [])


def test_the_accuracy_axis_fits_the_points_that_trained(epoch_end_sweep):
    from bsexp.report.analysis import analyse
    from bsexp.report.load import load_points
    from bsexp.report.render import accuracy_figure

    sweep, _ = epoch_end_sweep
    analysis = analyse(load_points(sweep))
    fig = accuracy_figure(analysis)
    acc_ax, gap_ax = fig.axes
    low, high = acc_ax.get_ylim()
    ends = [
        min(100.0, 100 * (r.mean(k) + sign * (r.std(k) or 0)))
        for r in analysis.rows
        for k in ("val_acc", "test_acc")
        for sign in (-1, 1)
    ]
    # Every mean ± std inside, with a margin of at most 15 % of their span: not the 10-100 % of a76dc77.
    assert low <= min(ends) and max(ends) <= high <= 100
    assert (high - low) <= 1.3 * (max(ends) - min(ends)) + 1 and low > 10
    assert any("under-trained" in text for text in gap_ax.get_legend_handles_labels()[1])


# ----------------------------------------------------------------------------- a sweep reported by its loss


def steps_to(records: list[dict], target: float) -> tuple[float, float]:
    """Steps and samples at which val_loss first came down to `target`, interpolated linearly
    from the evaluation before (the test's own reading of metrics.jsonl)."""
    i = next(i for i, r in enumerate(records) if r["val_loss"] <= target)
    assert i > 0, "reached by the first evaluation"
    a, b = records[i - 1], records[i]
    f = (target - a["val_loss"]) / (b["val_loss"] - a["val_loss"])
    return (
        a["step"] + f * (b["step"] - a["step"]),
        a["samples_seen"] + f * (b["samples_seen"] - a["samples_seen"]),
    )


def test_a_real_sweep_reported_by_its_validation_loss_picks_the_lowest_and_reads_steps_down_to_a_loss_target(
    data_root, tmp_path
):
    # 3 batches of MNIST-1D, one seed, a few seconds each; an LR high enough, and no warmup, for
    # every batch's loss to fall below where any started.
    sweep = tmp_path / "sweep"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bsexp.train",
            "-m",
            "batch.size=32,64,128",
            *TINY_RUN,
            "epochs=3",
            "trainer.threads=1",
            "trainer.eval_growth=0.2",
            "schedule.warmup=0",
            "optimizer.lr=0.4",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    runs = {
        s["batch_size"]: [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        for d in sweep.iterdir()
        if (d / "summary.json").exists() and (s := json.loads((d / "summary.json").read_text()))
    }
    assert sorted(runs) == [32, 64, 128]
    final = {b: records[-1]["val_loss"] for b, records in runs.items()}
    # A target every run comes down to, after its first evaluation: between the highest of the
    # runs' lowest losses and the lowest of their first.
    lowest = max(min(r["val_loss"] for r in records) for records in runs.values())
    first = min(records[0]["val_loss"] for records in runs.values())
    assert lowest < first, {b: [r["val_loss"] for r in rs] for b, rs in runs.items()}
    target = round((lowest + first) / 2, 4)
    reported = report(data_root, sweep, "--no-wandb", "--metric", "val_loss", "--target", target, "--tolerance", "0.05")
    assert reported.returncode == 0, reported.stderr[-3000:]

    with open(sweep / "report.csv") as f:
        rows = {int(r["batch"]): r for r in csv.DictReader(f)}
    assert sorted(rows) == [32, 64, 128]
    for batch, row in rows.items():  # the loss as measured, steps and samples interpolated down to the target
        steps, samples = steps_to(runs[batch], target)
        assert float(row["val_loss"]) == pytest.approx(final[batch]) and row["val_loss_std"] == ""
        assert float(row["steps_to_target"]) == pytest.approx(steps)
        assert float(row["samples_to_target"]) == pytest.approx(samples)
    table = (sweep / "report.md").read_text()
    best = min(final, key=final.get)
    assert f"has the lowest mean, val_loss {final[best]:.4f} (1 seed)" in table
    assert f"reach val_loss <= {target:.4f} (given (--target))" in table
    assert "val_loss as measured (lower is better)" in table and "| wd | val loss | val acc (%) |" in table
    # The breaking point: the first batch above the best whose loss rises more than 0.05 above it.
    breaking = next((b for b in sorted(final) if b > best and final[b] - final[best] > 0.05), None)
    if breaking is None:
        assert "**Breaking point**: none within the swept range" in table
    else:
        assert (
            f"**Breaking point**: batch {breaking}, the first batch above the best, batch {best}, at val_loss "
            f"{final[best]:.4f}, whose val_loss ({final[breaking]:.4f}) rises more than the tolerance (0.0500 in "
            f"val_loss: --tolerance) above it"
        ) in table
    assert (sweep / "val_loss_by_batch.png").read_bytes().startswith(PNG) and not (sweep / "accuracy.png").exists()
