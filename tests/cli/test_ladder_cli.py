"""A run's ladder of targets through the CLI: summary.json's `ladder` is what its own metrics.jsonl
gives (bsexp.runs.ladder), the run ends at the evaluation that first reached the top rung, and a
ladder that does not climb is refused in one line."""

import json

import pytest

from bsexp.runs.ladder import Ladder
from bsexp.system.metrics import read_jsonl
from conftest import TINY_RUN

LADDER = ["epochs=4", "trainer.eval_growth=0.1", "trainer.ladder=[0.2,0.3,0.45]", "trainer.ladder_stop=true"]


def test_the_summarys_ladder_is_read_from_the_runs_records_and_the_run_ends_at_the_top_rung(run_cli, tmp_path):
    out = run_cli(*TINY_RUN, "batch.size=32", *LADDER, f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert summary["ladder"] == Ladder("val_acc", (0.2, 0.3, 0.45)).read(records)
    top = summary["ladder"]["0.45"]
    # It ended where an evaluation first reached 0.45, the one before had not, and nothing after.
    assert summary["stopped_at"] == top["evaluated_step"] == records[-1]["step"] == summary["steps"]
    assert records[-1]["val_acc"] >= 0.45 > records[-2]["val_acc"]
    assert records[-2]["step"] < top["step"] <= top["evaluated_step"]
    assert top["lr"] == records[-1]["lr"] and top["lr_peak"] == max(r["lr"] for r in records)
    assert top["batch"] == 32  # the batch it was reached at (an adaptive run's may have grown)
    assert "reached the ladder's top rung 0.45 at step" in out.stdout + out.stderr


@pytest.mark.parametrize(
    "override, line",
    [
        ("trainer.ladder=[0.9,0.8]", "trainer.ladder=[0.9, 0.8]: must be strictly rising within [0, 1]"),
        ("trainer.ladder_stop=true", "trainer.ladder_stop=True: needs trainer.ladder"),
    ],
)
def test_a_ladder_that_does_not_climb_is_one_line_and_exit_2(run_cli, tmp_path, override, line):
    out = run_cli(*TINY_RUN, override, f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 2 and out.stderr.startswith(f"error: {line}"), out.stderr[-2000:]
    assert len(out.stderr.splitlines()) == 1 and not (tmp_path / "run").exists()
