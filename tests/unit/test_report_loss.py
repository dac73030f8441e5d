"""The sweep report's analysis by a loss (`--metric val_loss`: better lower), on synthetic sweeps
made from known truths: the best row is the lowest mean, a breaking point is a loss that rises past
the tolerance, a target is reached at or below it (interpolated on a falling loss), the default
target is the lowest loss every point had reached by half its samples, and the critical-batch fit
recovers a known B_crit from losses. The accuracy side is test_report_analysis.py's."""

from __future__ import annotations

import math

import pytest

from bsexp.report.analysis import (
    Point,
    analyse,
    breaking_point,
    choose_target,
    make_rows,
    reach,
    reach_row,
    steps_critical_batch,
    target_rule,
)
from report_runs import effective_batch, points, synthetic_run


def loss_run(batch: int, seed: int, epochs: int, loss, **kwargs) -> dict:
    """One sweep point whose val_loss after s steps is `loss(s)` (nats), in its records and, the
    last one's, in its summary; its val_acc falls as the loss rises (synthetic_run's own mapping)."""
    run = synthetic_run(batch, seed, epochs, lambda s: 1.02 - loss(s) / 2.5, **kwargs)
    for record in run["records"]:
        record["val_loss"] = loss(record["step"])
    run["summary"]["val_loss"] = run["records"][-1]["val_loss"]
    return run


def known_b_crit_loss_runs(b_crit=5000, s_min=20, batches=(64, 128, 256, 512, 1024), start=2.3, floor=0.2, **kwargs):
    """Runs whose val_loss after s steps is floor + (start - floor) exp(-s / S), S = s_min (1 +
    b_crit / B) for B the samples per step actually taken (seeds 1 % apart): the steps to ANY loss
    between the two then follow (S/S_min - 1)(E/E_min - 1) = 1 with B_crit = b_crit."""
    runs = []
    for batch in batches:
        for seed in (0, 1):
            scale = s_min * (1 + b_crit / effective_batch(batch)) * (1 + 0.01 * (2 * seed - 1))
            curve = lambda s, k=scale: floor + (start - floor) * math.exp(-s / k)  # noqa: E731
            runs.append(loss_run(batch, seed, 60, curve, **kwargs))
    return runs


def flat_runs(means: dict[int, float], spread: float = 0.01) -> list[dict]:
    """3 seeds a batch at a constant val_loss, `spread` apart."""
    return [loss_run(b, seed, 2, lambda s, v=m + spread * (seed - 1): v) for b, m in means.items() for seed in range(3)]


# ----------------------------------------------------------------------------- the best row and the breaking point


def test_the_best_row_by_a_loss_is_the_lowest_mean_and_the_others_follow_from_the_lowest():
    runs = flat_runs({32: 1.30, 64: 1.20, 128: 1.25, 256: 1.60})
    analysis = analyse(points(runs), "val_loss", higher=False)
    assert analysis.best.batch == 64 and analysis.best.mean("val_loss") == pytest.approx(1.20)
    assert [a.row.batch for a in analysis.separation.against] == [128, 32, 256]  # the next best first
    assert analysis.separation.separated  # 0.05 apart, seeds 0.01 apart: Welch tells them apart
    assert analysis.higher is False
    # Read as an accuracy (higher better), the same loss would crown the worst row.
    assert analyse(points(runs), "val_loss").best.batch == 256


def test_the_breaking_point_of_a_loss_is_the_first_batch_above_the_best_whose_loss_rises_past_the_tolerance():
    rows = make_rows(points(flat_runs({32: 1.30, 64: 1.20, 128: 1.25, 256: 1.60})))
    given = breaking_point(rows, "val_loss", tolerance=0.1, higher=False)
    assert (given.best.batch, given.held.batch, given.row.batch) == (64, 128, 256)  # 128 is 0.05 above: held
    assert given.given and given.tolerance == 0.1
    # By default, 2 standard errors of the difference: seeds 0.01 apart make 0.05 a real rise.
    default = breaking_point(rows, "val_loss", higher=False)
    assert default.row.batch == 128 and default.tolerance == pytest.approx(2 * math.sqrt(2 * 0.01**2 / 3))
    # A batch whose loss is lower than the best's is never one: the best is the lowest.
    assert breaking_point(make_rows(points(flat_runs({32: 1.3, 64: 1.2}))), "val_loss", higher=False).row is None


# ----------------------------------------------------------------------------- steps to a target loss


def records_point(losses: list[tuple[int, float]], batch: int = 32) -> Point:
    """A point evaluated at the given (step, val_loss), batch samples a step."""
    records = [{"step": s, "samples_seen": batch * s, "val_loss": v} for s, v in losses]
    summary = {"status": "completed", "batch_size": batch, "samples_seen": records[-1]["samples_seen"]}
    return Point(name="p", setting=(f"batch.size={batch}",), summary=summary, records=records, status="completed")


def test_reach_interpolates_a_falling_loss_between_the_evaluation_above_the_target_and_the_first_at_or_below():
    point = records_point([(1, 2.3), (10, 2.0), (20, 1.0), (30, 0.8)])
    got = reach(point, "val_loss", 1.25, higher=False)
    # (1.25 - 2.0) / (1.0 - 2.0) = 0.75 of the way from step 10 to step 20.
    assert (got.steps, got.samples, got.at_first_eval) == (pytest.approx(17.5), pytest.approx(560), False)
    assert reach(point, "val_loss", 1.0, higher=False).steps == pytest.approx(20)  # at it counts
    assert reach(point, "val_loss", 0.5, higher=False) is None  # never that low
    first = reach(point, "val_loss", 2.5, higher=False)  # the first evaluation was below it already
    assert first.at_first_eval and first.steps == 1
    # Read as an accuracy, 2.3 >= 1.25 would count as reached at the first evaluation.
    assert reach(point, "val_loss", 1.25).at_first_eval


def test_a_loss_that_rises_before_it_falls_is_reached_where_it_first_comes_down_to_the_target():
    # Real runs' validation loss often rises over the first steps (a warm-up, an LR too high).
    point = records_point([(1, 2.29), (2, 2.30), (4, 2.28), (8, 2.0)])
    got = reach(point, "val_loss", 2.285, higher=False)
    assert got.steps == pytest.approx(2 + 2 * (2.285 - 2.30) / (2.28 - 2.30)) and not got.at_first_eval


def test_a_rows_steps_to_a_target_loss_are_the_mean_of_its_seeds():
    row = make_rows(points(known_b_crit_loss_runs(batches=(128,))))[0]
    seeds = [reach(p, "val_loss", 1.0, higher=False) for p in row.done]
    got = reach_row(row, "val_loss", 1.0, higher=False)
    assert got.steps == pytest.approx(sum(r.steps for r in seeds) / 2)
    assert reach_row(row, "val_loss", 0.1, higher=False) is None  # below the floor: no seed gets there


# ----------------------------------------------------------------------------- the default target and the fit


def test_the_default_loss_target_is_the_lowest_loss_every_point_had_reached_by_half_its_samples():
    rows = make_rows(points(known_b_crit_loss_runs(eval_every=3)))
    target = choose_target(rows, "val_loss", higher=False)
    lowest_by_half = [
        min(r["val_loss"] for r in p.records if r["samples_seen"] <= p.summary["samples_seen"] / 2)
        for row in rows
        for p in row.done
    ]
    assert target.value == max(lowest_by_half) and target.refused is None and target.doubt is None
    assert target.rule == target_rule("val_loss", higher=False)
    assert target.rule == "the lowest val_loss every point reached within the first half of its training samples"
    for row in rows:  # so every point reaches it within the first half of its samples
        for p in row.done:
            assert reach(p, "val_loss", target.value, higher=False).samples <= p.summary["samples_seen"] / 2


@pytest.mark.parametrize("b_crit", [300, 2000])
def test_the_fit_recovers_a_known_critical_batch_from_a_falling_loss_at_the_default_target(b_crit):
    critical = steps_critical_batch(
        make_rows(points(known_b_crit_loss_runs(b_crit=b_crit, eval_every=3))), "val_loss", higher=False
    )
    assert critical.refused is None and critical.batches == [64, 128, 256, 512, 1024]
    assert critical.b_crit == pytest.approx(b_crit, rel=0.05)
    assert critical.fit.rms < 0.05


def test_a_given_loss_target_is_fitted_where_an_accuracys_would_be_at_chance():
    # val_loss 0.1 lies below 0.19, which as a 10-class accuracy is chance level: a loss is not
    # judged by it, and the sweep's whole analysis carries the direction.
    runs = known_b_crit_loss_runs(b_crit=2000, floor=0.02)
    analysis = analyse(points(runs), "val_loss", target=0.1, higher=False)
    [critical] = analysis.critical
    assert critical.refused is None and critical.b_crit == pytest.approx(2000, rel=0.05)
    assert critical.target.value == 0.1 and critical.target.rule == "given (--target)"
    assert not any(row.did_not_train("val_loss", higher=False) for row in analysis.rows)
    by_batch = {row.batch: got for row, got in critical.reached}
    assert by_batch[64].steps == pytest.approx(reach_row(analysis.rows[0], "val_loss", 0.1, higher=False).steps)


def test_a_failed_seed_that_sets_a_high_loss_target_is_named():
    runs = known_b_crit_loss_runs(batches=(64, 128, 256))
    runs[1] = loss_run(64, 1, 60, lambda s: 1.5 + 0.8 * math.exp(-s / 200))  # stalls 1.3 nats above the others
    target = choose_target(make_rows(points(runs)), "val_loss", higher=False)
    assert target.value == pytest.approx(1.5, abs=0.01)
    assert "the target was set by `1_batch.size=64,seed=1` (1.50" in target.doubt
    assert "far above the other seeds of batch 64" in target.doubt and "sets it high" in target.doubt
