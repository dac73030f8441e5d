"""Branches through the CLI: a trunk keeps checkpoints at given samples; a branch at the trunk's
own batch continues it bit-identically; a branch at another batch trains exactly its samples at
the LR and weight decay the rules give; bad branch settings are one line and exit code 2."""

import json
import subprocess
import sys

import pytest
import torch

from conftest import cli_env

# The trunk: batch 64 over 2 epochs of MNIST-1D (55 steps an epoch), a constant LR after a short
# warmup, evaluated every 5 steps; checkpoints kept at 0, 640 and 1,920 samples seen.
TRUNK = [
    "epochs=2",
    "batch.size=64",
    "schedule.main=constant",
    "schedule.warmup=0.1",
    "trainer.eval_every_steps=5",
    "trainer.threads=1",
    "trainer.progress=false",
    "logger=none",
]


@pytest.fixture(scope="module")
def trunk(tmp_path_factory, data_root):
    where = tmp_path_factory.mktemp("trunk")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bsexp.train",
            *TRUNK,
            "checkpoint.at_samples=[0,640,1920]",
            f"hydra.run.dir={where / 'run'}",
        ],
        cwd=where,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return where / "run"


def _branch(run_cli, trunk, run_dir, *args):
    return run_cli(*TRUNK, f"branch.trunk={trunk}", f"hydra.run.dir={run_dir}", *args)


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_trunk_keeps_its_checkpoints_at_the_samples_asked_whatever_keep_says(trunk):
    kept = sorted(p.name for p in (trunk / "checkpoints").glob("samples-*.pt"))
    assert kept == ["samples-000000000.pt", "samples-000000640.pt", "samples-000001920.pt"]
    assert len(list((trunk / "checkpoints").glob("step-*.pt"))) <= 2  # checkpoint.keep=2 rotates the rest
    at_init = torch.load(trunk / "checkpoints" / "samples-000000000.pt", weights_only=False)
    assert at_init["step"] == 0 and at_init["samples_seen"] == 0


def test_a_branch_at_the_trunks_batch_continues_it_bit_identically(run_cli, trunk, tmp_path):
    run_dir = tmp_path / "same"
    out = _branch(run_cli, trunk, run_dir, "branch.at_samples=640", "branch.samples=1280")
    assert out.returncode == 0, out.stderr[-3000:]
    theirs = torch.load(trunk / "checkpoints" / "samples-000001920.pt", weights_only=False)
    ours = torch.load(sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1], weights_only=False)
    assert ours["step"] == theirs["step"] == 30 and ours["samples_seen"] == theirs["samples_seen"] == 1920
    for key, value in theirs["model"].items():
        assert torch.equal(ours["model"][key], value), key
    for key, value in theirs["optimizer"]["state"].items():
        assert torch.equal(ours["optimizer"]["state"][key]["momentum_buffer"], value["momentum_buffer"])
    # Its evaluations are the trunk's at the same steps (the first: the trunk's model at the branch point).
    trunk_loss = {r["step"]: r["val_loss"] for r in _records(trunk)}
    records = _records(run_dir)
    assert [r["step"] for r in records][0] == 10 and records[-1]["step"] == 30
    assert all(r["val_loss"] == trunk_loss[r["step"]] for r in records if r["step"] in trunk_loss)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["branch"]["samples_trained"] == 1280 and summary["branch"]["at_step"] == 10


def test_a_branch_at_another_batch_takes_the_rules_lr_and_weight_decay_and_exactly_its_samples(
    run_cli, trunk, tmp_path
):
    run_dir = tmp_path / "b256"
    out = _branch(run_cli, trunk, run_dir, "branch.at_samples=640", "branch.samples=1000", "batch.size=256")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    node = summary["branch"]
    assert node["samples_trained"] == 1000 and summary["samples_seen"] == 1640  # 256 x 3 + a last step of 232
    assert summary["steps"] == 10 + 4 and node["trunk_batch"] == 64 and node["batch"] == 256
    assert summary["batch_size"] == 256 and summary["k"] == 2
    # The linear rule: 0.1 x 256/128 (the trunk's constant LR, 0.05 at 64, times 4); the sqrt rule
    # for the weight decay: 5e-4 x sqrt(256/128).
    assert node["lr"] == pytest.approx(0.2) and summary["lr"] == pytest.approx(0.2)
    assert node["weight_decay"] == pytest.approx(5e-4 * 2**0.5)
    records = _records(run_dir)
    assert [r["samples_seen"] for r in records] == [640, 896, 1152, 1408, 1640]  # its start, then each quarter
    assert records[0]["lr"] == pytest.approx(0.05) and all(r["lr"] == pytest.approx(0.2) for r in records[1:-1])
    # the last step, cut to the 232 samples left, at the rule's LR for 232 samples
    assert records[-1]["lr"] == pytest.approx(0.2 * 232 / 256)
    # its own samples over its own time (the trunk's 640 samples not counted)
    assert summary["samples_per_s"] == pytest.approx(node["samples_trained"] / summary["train_time_s"])


def test_a_branch_at_its_own_tuned_lr_trains_at_it_from_its_first_step(run_cli, trunk, tmp_path):
    """Merrill et al. branch each batch at its tuned LR: optimizer.lr (and the momentum tuned with
    it) by the tuning's best.json for the branch's batch (tune.best), no rule; the trunk's steps keep
    the trunk's LR."""
    best = tmp_path / "lr_by_batch.json"
    best.write_text(json.dumps({"64": {"lr": 0.07, "momentum": 0.8}, "256": {"lr": 0.3, "momentum": 0.7}}))
    tuned = ["scaling.lr_rule=none", "optimizer.lr=${bsexp_tuned:lr}", f"tune.best={best}"]
    tuned += ["optimizer.momentum=${bsexp_tuned:momentum}"]
    run_dir = tmp_path / "b256"
    out = _branch(run_cli, trunk, run_dir, "branch.at_samples=640", "branch.samples=1000", "batch.size=256", *tuned)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["branch"]["lr"] == pytest.approx(0.3) and summary["lr"] == pytest.approx(0.3)
    records = _records(run_dir)
    assert records[0]["lr"] == pytest.approx(0.05)  # the trunk's, at the branch point (0.1 x 64/128)
    assert all(r["lr"] == pytest.approx(0.3) for r in records[1:])  # no rule: the last, cut step too
    # its momentum, not the trunk's (0.9) that the trunk's optimizer state carried
    saved = torch.load(sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1], weights_only=False)
    assert {g["momentum"] for g in saved["optimizer"]["param_groups"]} == {0.7} and summary["momentum"] == 0.7


BAD_BRANCHES = [
    # (arguments, the key the line names, a fragment of what is valid)
    (["branch.at_samples=700", "branch.samples=100"], "branch.at_samples", "[0, 640, 1920]"),
    (
        ["branch.at_samples=640", "branch.samples=100", "optimizer.weight_decay=0.1"],
        "optimizer.weight_decay",
        "only its batch",
    ),
    (["branch.at_samples=640", "branch.samples=100", "seed=3"], "seed", "differs from the trunk"),
    (["branch.at_samples=640"], "branch.samples", "its length"),
    (["branch.at_samples=640", "branch.samples=100", "batch=finder"], "batch.policy", "batch=fixed"),
]


@pytest.mark.parametrize("args, key, fragment", BAD_BRANCHES)
def test_bad_branch_settings_are_one_line_and_exit_2(run_cli, trunk, tmp_path, args, key, fragment):
    run_dir = tmp_path / "bad"
    out = _branch(run_cli, trunk, run_dir, *args)
    assert out.returncode == 2, out.stderr[-2000:]
    line = out.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line and key in line and fragment in line, line
    assert not run_dir.exists()  # refused before anything is written


def test_a_sweep_over_the_branch_points_runs_a_branch_from_each(run_cli, trunk, tmp_path):
    # The sweep's own config has no branch.at_samples (the sweep sets it, job by job): not an error.
    sweep = tmp_path / "sweep"
    out = run_cli(
        "-m",
        *TRUNK,
        f"branch.trunk={trunk}",
        "branch.at_samples=0,640",
        "branch.samples=256",
        "batch.size=128",
        f"hydra.sweep.dir={sweep}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))]
    assert sorted(s["branch"]["at_samples"] for s in summaries) == [0, 640]
    assert all(s["status"] == "completed" and s["branch"]["samples_trained"] == 256 for s in summaries)
    # Unswept, it is still refused before anything is written.
    out = run_cli(
        "-m",
        *TRUNK,
        f"branch.trunk={trunk}",
        "branch.samples=256",
        "batch.size=128,256",
        f"hydra.sweep.dir={tmp_path / 'unset'}",
    )
    assert out.returncode == 2 and "branch.at_samples=None" in out.stderr and not (tmp_path / "unset").exists()


def test_a_branch_past_the_runs_end_is_refused_naming_branch_samples(run_cli, trunk, tmp_path):
    out = _branch(run_cli, trunk, tmp_path / "long", "branch.at_samples=1920", "branch.samples=6000")
    assert out.returncode == 2 and "branch.samples=6000" in out.stderr and "at most 5080" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_a_missing_trunk_directory_is_one_line(run_cli, tmp_path):
    out = run_cli(
        *TRUNK,
        f"branch.trunk={tmp_path / 'nowhere'}",
        "branch.at_samples=0",
        "branch.samples=10",
        f"hydra.run.dir={tmp_path / 'x'}",
    )
    assert out.returncode == 2 and "branch.trunk=" in out.stderr and "no such directory" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_branch_into_a_directory_holding_a_run_is_refused_and_the_trunk_left_as_it_was(run_cli, trunk):
    before = {p: p.stat().st_mtime_ns for p in trunk.rglob("*") if p.is_file() and p.name != ".bsexp.lock"}
    out = run_cli(
        *TRUNK, f"branch.trunk={trunk}", "branch.at_samples=640", "branch.samples=640", f"hydra.run.dir={trunk}"
    )
    assert out.returncode == 2 and "hydra.run.dir" in out.stderr and "already holds" in out.stderr, out.stderr
    assert {p: p.stat().st_mtime_ns for p in trunk.rglob("*") if p.is_file() and p.name != ".bsexp.lock"} == before
