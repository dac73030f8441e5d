"""experiment=lm_critical_batch end to end on a tiny GPT: its trunk keeps the checkpoints the
branches start from, each branch trains its sequences at its batch, and the report's critical
batch at each branch point is the one the branches' own losses give."""

import csv
import json
import subprocess
import sys

import pytest

from bsexp.report.critical.analysis import at_samples, branched_critical_batch
from conftest import cli_env

# One layer of width 16, 512 sequences of 16 bytes an epoch, two epochs at 16 sequences a step.
TINY = [
    "experiment=lm_critical_batch",
    "model.layers=1",
    "model.width=16",
    "model.heads=2",
    "data.train_tokens=8192",
    "data.val_size=64",
    "epochs=2",
    "trainer.eval_every_steps=8",
    "trainer.threads=1",
    "logger=none",
    "seed=0",
]


@pytest.mark.slow  # a trunk, four branches and the report, each a process: 40-80 s on 2 cores
def test_the_lm_critical_batch_report_reads_the_critical_batch_off_the_branches_losses(data_root, tmp_path):
    def train(*args):
        out = subprocess.run(
            [sys.executable, "-m", "bsexp.train", "-m", *TINY, *args],
            cwd=tmp_path,
            env=cli_env(data_root),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-3000:]

    trunk, branches = tmp_path / "trunk", tmp_path / "branches"
    train("experiment/lm_critical_batch=trunk", "checkpoint.at_samples=[0,256]", f"hydra.sweep.dir={trunk}")
    kept = sorted(p.name for p in trunk.glob("*/checkpoints/samples-*.pt"))
    assert kept == ["samples-000000000.pt", "samples-000000256.pt"]
    train(
        f"branch.trunk={trunk}",
        "branch.at_samples=0,256",
        "branch.samples=256",
        "batch.size=16,64",
        f"hydra.sweep.dir={branches}",
    )
    runs = [p.parent for p in branches.glob("*/summary.json")]
    summaries = [json.loads((run / "summary.json").read_text()) for run in runs]
    assert len(summaries) == 4 and all(s["status"] == "completed" for s in summaries)
    for s in summaries:  # exactly its sequences, in tokens too, at the square-root rule's LR
        assert s["branch"]["samples_trained"] == 256 and s["tokens_per_step"] == 16 * s["batch_size"]
        assert s["lr_peak"] == pytest.approx(0.02 * (s["batch_size"] / 128) ** 0.5)

    out = subprocess.run(
        [sys.executable, "-m", "bsexp.report.critical", str(branches)],
        cwd=tmp_path,
        env=cli_env(data_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "sequences of 16 tokens" in out.stdout
    rows = {int(r["samples_seen"]): r for r in csv.DictReader((branches / "critical.csv").open())}
    assert sorted(rows) == [0, 256]
    for at, row in rows.items():  # the branches' own validation loss where each ended, by batch
        losses = {}
        for run, s in zip(runs, summaries):
            if s["branch"]["at_samples"] == at:
                records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
                losses[s["batch_size"]] = at_samples(records, at + 256)
        start = at_samples(records, at)
        expected = branched_critical_batch(losses, start=start)
        assert (row["critical_batch"] or None) == (None if expected.batch is None else str(expected.batch))
        assert row["bound"] == expected.bound
