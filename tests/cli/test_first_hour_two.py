"""A user's first hour, round two (issue 42), through the real command line: a run killed before
its first checkpoint is not stuck, a sweep's points are all checked before the first trains, and
the small noises are gone. (Runs that share a machine share its cores: tests/cli/test_shared_cores.py.)"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import TINY_RUN, cli_env
from resuming import SLOW, records, start, uninterrupted


def command(data_root, cwd, *args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "bsexp.train", *args],
        cwd=cwd,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def killed_in_its_first_epoch(data_root, tmp_path, run_dir, *args):
    """Start a run and kill it (SIGKILL) once it trains, before its first checkpoint: the epoch's end."""
    proc = start(data_root, tmp_path, *args, f"hydra.run.dir={run_dir}")
    deadline = time.time() + 120
    while not (run_dir / "metrics.jsonl").exists():  # written once the run has started training
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.time() < deadline
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert not list((run_dir / "checkpoints").glob("step-*.pt"))  # no checkpoint to resume from
    assert (run_dir / "metrics.jsonl").read_text() == "" and not (run_dir / "summary.json").exists()


# Checkpoints only at epoch ends (60 steps of about 10 ms): killed as soon as it trains, it has none.
EARLY = [*(o for o in SLOW if not o.startswith("checkpoint.every_steps")), "checkpoint.every_steps=0", "batch.size=64"]


def test_resume_auto_starts_a_run_killed_before_its_first_checkpoint_from_step_0(make_cfg, data_root, tmp_path):
    run_dir = tmp_path / "run"
    killed_in_its_first_epoch(data_root, tmp_path, run_dir, *EARLY)
    # What a preemptible job (SLURM requeue, a wrapper) runs: resume=auto. On a76dc77 it was refused
    # ("holds no checkpoint ... nothing to resume"), and a plain rerun too ("already holds a run's results").
    out = command(data_root, tmp_path, "resume=auto", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    [note] = [line for line in out.stdout.splitlines() if "resume:" in line]
    assert "no checkpoint" in note and "starting the run from step 0" in note
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from"] is None
    _, progress = uninterrupted(make_cfg, *EARLY[len(SLOW) - 1 :])
    assert [r["val_loss"] for r in records(run_dir)] == [r["val_loss"] for r in progress.records]


def test_an_empty_results_file_does_not_stop_a_plain_rerun(data_root, tmp_path):
    run_dir = tmp_path / "run"
    killed_in_its_first_epoch(data_root, tmp_path, run_dir, *EARLY)
    out = command(data_root, tmp_path, *EARLY, f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    # A directory with real results is still refused, and left as it was.
    again = command(data_root, tmp_path, *EARLY, f"hydra.run.dir={run_dir}")
    assert again.returncode == 2 and "already holds a run's results (summary.json)" in again.stderr


def test_resume_auto_on_a_directory_with_no_run_in_it_is_one_line(data_root, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = command(data_root, tmp_path, "resume=auto", f"hydra.run.dir={empty}")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"error: resume=auto: {empty} holds no run to continue: no checkpoint "
        f"(checkpoints/step-*.pt) and no run's config (.hydra/config.yaml)"
    ]


def test_every_point_of_a_sweep_is_checked_before_the_first_one_trains(data_root, tmp_path):
    # On a76dc77, point 0 trained in full before point 1 was refused.
    sweep = tmp_path / "sweep"
    out = command(data_root, tmp_path, "-m", "batch.size=32,-5", *TINY_RUN, f"hydra.sweep.dir={sweep}")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: sweep point 1 (batch.size=-5): batch.size=-5: must be >= 1; no point has run"
    ]
    assert not sweep.exists()
    # A value of the wrong type: on a76dc77 "a sweep point failed ... the others ran", though none had.
    out = command(data_root, tmp_path, "-m", "seed=0,1", "batch.size=32,abc", *TINY_RUN, f"hydra.sweep.dir={sweep}")
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("error: sweep point 1 (seed=0 batch.size=abc): batch.size: Value 'abc'")
    assert line.endswith("no point has run") and not sweep.exists()
    # A value shared by every point is said as for a single run.
    out = command(data_root, tmp_path, "-m", "seed=0,1", "optimizer.lr=-1", *TINY_RUN, f"hydra.sweep.dir={sweep}")
    assert out.returncode == 2 and out.stderr.startswith("error: optimizer.lr=-1")
    # So is a key that is not one (exit 1 and "a sweep point failed" before: no point had).
    out = command(data_root, tmp_path, "-m", "seed=0,1", "model.widht=3", *TINY_RUN, f"hydra.sweep.dir={sweep}")
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("error: model.widht: not a key of model (did you mean model.width?)")
    assert line.endswith("; no point has run") and not sweep.exists()
    # An experiment's own sweep (its sweeper's params) is checked point by point too: over 3 ranks,
    # its batches 32 and 64 do not divide (points 0 to 5: batch 32 and 64, seeds 0-2).
    out = command(
        data_root,
        tmp_path,
        "-m",
        "experiment=linear_scaling",
        "distributed=ddp",
        "distributed.nproc_per_node=3",
        *TINY_RUN,
        f"hydra.sweep.dir={sweep}",
    )
    assert out.returncode == 2, out.stderr[-2000:]
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("error: sweep point 0 (batch.size=32 seed=0): batch.size=32:") and "divisible" in line
    assert not sweep.exists()


def test_the_finder_run_prints_no_warning_of_its_probe_processes(data_root, tmp_path):
    out = command(data_root, tmp_path, *TINY_RUN, "batch=finder", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr[-3000:]
    # On a76dc77: two "RuntimeWarning: 'bsexp.train' found in sys.modules ..." (runpy, in each probe process).
    assert "RuntimeWarning" not in out.stderr and "found in sys.modules" not in out.stderr


def test_a_key_one_typo_away_from_a_groups_key_gets_a_did_you_mean(data_root, tmp_path):
    out = command(data_root, tmp_path, "batch.sise=64")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: batch.sise: not a key of batch (did you mean batch.size?); valid: policy, size, drop_last"
    ]
    out = command(data_root, tmp_path, "+trainer.max_step=3")
    assert out.returncode == 2 and "(did you mean trainer.max_steps?)" in out.stderr


def test_a_resume_composes_with_cfg_job_to_show_the_runs_own_config(data_root, tmp_path):
    run_dir = tmp_path / "run"
    out = command(data_root, tmp_path, *TINY_RUN, "batch.size=48", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    # Hydra's flags go before overrides; the run's own overrides are put in front of the command's.
    shown = command(data_root, tmp_path, "resume=auto", f"hydra.run.dir={run_dir}", "--cfg", "job")
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "size: 48" in shown.stdout and "resume: auto" in shown.stdout


def test_a_config_of_ones_own_that_bsexps_of_its_name_would_hide_is_one_line_and_exit_2(data_root, tmp_path):
    """Hydra reads bsexp's conf/ before hydra.searchpath's folders: my_conf/model/cnn.yaml (a wider
    cnn) was never read, and the run trained bsexp's cnn as if it were the user's own."""
    (tmp_path / "my_conf" / "model").mkdir(parents=True)
    shipped = Path(__file__).parents[2] / "bsexp" / "conf"
    (tmp_path / "my_conf" / "model" / "cnn.yaml").write_text((shipped / "model" / "cnn.yaml").read_text())
    (tmp_path / "my_conf" / "model" / "my_cnn.yaml").write_text((shipped / "model" / "cnn.yaml").read_text())
    searchpath = f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]"
    for args in ([searchpath, "model=cnn"], ["-m", searchpath, "model=my_cnn,cnn"]):
        out = command(data_root, tmp_path, *args, "epochs=1", "hydra.run.dir=run", "hydra.sweep.dir=sweep")
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr[-2000:]
        assert "my_conf/model/cnn.yaml is hidden by bsexp's own model/cnn.yaml" in out.stderr
        assert "rename yours, e.g. model/my_cnn.yaml and model=my_cnn" in out.stderr
        assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()
    own = command(data_root, tmp_path, searchpath, "model=my_cnn", "--cfg", "job")  # a name of its own: read
    assert own.returncode == 0 and "hidden" not in own.stderr, own.stderr[-2000:]
    (tmp_path / "my_conf" / "comparison").mkdir()
    (tmp_path / "my_conf" / "comparison" / "mnist1d.yaml").write_text("# @package _global_\nepochs: 1\n")
    tuned = subprocess.run(
        [sys.executable, "-m", "bsexp.tune", "cmp", searchpath, "comparison=mnist1d"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=cli_env(data_root),
        timeout=300,
    )
    assert tuned.returncode == 2 and "my_conf/comparison/mnist1d.yaml is hidden by bsexp's own" in tuned.stderr
    assert not (tmp_path / "cmp").exists()
