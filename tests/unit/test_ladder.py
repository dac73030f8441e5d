"""The ladder of targets read back from a run's metrics records (bsexp.runs.ladder): the step and
samples at which each rung was first reached, interpolated between the evaluations around it, the
LR then and its peak before; a loss's rungs reached from above; records past a budget left out."""

import pytest

from bsexp.runs.ladder import Ladder, decayed, rung_key


def record(step, value, lr=0.1, batch=32, metric="val_acc", epoch=None):
    return {
        "step": step,
        "samples_seen": step * batch,
        "epoch": epoch or step / 10,
        metric: value,
        "lr": lr,
        "batch_size": batch,
    }


RECORDS = [
    record(1, 0.10),
    record(2, 0.50),
    record(4, 0.70, lr=0.2),  # the peak
    record(8, 0.90, lr=0.15),
    record(16, 0.94, lr=0.08),  # below half the peak
    record(32, 0.99, lr=0.08),
]


def test_each_rung_is_read_where_the_records_first_reached_it_interpolated_between_evaluations():
    ladder = Ladder("val_acc", (0.6, 0.9, 0.95, 0.999))
    got = ladder.read(RECORDS)
    assert list(got) == ["0.6", "0.9", "0.95"]  # 0.999: never reached
    # 0.6 lies half way from 0.5 (step 2) to 0.7 (step 4): step 3, samples 96.
    assert got["0.6"]["step"] == pytest.approx(3) and got["0.6"]["samples"] == pytest.approx(96)
    assert got["0.6"]["evaluated_step"] == 4 and got["0.6"]["lr"] == 0.2 and got["0.6"]["lr_peak"] == 0.2
    # Reached exactly at an evaluation: that evaluation's step.
    assert got["0.9"]["step"] == pytest.approx(8) and got["0.9"]["evaluated_samples"] == 256
    # 0.95 from 0.94 (16) to 0.99 (32): a fifth of the way, step 19.2.
    assert got["0.95"]["step"] == pytest.approx(19.2) and got["0.95"]["samples"] == pytest.approx(19.2 * 32)
    assert not any(r["at_first_eval"] for r in got.values())
    assert not decayed(got["0.9"]) and decayed(got["0.95"])  # 0.08 < half of 0.2


def test_a_rung_the_first_evaluation_had_reached_is_marked_an_upper_bound():
    got = Ladder("val_acc", (0.05, 0.6)).read(RECORDS)
    assert got["0.05"]["at_first_eval"] and got["0.05"]["step"] == 1
    assert not got["0.6"]["at_first_eval"]


def test_a_loss_is_climbed_downwards():
    losses = [record(s, v, metric="val_loss") for s, v in [(1, 2.3), (10, 1.0), (20, 0.5), (40, 0.2)]]
    ladder = Ladder("val_loss", (1.5, 0.5, 0.3, 0.1))
    assert not ladder.higher and ladder.top == 0.1
    got = ladder.read(losses)
    assert list(got) == ["1.5", "0.5", "0.3"]
    assert got["1.5"]["step"] == pytest.approx(1 + 9 * 0.8 / 1.3)
    assert got["0.3"]["step"] == pytest.approx(20 + 20 * 2 / 3)
    assert ladder.top_reached({"val_loss": 0.1}) and not ladder.top_reached({"val_loss": 0.11})


def test_each_rung_keeps_the_batch_the_run_trained_at_when_it_reached_it():
    """An adaptive run's batch grows: the rung reached after the change reads the new batch, the
    one reached before it the start batch (the evaluation at or past the rung decides, as for lr)."""
    grown = [record(1, 0.2, batch=32), record(4, 0.6, batch=32), record(6, 0.8, batch=64), record(9, 0.95, batch=128)]
    got = Ladder("val_acc", (0.5, 0.7, 0.9)).read(grown)
    assert [got[r]["batch"] for r in ("0.5", "0.7", "0.9")] == [32, 64, 128]
    bare = [{k: v for k, v in r.items() if k != "batch_size"} for r in grown]  # records without it
    assert Ladder("val_acc", (0.5,)).read(bare)["0.5"]["batch"] is None


def test_records_past_the_budget_are_not_read():
    got = Ladder("val_acc", (0.9, 0.95)).read(RECORDS, until_epoch=1.6)  # epochs 0.1 ... 3.2
    assert list(got) == ["0.9"]


def test_records_without_the_metric_are_passed_over_and_the_ladder_is_read_from_a_runs_trainer_node():
    ladder = Ladder.of({"ladder": [0.5, 0.9], "ladder_metric": "val_acc"})
    assert ladder == Ladder("val_acc", (0.5, 0.9))
    got = ladder.read([record(1, 0.2), {"step": 2, "samples_seen": 64, "val_acc": None}, record(3, 0.6)])
    assert got["0.5"]["step"] == pytest.approx(1 + 2 * 0.3 / 0.4)
    assert Ladder.of({"ladder": [], "ladder_metric": "val_acc"}).top is None
    assert [rung_key(r) for r in (0.9, 0.985, 1.0, 0.25)] == ["0.9", "0.985", "1", "0.25"]
