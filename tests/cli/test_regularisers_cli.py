"""The regulariser rules through the CLI: the values used in summary.json, bad values one line."""

import json

import pytest

from conftest import TINY_RUN

RULES = ["model.dropout=0.1", "scaling.dropout_rule=sqrt", "scaling.bn_momentum_rule=inverse"]


def test_the_dropout_and_momentum_a_run_used_are_in_its_summary(run_cli, tmp_path):
    out = run_cli(*TINY_RUN, "batch.size=256", *RULES, f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # k = 256 / 128 = 2: dropout 0.1 x sqrt(2), BatchNorm's momentum 0.1 / 2.
    assert summary["dropout"] == pytest.approx(0.1 * 2**0.5) and summary["base_dropout"] == 0.1
    assert summary["bn_momentum"] == pytest.approx(0.05) and summary["bn_momentum_rule"] == "inverse"
    assert "dropout 0.1414 (sqrt rule from 0.1), BatchNorm momentum 0.05 (inverse rule from 0.1)" in out.stdout
    # 2 steps at momentum 0.05 leave the running statistics 90 % of their initial values
    assert "scaling.bn_momentum_rule: BatchNorm's momentum 0.05 leaves its running statistics 90 %" in out.stdout


def test_a_growing_batch_ends_with_the_dropout_and_momentum_of_its_last_batch(run_cli, tmp_path):
    out = run_cli(
        *TINY_RUN,
        "epochs=2",
        "batch=scheduled",
        "batch.size=64",
        "batch.schedule.milestones=[1]",
        "batch.schedule.factor=4",
        *RULES,
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["batch_size"], summary["final_batch_size"]) == (64, 256)
    # k = 64 / 128 = 0.5 at the start, 256 / 128 = 2 at the end.
    assert summary["dropout"] == pytest.approx(0.1 * 0.5**0.5) and summary["bn_momentum"] == pytest.approx(0.2)
    assert summary["final_dropout"] == pytest.approx(0.1 * 2**0.5) and summary["final_bn_momentum"] == pytest.approx(
        0.05
    )


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("scaling.dropout_rule=cube", "scaling.dropout_rule"),
        ("scaling.bn_momentum_rule=linear", "scaling.bn_momentum_rule"),
        ("scaling.dropout_max=1.5", "scaling.dropout_max=1.5: must be a finite number in [0, 1)"),
        ("scaling.bn_momentum_min=0", "scaling.bn_momentum_min=0.0: must be a finite number in (0, 1]"),
        ("model.dropout=-0.1", "model.dropout=-0.1: must be a finite number in [0, 1)"),
    ],
)
def test_a_bad_rule_or_bound_is_one_line_and_exit_2(run_cli, tmp_path, override, fragment):
    out = run_cli(*TINY_RUN, override, f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("error: ") and fragment in line, line
    assert not (tmp_path / "run").exists()
