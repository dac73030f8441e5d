"""The critical batch from branch losses with known answers, and its report (table, CSV, figure)
from branch and trunk directories written as bsexp writes them."""

import csv
import json
import subprocess
import sys

import pytest

from bsexp.report.critical import report
from bsexp.report.critical.analysis import (
    Branch,
    BranchedCritical,
    add_b_crit,
    at_samples,
    best_lrs,
    bootstrap_interval,
    branched_critical_batch,
    seed_epsilon,
    window_b_simple,
)
from report_runs import known_b_crit_runs, points


def test_the_critical_batch_is_the_largest_batch_within_epsilon_of_the_smallest():
    losses = {32: 1.00, 64: 1.03, 128: 1.049, 256: 1.06, 512: 1.5}
    assert branched_critical_batch(losses, 0.05) == BranchedCritical(128)
    assert branched_critical_batch(losses, 0.01) == BranchedCritical(32, "<=")  # 64 already out: at most the smallest
    assert branched_critical_batch(losses, 0.1) == BranchedCritical(256)
    assert branched_critical_batch(losses, 1.0) == BranchedCritical(512, ">=")  # every batch within: a lower bound
    # A batch that falls out ends it, though a larger one comes back within (noise): contiguous.
    assert branched_critical_batch({32: 1.0, 64: 1.2, 128: 1.01}, 0.05) == BranchedCritical(32, "<=")
    # A batch without a result ends the search (a lower bound); without the smallest, no answer.
    assert branched_critical_batch({32: 1.0, 64: None, 128: 1.01}, 0.05) == BranchedCritical(32, ">=")
    assert branched_critical_batch({32: None, 64: 1.0}, 0.05) == BranchedCritical(None)
    assert branched_critical_batch({}, 0.05).batch is None
    assert str(BranchedCritical(128)) == "128" and str(BranchedCritical(1024, ">=")) == "≥ 1,024"


def test_the_loss_at_a_number_of_samples_is_interpolated_between_evaluations():
    records = [
        {"samples_seen": 100, "val_loss": 2.0},
        {"samples_seen": 300, "val_loss": 1.0},
        {"samples_seen": 400, "val_loss": None},
    ]
    assert at_samples(records, 200) == pytest.approx(1.5)
    assert at_samples(records, 300) == 1.0
    assert at_samples(records, 350) is None and at_samples(records, 50) is None


def _write_run(path, summary, records):
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


# Final losses by (branch point, batch): at 0 the critical batch is 64 for both seeds; at 4096,
# 256 on the seeds' mean (seed 1 alone would say 512).
LOSSES = {0: {32: 2.00, 64: 2.05, 128: 2.30, 256: 2.9}, 4096: {32: 0.50, 64: 0.505, 128: 0.51, 256: 0.52, 512: 0.524}}
SEED_SHIFT = {0: 0.0, 1: 0.016}


def _branch_sweep(tmp_path):
    trunks, sweep, length = tmp_path / "trunks", tmp_path / "branches", 2048
    for seed in (0, 1):
        # The trunk: B_simple 100 + samples/100 at every 512 samples; val_acc rising.
        records = [
            {
                "samples_seen": s,
                "step": s // 32,
                "noise/grad_sq_raw": 2.0,
                "noise/trace_sigma_raw": 200 + s / 50,
                "val_acc": 0.1 + s / 10_000,
                "val_loss": 2.0,
            }
            for s in range(0, 8193, 512)
        ]
        _write_run(trunks / f"{seed}_seed={seed}", {"status": "completed", "seed": seed}, records)
    job = 0
    for at, by_batch in LOSSES.items():
        for batch, loss in by_batch.items():
            for seed in (0, 1):
                final = loss + SEED_SHIFT[seed] * (batch == 512)
                # evaluated at the start, half-way and at the end: the half-way loss is 3x the final's
                # for batches above 64, so the half-length critical batch is 64 wherever it can be
                half = final * (3 if batch > 64 else 1)
                records = [
                    {"samples_seen": at, "val_loss": 9.0},
                    {"samples_seen": at + length // 2, "val_loss": half},
                    {"samples_seen": at + length, "val_loss": final},
                ]
                summary = {
                    "status": "completed",
                    "seed": seed,
                    "branch": {
                        "at_samples": at,
                        "batch": batch,
                        "samples": length,
                        "trunk": str(trunks / f"{seed}_seed={seed}"),
                    },
                }
                _write_run(sweep / f"{job}_b", summary, records)
                job += 1
    return sweep


def test_the_report_holds_the_critical_batch_b_simple_their_ratio_and_the_sensitivities(tmp_path):
    sweep = _branch_sweep(tmp_path)
    found = report(sweep, epsilon=0.05)
    by_at = {s.at: s for s in found}
    assert by_at[0].critical == BranchedCritical(64) and by_at[4096].critical == BranchedCritical(256)
    assert [c.batch for c in by_at[4096].per_seed] == [512, 256]  # seed 1's 512 branch is 0.016 worse
    # B_simple: mean tr(Σ) / mean |G|² over [at, at + 2048]: 100 + mean(0..2048 step 512)/100 = 110.24
    assert by_at[0].b_simple == pytest.approx(100 + 1024 / 100)
    assert by_at[4096].b_simple == pytest.approx(100 + (4096 + 1024) / 100)
    assert by_at[0].ratio(by_at[0].b_simple) == pytest.approx(110.24 / 64)
    assert by_at[0].by_epsilon[0.01] == BranchedCritical(32, "<=")
    assert by_at[4096].by_epsilon[0.1] == BranchedCritical(512, ">=")
    assert by_at[4096].by_length[0.5] == BranchedCritical(64)  # half-way, the larger batches lag
    assert by_at[4096].target == pytest.approx(0.1 + (4096 + 2048) / 10_000)
    text = (sweep / "critical.md").read_text()
    # The seeds drawn with replacement: both seed 0 twice (512) and seed 1 twice (256) are drawn.
    assert by_at[4096].interval == (256, 512) and by_at[0].interval == (64, 64)
    assert "| 4,096 | 256 | [256, 512] | 0.05 | ≥ 512, 256 | 151 | 0.59 |" in text
    rows = list(csv.DictReader(open(sweep / "critical.csv")))
    assert [int(r["critical_batch"]) for r in rows] == [64, 256]
    assert float(rows[0]["b_simple_ratio"]) == pytest.approx(110.24 / 64)
    assert (sweep / "critical.png").stat().st_size > 10_000


def test_b_crit_comes_from_the_fixed_sweeps_steps_to_the_trunks_accuracy(tmp_path):
    sweep = _branch_sweep(tmp_path)
    found = report(sweep)
    # A sweep whose steps to any accuracy follow B_crit = 5,000 (report_runs), below its top of 0.9.
    add_b_crit(found, points(known_b_crit_runs(b_crit=5000)))
    assert found[0].target == pytest.approx(0.3048)
    assert found[0].b_crit == pytest.approx(5000, rel=0.05)
    assert found[0].ratio(found[0].b_crit) == pytest.approx(5000 / 64, rel=0.05)


def test_b_crit_to_the_trunks_loss_is_counted_to_a_loss_reached_at_or_below_it(tmp_path):
    # A language model's target: the trunks' val_loss (2.0) at each branch's end, which the fixed
    # sweep's loss, 2.5 (1.02 - accuracy), falls to; its steps follow the same B_crit as any accuracy's.
    sweep = _branch_sweep(tmp_path)
    found = report(sweep, metric="val_loss")
    add_b_crit(found, points(known_b_crit_runs(b_crit=5000)))
    assert (found[0].target_metric, found[0].target) == ("val_loss", pytest.approx(2.0))
    assert found[0].b_crit == pytest.approx(5000, rel=0.1)  # an early target: steps resolved to a few
    assert "target_val_loss" in (sweep / "critical.csv").read_text().splitlines()[0]
    assert "| target val_loss |" in (sweep / "critical.md").read_text()
    # The same steps as to the accuracy that loss goes with (1.02 - 2.0 / 2.5 = 0.22): the same fit.
    by_acc = report(sweep)
    for stage in by_acc:
        stage.target = 1.02 - 2.0 / 2.5
    add_b_crit(by_acc, points(known_b_crit_runs(b_crit=5000)))
    assert [s.b_crit for s in found] == pytest.approx([s.b_crit for s in by_acc], rel=1e-9)


def test_the_report_command_refuses_a_directory_without_branches_in_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    for args, key in (
        (["empty"], "sweep=empty"),
        (["missing"], "sweep=missing"),
        (["empty", "--epsilon", "0"], "--epsilon=0.0"),
        (["empty", "--window", "2"], "--window=2.0: valid: a fraction of the branch's length"),
        (["empty", "--epsilon", "wide"], "--epsilon=wide: valid: a positive relative tolerance (e.g. 0.05), or seeds"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "bsexp.report.critical", *args], cwd=tmp_path, capture_output=True, text=True
        )
        assert out.returncode == 2 and key in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_b_simple_over_a_window_is_the_ratio_of_the_averages_or_unresolved_where_the_signal_is_not_positive():
    records = [
        {"samples_seen": 0, "noise/grad_sq_raw": 1.0, "noise/trace_sigma_raw": 100.0},
        {"samples_seen": 10, "noise/grad_sq_raw": 3.0, "noise/trace_sigma_raw": 500.0},
        {"samples_seen": 20, "noise/grad_sq_raw": -5.0, "noise/trace_sigma_raw": 100.0},
    ]
    assert window_b_simple(records, 0, 10) == (pytest.approx(300 / 2), "")  # not the mean of 100 and 166.7
    value, why = window_b_simple(records, 0, 20)
    assert value is None and "unresolved" in why  # |G|² averages -1/3
    assert window_b_simple(records, 30, 40)[0] is None


def test_a_diverged_branch_is_out_of_tolerance_and_a_branch_without_progress_tells_nothing():
    import math

    # 256 diverged: the critical batch is 128, not "at least 512" by skipping it
    diverged = {32: 1.0, 64: 1.0, 128: 1.01, 256: math.inf, 512: 1.0}
    assert branched_critical_batch(diverged, 0.05) == BranchedCritical(128)
    # nothing learned yet (the smallest batch still at its starting loss): no answer, not "every batch"
    assert branched_critical_batch({32: 2.29, 64: 2.30, 1024: 2.30}, 0.05, start=2.30) == BranchedCritical(None, "none")
    assert str(BranchedCritical(None, "none")) == "no progress"
    assert branched_critical_batch({32: 1.5, 64: 1.52}, 0.05, start=2.30) == BranchedCritical(64, ">=")


def test_epsilon_from_the_seeds_is_the_relative_spread_of_the_smallest_batchs_branch_loss(tmp_path):
    assert seed_epsilon({1: 1.0, 2: 1.1}) == pytest.approx(0.0707107 / 1.05, rel=1e-5)
    assert seed_epsilon({1: 1.0, 2: None}) is None and seed_epsilon({1: 1.0, 2: float("inf")}) is None
    sweep = _branch_sweep(tmp_path)
    # Batch 32's branches end alike on both seeds: ε 0, so any batch whose loss is higher is out.
    by_at = {s.at: s for s in report(sweep, epsilon="seeds")}
    assert by_at[0].epsilon == 0 and by_at[0].critical == BranchedCritical(32, "<=")
    text = (sweep / "critical.md").read_text()
    assert "ε = each point's own, from the trunk seeds' spread" in text and "| 0 | ≤ 32 | [32, 32] | 0 |" in text
    out = subprocess.run(
        [sys.executable, "-m", "bsexp.report.critical", str(sweep), "--epsilon", "seeds"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and "| 4,096 | ≤ 32 |" in out.stdout, out.stderr


def test_the_bootstrap_interval_spans_the_seeds_answers_and_is_a_point_where_they_agree():
    # Seed 1's 128 branch is far out, seed 2's within 5 %: one seed says 64, the other 128.
    per_seed = {1: {32: 1.0, 64: 1.01, 128: 1.5}, 2: {32: 1.0, 64: 1.01, 128: 1.02}}
    assert bootstrap_interval(per_seed, 0.05, {1: 3.0, 2: 3.0}) == (64, 128)
    agree = {s: {32: 1.0, 64: 1.01, 128: 1.5} for s in (1, 2, 3)}
    assert bootstrap_interval(agree, 0.05, {1: 3.0, 2: 3.0, 3: 3.0}) == (64, 64)
    assert bootstrap_interval({1: agree[1]}, 0.05, {1: 3.0}) == (None, None)  # one seed: nothing to resample


def _branch(seed, lr, losses, status="completed"):
    records = [{"samples_seen": at, "val_loss": loss} for at, loss in losses]
    return Branch(seed=seed, at=0, batch=64, length=1000, trunk="t", status=status, records=records, lr=lr)


def test_a_branchs_loss_over_a_window_is_the_median_there_which_a_spike_at_its_end_does_not_move():
    branch = _branch(1, 0.1, [(0, 2.0), (700, 1.0), (800, 0.5), (900, 0.4), (1000, 9.0)])
    assert branch.loss() == 9.0
    assert branch.loss(1.0, 0.25) == 0.5  # over [750, 1000]: 0.5, 0.4 and 9.0
    assert branch.loss(0.5, 0.25) == pytest.approx(1.0 + (2.0 - 1.0) * 200 / 700)  # none inside: at its end


def test_the_best_lr_of_a_sweep_is_the_one_whose_branches_end_lowest_on_the_seeds_mean():
    branches = [_branch(s, 0.1, [(0, 3.0), (1000, 1.0 + s / 100)]) for s in (1, 2)]
    branches += [_branch(s, 0.2, [(0, 3.0), (1000, 0.8)]) for s in (1, 2)]
    # 0.4: the lowest on seed 1, diverged on seed 2 (inf): not chosen
    branches += [_branch(1, 0.4, [(0, 3.0), (1000, 0.1)]), _branch(2, 0.4, [(0, 3.0)], status="diverged")]
    kept, chosen = best_lrs(branches)
    assert chosen == {(0, 64): 0.2} and sorted((b.seed, b.lr) for b in kept) == [(1, 0.2), (2, 0.2)]
