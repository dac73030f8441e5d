"""Steps to result through the CLI (python -m bsexp.tune), at a tiny budget: the search, the best of
each batch size chosen and rerun over seeds, a batch size that never gets there, the report; and a
tuning run killed mid-way, continued by the same command with the trials that finished not run
again."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bsexp import api
from conftest import cli_env

# Two batch sizes, three trials each (the LR and a linear warmup of up to an epoch searched), a
# target the small batch reaches in a few epochs and the large one (5 steps an epoch) does not.
TUNE = [
    "tune_batches=[32,128]",
    "tune.trials=3",
    "tune.warmup_max=1",
    "tune.search_seed=3",  # its first three points: LRs 0.63, 0.024 and 0.0012
    "tune.seeds=1",
    "tune.target=0.5",
    "data.num_samples=1000",
    "data.val_size=100",
    "model.width=8",
    "epochs=4",
    "logger=none",
    "trainer.threads=1",
]


def tune_run(data_root, cwd, out, *args) -> subprocess.CompletedProcess:
    """`python -m bsexp.tune OUT ARGS` to its end (the arguments as given: no TUNE)."""
    command = [sys.executable, "-m", "bsexp.tune", str(out), *args]
    return subprocess.run(command, cwd=cwd, env=cli_env(data_root), capture_output=True, text=True, timeout=900)


def tune(data_root, cwd, out, *args, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-m", "bsexp.tune", str(out), *TUNE, *args],
        cwd=cwd,
        env=cli_env(data_root),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


@pytest.mark.slow  # 17-32 s on 2 cores: scripts/test_slow.sh (the default tiers' time)
def test_the_lr_tuned_at_each_batch_size_and_the_best_rerun_over_seeds(data_root, tmp_path):
    out = tmp_path / "tune"
    # The trials two at a time, as the docs run them (Hydra's joblib launcher): each stage a sweep.
    proc = tune(data_root, tmp_path, out, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    trials = [json.loads(p.read_text()) for p in (out / "trials").glob("*/summary.json")]
    assert len(trials) == 6 and {t["batch_size"] for t in trials} == {32, 128}
    assert len({t["lr"] for t in trials}) == 3  # the same three points of the search at each batch size
    assert len({t["warmup"] for t in trials}) == 3 and all(0 <= t["warmup"] <= 1 for t in trials)
    assert {t["warmup_shape"] for t in trials} == {"linear"}
    reached = [t for t in trials if t["stopped_at"] is not None]
    assert reached and all(t["batch_size"] == 32 and t["val_acc"] >= 0.5 for t in reached)
    best = json.loads((out / "best.json").read_text())
    fewest = min(reached, key=lambda t: t["steps"])
    assert list(best) == ["32"] and best["32"]["lr"] == fewest["lr"]  # batch 128 never got there
    assert best["32"]["warmup"] == fewest["warmup"]
    reruns = [json.loads(p.read_text()) for p in (out / "seeds").glob("*/summary.json")]
    assert [(r["batch_size"], r["seed"], r["lr"], r["warmup"]) for r in reruns] == [
        (32, 1, best["32"]["lr"], best["32"]["warmup"])
    ]
    # The same tuning from Python (bsexp.api): its trials and reruns, one row each, by stage.
    rows = api.points(out)
    searched = rows[:6]
    assert [row["stage"] for row in rows] == ["trials"] * 6 + ["seeds"]
    assert sorted((r["batch.size"], r["lr"]) for r in searched) == sorted((t["batch_size"], t["lr"]) for t in trials)
    assert sorted((r["batch.size"], r["tune.trial"]) for r in searched) == [(b, n) for b in (32, 128) for n in range(3)]
    assert (rows[6]["batch_size"], rows[6]["seed"], rows[6]["lr"]) == (32, 1, best["32"]["lr"])
    # The rerun is named as the trials are: by its batch and seed, not after best.json's absolute
    # path (on 3ea6d43, about 130 characters with the user's directory names inside).
    [rerun] = [p.parent.name for p in (out / "seeds").glob("*/summary.json")]
    [trial] = [d.name for d in (out / "trials").iterdir() if d.name.startswith("0_")]
    head, trial_head = "0_batch.size=32,seed=1,tune.trial=null,", "0_batch.size=32,tune.trial=0,"
    assert rerun.startswith(head) and trial.startswith(trial_head), (rerun, trial)
    tail = min(len(rerun) - len(head), len(trial) - len(trial_head))  # names are cut at 120 characters
    assert rerun[len(head) :][:tail] == trial[len(trial_head) :][:tail]
    assert "best" not in rerun and "tmp" not in rerun
    # The sweep report, given the tuning's directory, names the report that reads it.
    refused = subprocess.run(
        [sys.executable, "-m", "bsexp.report", str(out)], env=cli_env(data_root), capture_output=True, text=True
    )
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        f"error: {out}: a tuning run (python -m bsexp.tune), not a sweep; its report: python -m bsexp.report.steps "
        f"{out} (one of its sweeps: python -m bsexp.report {out / 'trials'})"
    ]
    table = (out / "steps_to_result.md").read_text()
    assert "| 32 | " in table and "**Not reached**: no trial of batch 128" in table
    figures = ("steps_to_result.png", "tuned_lr.png", "samples_steps.png", "steps_to_result.csv")
    assert all((out / name).stat().st_size for name in figures)
    # One batch reached the target: no fit, and the four estimates' table says what each one needs.
    assert "**Fit**: not fitted: fewer than 3 batch sizes" in table
    assert "## The critical batch, four ways" in table and "| this curve: the LR tuned at each batch | - |" in table


@pytest.mark.slow  # seven short runs one after another: 20-40 s on 2 cores
def test_steps_to_result_counts_steps_to_a_loss_reached_at_or_below_its_target(data_root, tmp_path):
    """tune.metric=val_loss: each trial ends once its validation loss is at or below tune.target, each
    batch's best is its fewest steps there, and the report says the target with its side."""
    out = tmp_path / "tune"
    loss = [a for a in TUNE if not a.startswith("tune.target=")] + ["tune.metric=val_loss", "tune.target=1.6"]
    done = tune_run(data_root, tmp_path, out, *loss)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = [json.loads(p.read_text()) for p in (out / "trials").glob("*/summary.json")]
    reached = [t for t in trials if t["stopped_at"] is not None]
    assert len(trials) == 6 and reached and all(t["val_loss"] <= 1.6 for t in reached)
    assert all(t["val_loss"] > 1.6 for t in trials if t["stopped_at"] is None)  # the others never got there
    best = json.loads((out / "best.json").read_text())
    for batch in {t["batch_size"] for t in reached}:
        fewest = min((t for t in reached if t["batch_size"] == batch), key=lambda t: t["steps"])
        assert best[str(batch)]["lr"] == fewest["lr"]
    assert set(best) == {str(t["batch_size"]) for t in reached}
    table = (out / "steps_to_result.md").read_text()
    assert table.startswith("# Steps to result: val_loss <= 1.6\n")


@pytest.mark.slow  # 20-70 s on 2 cores: scripts/test_slow.sh (and .ci/run) runs it
def test_a_killed_tuning_run_continues_where_it_stopped(data_root, tmp_path):
    out = tmp_path / "tune"
    proc = tune(data_root, tmp_path, out, start_new_session=True)
    deadline = time.time() + 600
    while len(list((out / "trials").glob("*/summary.json"))) < 2:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    done = {
        p: p.stat().st_mtime_ns
        for p in (out / "trials").glob("*/summary.json")
        if json.loads(p.read_text())["status"] == "completed"
    }
    assert done and len(done) < 6
    # Another command in its directory is refused, not taken as the same (it ran as first started).
    proc = tune(data_root, tmp_path, out, "epochs=5")
    _, stderr = proc.communicate(timeout=120)
    assert (
        proc.returncode == 2 and stderr.startswith("error: epochs=5: the tuning in") and len(stderr.splitlines()) == 1
    )
    proc = tune(data_root, tmp_path, out)  # the same command
    _, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    assert len(list((out / "trials").glob("*/summary.json"))) == 6 and (out / "steps_to_result.md").exists()
    assert {p: p.stat().st_mtime_ns for p in done} == done  # the trials that had finished were not run again


@pytest.mark.parametrize(
    "args, line",
    [
        ([], "error: TUNE_DIR: missing; usage: python -m bsexp.tune TUNE_DIR"),
        (["{out}", "tune.trials=abc"], "error: tune.trials=abc: must be a whole number"),
        (["{out}", "tune.trials=0"], "error: tune.trials=0: must be >= 1"),  # train's own line, and no other
        (["{out}", "tune.target=90"], "error: tune.target=90.0: tune.metric=val_acc is an accuracy"),
        # AdamW (a GPT's recipe) has no momentum for the search to set: before any run
        (
            ["{out}", "model=gpt", "data=text", "tune.momentum=true"],
            "error: tune.momentum=true: optimizer._target_=torch.optim.AdamW has no momentum",
        ),
    ],
)
def test_bad_input_to_the_tuning_is_one_line_and_exit_2(data_root, tmp_path, args, line):
    out = tmp_path / "tune"
    run = [sys.executable, "-m", "bsexp.tune", *(a.format(out=out) for a in args)]
    done = subprocess.run(run, cwd=tmp_path, env=cli_env(data_root), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(line) and len(done.stderr.splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr and not (out / "trials" / "0").exists()
    helped = subprocess.run([*run[:3], "--help"], env=cli_env(data_root), capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and helped.stdout.startswith("`python -m bsexp.tune TUNE_DIR")


@pytest.mark.slow  # four tiny GPT runs: about 30-60 s on 2 cores
def test_steps_to_result_of_a_language_model_gives_tokens_beside_samples(data_root, tmp_path):
    """A GPT's steps to a loss target with its own optimizer, AdamW (the LR searched): the report's
    table and CSV give the tokens each batch took beside its samples, a sample being a sequence of
    data.context tokens. (Batches 8 and 16, not the
    config's 128: the reruns once stopped at their sweep's check, which looked up 128's best.)"""
    out = tmp_path / "tune"
    gpt = ["model=gpt", "data=text", "data.train_tokens=8192", "data.val_size=64", "model.width=32", "model.heads=2"]
    # AdamW, the GPT's recipe: its LR searched (it has no momentum)
    args = ["tune_batches=[8,16]", "tune.trials=2", "tune.seeds=1", "tune.lr_min=0.003", "tune.lr_max=0.03"]
    args += ["tune.metric=val_loss", "tune.target=4.5", "epochs=2", "logger=none", "trainer.threads=1"]
    done = tune_run(data_root, tmp_path, out, *gpt, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    trial = json.loads(next((out / "trials").glob("*/summary.json")).read_text())
    context = trial["context"]
    assert trial["momentum"] is None
    best = json.loads((out / "best.json").read_text())
    assert best and all(0.003 <= b["lr"] <= 0.03 and b["momentum"] is None for b in best.values())
    rows = list(csv.DictReader((out / "steps_to_result.csv").open()))
    reached = [r for r in rows if r["samples_mean"]]
    assert reached, rows
    for row in reached:
        assert float(row["tokens_mean"]) == pytest.approx(context * float(row["samples_mean"]))
    table = (out / "steps_to_result.md").read_text()
    assert f"A sample is a sequence of {context:,} tokens" in table
    assert "| samples | tokens | linear rule / tuned |" in table
    for row in reached:
        assert f"| {float(row['samples_mean']):,.0f} | {float(row['tokens_mean']):,.0f} |" in table
