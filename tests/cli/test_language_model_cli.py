"""`python -m bsexp.train model=gpt data=text` end to end: tokens beside samples in summary.json, the
metrics and the printed summary, a loss that falls towards the source's floor, a ladder in bits per
byte, a run that ends at a loss target, and the mistakes a user can make, each one line and exit 2."""

import csv
import json
import math
import subprocess
import sys

import pytest

from bsexp.runs.ladder import Ladder
from bsexp.system.metrics import read_jsonl
from conftest import cli_env

# A GPT of 34k parameters on 8k tokens of the Markov source: about 5 s.
TINY_LM = [
    "model=gpt",
    "data=text",
    "data.train_tokens=8192",
    "data.val_size=64",
    "model.width=32",
    "model.heads=2",
    "batch.size=32",
    "optimizer.lr=0.02",  # the tiny model's (the recipe's 0.003 is the default size's)
    "epochs=3",
    "trainer.eval_every_steps=4",
    "trainer.threads=1",
    "trainer.progress=false",
    "logger=none",
]


def test_a_language_model_counts_tokens_and_its_loss_falls_towards_the_floor(run_cli, tmp_path):
    bits = ["trainer.ladder=[6,4.5]", "trainer.ladder_metric=val_bpb"]
    out = run_cli(*TINY_LM, *bits, f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert summary["status"] == "completed" and summary["context"] == 16
    assert summary["tokens_per_step"] == 32 * 16 and summary["steps"] == 48
    assert summary["tokens_seen"] == summary["samples_seen"] * 16 == 3 * 512 * 16
    assert summary["tokens_per_s"] == pytest.approx(summary["samples_per_s"] * 16)
    assert summary["val_bpb"] == pytest.approx(summary["val_loss"] / math.log(2))
    # The floor is below the loss, and the loss fell: from near uniform over 256 bytes (5.5 nats).
    assert 0.5 < summary["entropy_rate"] < summary["loss_floor"] < summary["val_loss"]
    assert summary["loss_above_floor"] == pytest.approx(summary["val_loss"] - summary["loss_floor"])
    assert records[0]["val_loss"] > records[-1]["val_loss"] + 0.5 and records[-1]["val_loss"] < 3.0
    assert [r["tokens_seen"] for r in records] == [r["samples_seen"] * 16 for r in records]
    # A ladder of bits per byte, falling: read from the run's own records, both rungs reached.
    assert summary["ladder"] == Ladder("val_bpb", (6.0, 4.5)).read(records) and set(summary["ladder"]) == {"6", "4.5"}
    printed = out.stdout + out.stderr
    assert "(sequences of 16: 512 tokens a step)" in printed and "tokens/s)" in printed
    assert "epochs / steps / tokens  3 / 48 / 24,576" in printed and "nats/token; floor" in printed
    assert "lr 0.01 (sqrt rule from 0.02)" in printed and "scaling.lr_rule: linear" not in printed


def test_the_linear_rule_with_adam_is_one_warning(run_cli, tmp_path):
    out = run_cli(*TINY_LM, "scaling.lr_rule=linear", "trainer.max_steps=1", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr[-3000:]
    warned = [line for line in (out.stdout + out.stderr).splitlines() if "scaling.lr_rule: linear" in line]
    assert len(warned) == 1 and "torch.optim.AdamW" in warned[0] and "scaling.lr_rule=sqrt" in warned[0]


def test_a_run_ends_at_the_evaluation_that_first_reaches_its_loss_target(run_cli, tmp_path):
    out = run_cli(*TINY_LM, "trainer.stop_metric=val_loss", "trainer.stop_at=3.2", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert records[-1]["val_loss"] <= 3.2 < records[-2]["val_loss"]  # lower is better: reached downwards
    assert summary["stopped_at"] == records[-1]["step"] == summary["steps"] < 48
    assert "reached trainer.stop_at=3.2 at step" in out.stdout + out.stderr


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["trainer.stop_at=1.5"], "trainer.stop_at=1.5: trainer.stop_metric=val_acc is an accuracy: valid: a fraction"),
        (["data.source=files"], "data.path=None: data.source=files reads data.path: give a file or a folder"),
        (["data.path=no/such/text.txt"], "data.path=no/such/text.txt: no such file or folder"),
        (["model.width=30"], "model.width=30 must be a multiple of model.heads=4"),
        (["data.source=hf", "data.name=roneneldan/TinyStories"], "data."),
    ],
)
def test_a_language_models_mistakes_are_one_line_and_exit_2(run_cli, tmp_path, overrides, line):
    out = run_cli("model=gpt", "data=text", "logger=none", *overrides, f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 2 and line in out.stderr, out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["model=gpt"], "model=gpt reads token sequences; valid: data=text"),
        (["data=text"], "data=text holds token sequences; valid: model=gpt"),
        (["trainer.stop_metric=val_bpb", "trainer.stop_at=2"], "trainer.stop_metric=val_bpb: data mnist1d has no bits"),
    ],
)
def test_a_model_and_data_that_do_not_go_together_are_one_line_and_exit_2(run_cli, tmp_path, overrides, line):
    out = run_cli("logger=none", "trainer.threads=1", *overrides, f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 2 and line in out.stderr, out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_language_models_sweep_report_gives_its_batch_and_speed_in_tokens_too(run_cli, data_root, tmp_path):
    sweep = tmp_path / "sweep"
    out = run_cli("-m", *TINY_LM, "epochs=1", "batch.size=16,64", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    done = subprocess.run(
        [sys.executable, "-m", "bsexp.report", str(sweep), "--metric", "val_loss", "--no-wandb"],
        capture_output=True,
        text=True,
        env=cli_env(data_root),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summaries = {
        s["batch_size"]: s for s in map(json.loads, map(lambda p: p.read_text(), sweep.glob("*/summary.json")))
    }
    rows = {int(r["batch"]): r for r in csv.DictReader((sweep / "report.csv").open())}
    assert sorted(rows) == sorted(summaries) == [16, 64]
    for batch, row in rows.items():  # each row's tokens as its run counted them
        assert int(row["tokens_per_step"]) == summaries[batch]["tokens_per_step"] == 16 * batch
        assert float(row["tokens_per_s"]) == pytest.approx(summaries[batch]["tokens_per_s"])
    table = (sweep / "report.md").read_text()
    assert "| 64 (1,024 tokens) |" in table and f"({summaries[64]['tokens_per_s']:,.0f} tokens/s)" in table
