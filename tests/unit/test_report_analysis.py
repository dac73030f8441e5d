"""The report's analysis alone (pure, fast): the critical-batch fit, the steps-to-target target,
the breaking point, rows that did not train, the noise scale's absence, on synthetic sweeps made
from known truths. The end-to-end report (files, figures, CLI) is in test_report.py."""

from __future__ import annotations

import ast
import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bsexp.report.analysis import (
    TARGET_BY,
    TOLERANCE_SE,
    Point,
    analyse,
    breaking_point,
    choose_target,
    difference_se,
    fit_critical_batch,
    fit_steps_samples,
    make_rows,
    reach,
    reach_row,
    schedule_bound,
    steps_critical_batch,
)
from report_runs import effective_batch, known_b_crit_runs, points, synthetic_run


def rows_of(runs: list[dict]):
    return make_rows(points(runs))


# ----------------------------------------------------------------------------- the critical batch (item 7)


def test_the_critical_batch_is_fitted_to_the_samples_each_step_took_not_the_nominal_batch():
    rows = rows_of(known_b_crit_runs(b_crit=5000))
    target = 0.6
    critical = steps_critical_batch(rows, "val_acc", target)
    assert critical.refused is None and critical.batches == [64, 128, 256, 512, 1024]
    assert critical.b_crit == pytest.approx(5000, rel=0.03)
    # The samples each batch took are the records' own: 875 a step at a nominal 1024.
    by_batch = {row.batch: got for row, got in critical.reached}
    assert by_batch[1024].batch == pytest.approx(effective_batch(1024), rel=0.01)
    # The same steps against the nominal batches miss B_crit by a third: the test tells them apart.
    nominal = fit_critical_batch([row.batch for row, _ in critical.reached], [got.steps for _, got in critical.reached])
    assert abs(nominal[2] / 5000 - 1) > 0.2


@pytest.mark.parametrize("b_crit", [300, 2000])
def test_the_fit_recovers_a_known_critical_batch_at_the_default_target(b_crit):
    critical = steps_critical_batch(rows_of(known_b_crit_runs(b_crit=b_crit, eval_every=3)), "val_acc")
    assert critical.refused is None
    assert critical.b_crit == pytest.approx(b_crit, rel=0.05)
    assert critical.fit.rms < 0.05


def test_two_batch_sizes_are_refused_with_the_reason():
    critical = steps_critical_batch(rows_of(known_b_crit_runs(batches=(64, 128))), "val_acc", 0.6)
    assert critical.b_crit is None and critical.fit is None
    assert critical.refused.startswith("fewer than 3 batch sizes trained (64, 128)")
    assert fit_critical_batch([64, 64, 128], [10, 11, 6]) is None  # two distinct batches, however many points


def test_the_fit_weighs_each_batch_by_its_relative_residual():
    # Steps off the model by a few per cent, a different share at each batch: least squares on S
    # against 1/B with weights 1/S^2 (numpy's polyfit weighs residuals by w, squared in the sum).
    import numpy as np

    batches = [64, 128, 256, 512]
    steps = [(20 + 5000 / b) * (1 + e) for b, e in zip(batches, (0.05, -0.04, 0.03, -0.06))]
    fit = fit_steps_samples(steps, [s * b for s, b in zip(steps, batches)])
    inverse = [1 / b for b in batches]
    e_min, s_min = np.polyfit(inverse, steps, 1, w=[1 / s for s in steps])
    assert (fit.s_min, fit.e_min) == (pytest.approx(s_min, rel=1e-9), pytest.approx(e_min, rel=1e-9))
    unweighted = np.polyfit(inverse, steps, 1)  # what the weights change: the test tells them apart
    assert abs(unweighted[1] / s_min - 1) > 0.01


def test_a_degenerate_fit_is_refused_with_the_reason():
    batches = [64, 128, 256, 512]
    faster = [100_000 / b - 20 for b in batches]  # steps fall faster than 1/B: S_min < 0
    fit = fit_steps_samples(faster, [s * b for s, b in zip(faster, batches)])
    assert fit.b_crit is None and fit.s_min < 0 and fit.refused.startswith("S_min = ")
    rising = [100 + b / 10 for b in batches]  # steps grow with the batch: E_min < 0
    fit = fit_steps_samples(rising, [s * b for s, b in zip(rising, batches)])
    assert fit.b_crit is None and fit.e_min < 0 and fit.refused.startswith("E_min = ")


def test_steps_to_target_interpolate_between_evaluations_and_flag_a_first_evaluation():
    run = synthetic_run(100, 0, 2, lambda s: s / 100, n_train=1000, eval_every=4)  # reaches 0.1 at step 10
    [point] = points([run])
    got = reach(point, "val_acc", 0.1)
    assert got.steps == pytest.approx(10) and got.samples == pytest.approx(1000) and not got.at_first_eval
    first = reach(point, "val_acc", 0.02)  # already passed at the first evaluation (step 4)
    assert first.at_first_eval and first.steps == 4
    assert reach(point, "val_acc", 0.5) is None


def test_a_row_reaches_the_target_only_if_every_seed_does_and_is_flagged_if_any_did_at_a_first_evaluation():
    rising = synthetic_run(100, 0, 2, lambda s: s / 100, n_train=1000, eval_every=4)  # 0.1 at step 10
    stuck = synthetic_run(100, 1, 2, lambda s: 0.05, n_train=1000, eval_every=4)
    assert reach_row(make_rows(points([rising, stuck]))[0], "val_acc", 0.1) is None
    early = synthetic_run(100, 1, 2, lambda s: 0.5, n_train=1000, eval_every=4)  # there at its first evaluation
    [row] = make_rows(points([rising, early]))
    got = reach_row(row, "val_acc", 0.1)
    assert got.steps == pytest.approx((10 + 4) / 2) and got.at_first_eval


# ----------------------------------------------------------------------------- the target (item 8)


def test_the_default_target_is_reached_by_every_point_within_the_first_half_of_its_samples():
    runs = known_b_crit_runs(b_crit=2000)
    rows = rows_of(runs)
    target = choose_target(rows, "val_acc")
    assert target.refused is None
    for point in (p for r in rows for p in r.done):
        assert reach(point, "val_acc", target.value).samples <= TARGET_BY * point.final_samples
    # ... and it is the highest such target: a little higher, some point needs more than half its samples.
    assert any(
        reach(p, "val_acc", target.value + 1e-3).samples > TARGET_BY * p.final_samples for r in rows for p in r.done
    )
    # The lowest final accuracy of any batch, the old target, is one the slowest batch reaches only at its end.
    lowest_best = min(max(rec["val_acc"] for rec in p.records) for r in rows for p in r.done)
    assert lowest_best > target.value


def test_a_point_evaluated_only_late_refuses_the_target_and_says_how_to_evaluate_more_often():
    runs = known_b_crit_runs(batches=(64, 128, 256))
    runs[0]["records"] = runs[0]["records"][-1:]  # evaluated once, at its end
    critical = steps_critical_batch(rows_of(runs), "val_acc")
    assert critical.b_crit is None and "trainer.eval_every_steps" in critical.refused


# ----------------------------------------------------------------------------- the breaking point (item 9)


def rows_with_means(means: dict[int, list[float]]):
    runs = [synthetic_run(b, seed, 1, lambda s, a=acc: a) for b, accs in means.items() for seed, acc in enumerate(accs)]
    return rows_of(runs)


def test_the_breaking_point_is_the_first_batch_above_the_best_outside_the_tolerance_not_the_last_within():
    # Means 98.0 / 97.6 / 90.0 / 98.0 / 95.0 for batches 32 ... 512, spread 0.3 points each.
    means = {32: 0.980, 64: 0.976, 128: 0.900, 256: 0.980, 512: 0.950}
    rows = rows_with_means({b: [m - 0.003, m, m + 0.003] for b, m in means.items()})
    found = breaking_point(rows, "val_acc")
    assert found.best.batch == 32 and found.row.batch == 128 and found.held.batch == 64
    se = math.sqrt(2 * 0.003**2 / 3)  # both rows' spread: the standard error of the difference
    assert found.tolerance == pytest.approx(TOLERANCE_SE * se)


def test_the_tolerance_counts_the_spread_of_both_rows():
    # The best's seeds agree exactly; batch 64's spread widely around a slightly lower mean.
    rows = rows_with_means({32: [0.90, 0.90, 0.90], 64: [0.85, 0.89, 0.93]})
    found = breaking_point(rows, "val_acc")
    assert found.row is None and found.held.batch == 64  # 1 point lower, 2.3 points of standard error
    assert breaking_point(rows, "val_acc", tolerance=0.005).row.batch == 64  # --tolerance is taken as given


def test_no_breaking_point_within_the_swept_range_and_none_judged_without_spread():
    rows = rows_with_means({32: [0.80, 0.81], 64: [0.81, 0.80], 128: [0.82, 0.81]})
    found = breaking_point(rows, "val_acc")
    assert found.row is None and found.refused is None and found.best.batch == 128
    single = breaking_point(rows_with_means({32: [0.9], 64: [0.8]}), "val_acc")
    assert single.row is None and "one seed each" in single.refused
    assert breaking_point(rows_with_means({32: [0.9], 64: [0.8]}), "val_acc", tolerance=0.05).row.batch == 64


def test_a_row_of_one_seed_borrows_the_other_rows_spread():
    one, three = rows_with_means({32: [0.9], 64: [0.85, 0.89, 0.93]})
    assert difference_se(one, three, "val_acc") == pytest.approx(math.sqrt(0.04**2 / 1 + 0.04**2 / 3))


# ----------------------------------------------------------------------------- rows, chance, noise (item 10)


def test_rows_at_chance_level_did_not_train_with_the_classes_summary_json_gives():
    rows = rows_with_means({32: [0.85, 0.86], 64: [0.12, 0.11]})
    assert [r.did_not_train("val_acc") for r in rows] == [False, True]  # mnist1d: 10 classes
    hundred = rows_of([synthetic_run(64, 0, 1, lambda s: 0.12, num_classes=100)])
    assert hundred[0].chance == pytest.approx(0.01) and not hundred[0].did_not_train("val_acc")
    configured = Point(
        name="0",
        setting=(),
        config={"data": {"_target_": "bsexp.engine.datasets.synthetic", "num_classes": 4}},
        summary={"status": "completed", "data": "synthetic"},
        status="completed",
    )
    assert configured.num_classes == 4
    # A row that did not train is left out of the fit, and the fit says so.
    critical = steps_critical_batch(
        rows_of(known_b_crit_runs(batches=(64, 128, 256, 512)) + [synthetic_run(1024, 0, 60, lambda s: 0.1)]), "val_acc"
    )
    assert "batch 1024: did not train" in critical.left_out and 1024 not in critical.batches


def test_a_sweep_of_the_batch_alone_has_no_configuration_column_and_names_the_data():
    analysis = analyse(points(known_b_crit_runs(batches=(64, 128, 256), epochs=20)))
    assert not analysis.varies_configuration
    assert analysis.labels.data == ("mnist1d",) and analysis.labels.model == ("CNN1d",)
    assert analysis.labels.epochs == (20.0,) and analysis.labels.seeds == (0, 1)
    assert analysis.labels.seeds_per_row == (2, 2)
    mixed = points(known_b_crit_runs(batches=(64, 128), epochs=2))
    mixed[0] = dataclasses.replace(mixed[0], setting=("batch.size=64", "model.norm=group"), status="completed")
    assert analyse(mixed).varies_configuration


def test_the_noise_scale_says_why_it_is_absent_and_is_the_mean_where_measured():
    fixed = analyse(points(known_b_crit_runs(batches=(64, 128), epochs=2)))
    assert fixed.noise.b_simple is None and "no two batch sizes" in fixed.noise.absent
    off = [dataclasses.replace(p, config={"trainer": {"noise_scale": "off"}}) for p in fixed.points]
    assert "trainer.noise_scale=off" in analyse(off).noise.absent
    measured = [synthetic_run(64, s, 2, lambda st: 0.5, noise_b_simple_mean=v) for s, v in ((0, 300.0), (1, 500.0))]
    assert analyse(points(measured)).noise.b_simple == pytest.approx(400.0)


# ----------------------------------------------------------------------------- purity


def test_the_analysis_imports_no_plotting_no_wandb_no_torch_and_reads_no_files():
    # The sweep's analysis package: the standard library and itself only. Each command's own
    # analysis (report.critical, .pareto, .steps, .compare) may use numpy and scipy (the
    # comparison's bootstrap is scipy's), but neither it nor anything it imports loads torch, a
    # plotting library or wandb, and it reads no file itself (its loader does).
    report = Path(__import__("bsexp.report", fromlist=["_"]).__file__).parent
    package = sorted((report / "analysis").glob("*.py"))
    commands = sorted(report.glob("*/analysis.py"))
    assert len(package) > 3 and len(commands) >= 4
    allowed = {"__future__", "collections", "math", "random", "statistics", "dataclasses", "pathlib", "typing"}
    for path in package:
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("bsexp.report.analysis"):
                imported.add((node.module or "").split(".")[0])
        assert imported <= allowed, (path, imported)
    for path in package + commands:
        source = path.read_text()
        assert "open(" not in source and "read_text" not in source, path
    names = [f"bsexp.report.{p.parent.name}.{p.stem}" for p in commands]
    probe = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in ('torch', 'matplotlib', 'wandb') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr


def _model(phases, batches):
    """McCandlish et al.'s model, by phase (progress P at noise scale b): steps and samples of a
    schedule that trains at batches[i] through phase i."""
    steps = sum(p * (1 + b / B) for (p, b), B in zip(phases, batches))
    samples = sum(p * (B + b) for (p, b), B in zip(phases, batches))
    return steps, samples


def test_the_schedule_bound_is_the_fewest_steps_any_two_level_schedule_takes_at_a_fixed_batchs_samples():
    phases = [(100, 10.0), (100, 200.0)]  # B_noise 10 for the first 100 noiseless steps, then 200
    ladder = [(100, 1000.0), (200, 21000.0)]  # (S_min, E_min) to the end of each phase
    found = schedule_bound(ladder)
    fixed_steps, fixed_samples = _model(phases, [64, 64])
    steps = found.steps(fixed_samples)
    assert steps[0] == pytest.approx(fixed_steps)  # the model's fixed batch, from S_min and E_min alone
    # Every two-level schedule spending the fixed batch's samples: the best takes steps[1] and no fewer.
    best = math.inf
    for b1 in (x / 10 for x in range(10, 3000)):
        b2 = (fixed_samples - 100 * (b1 + 10) - 100 * 200) / 100
        if b2 > 0:
            best = min(best, _model(phases, [b1, b2])[0])
    assert best == pytest.approx(steps[1], rel=1e-4) and steps[1] < fixed_steps - 20
    # Following c x B_noise gains nothing: at its own samples it takes a fixed batch's steps.
    prop_steps, prop_samples = _model(phases, [4 * 10.0, 4 * 200.0])
    assert found.steps(prop_samples)[0] == pytest.approx(prop_steps)


def test_a_constant_noise_scale_leaves_a_schedule_nothing_and_noisy_rungs_only_lower_the_ratio():
    assert schedule_bound([(50, 5000.0), (100, 10000.0)]).ratio == pytest.approx(1.0)
    # A rung fitted below the one before it adds nothing: r from the rungs that rise.
    noisy = schedule_bound([(100, 1000.0), (90, 900.0), (200, 21000.0)])
    assert noisy.ratio == pytest.approx(schedule_bound([(100, 1000.0), (200, 21000.0)]).ratio)
    assert schedule_bound([]) is None and schedule_bound([(100, 1000.0)]).steps(1000.0) is None
    # A last rung fitted below an earlier one would make r = 4: no schedule does worse than the
    # fixed batch it may always stay at, so r is at most 1.
    assert schedule_bound([(100, 10000.0), (50, 5000.0)]).ratio == 1.0


# ----------------------------------------------------------------------------- the best, told apart


def test_welchs_test_on_the_seeds_gives_scipys_p_value():
    """The analysis imports the standard library only, so its t distribution is its own (the
    incomplete beta function): checked against scipy's Welch test on seed-sized samples."""
    import random

    from scipy.stats import ttest_ind

    from bsexp.report.analysis import welch_p

    rng = random.Random(0)
    for _ in range(100):
        a = [rng.gauss(0.98, rng.uniform(1e-4, 0.02)) for _ in range(rng.randint(2, 10))]
        b = [rng.gauss(0.98 + rng.uniform(-0.03, 0.03), rng.uniform(1e-4, 0.02)) for _ in range(rng.randint(2, 10))]
        assert welch_p(a, b) == pytest.approx(ttest_ind(a, b, equal_var=False).pvalue, rel=1e-8, abs=1e-15)
        # One seed against several: Student's test with the spread of the several (equal spread assumed).
        one = [rng.gauss(0.95, 0.02)]
        assert welch_p(one, b) == pytest.approx(ttest_ind(one, b, equal_var=True).pvalue, rel=1e-8, abs=1e-15)
    assert welch_p([0.9], [0.8]) is None  # one seed each: no spread to test by
    assert welch_p([0.9, 0.9], [0.8, 0.8]) == 0.0 and welch_p([0.9, 0.9], [0.9, 0.9]) == 1.0


def test_the_best_row_is_separated_only_from_rows_its_seeds_tell_apart():
    from bsexp.report.analysis import separate

    def run(batch, seed, acc):
        return synthetic_run(batch, seed, 1, lambda s: acc)

    close = points(
        [run(32, s, a) for s, a in enumerate((0.980, 0.975, 0.985))]
        + [run(256, s, a) for s, a in enumerate((0.982, 0.978, 0.986))]
    )
    rows = analyse(close).rows
    found = separate(rows, "val_acc")
    assert found.best.batch == 256 and not found.separated and [a.row.batch for a in found.tied] == [32]
    far = points(
        [run(32, s, a) for s, a in enumerate((0.980, 0.981, 0.979))]
        + [run(256, s, a) for s, a in enumerate((0.950, 0.953, 0.947))]
        + [run(1024, 0, 0.5)]
    )
    found = separate(analyse(far).rows, "val_acc")
    # Batch 1024 ran one seed, far below: told apart by batch 32's spread.
    assert found.best.batch == 32 and found.separated and analyse(far).starred.batch == 32
    # Two rows of one seed each: no spread to tell them apart by, however far apart.
    found = separate(analyse([far[0], far[-1]]).rows, "val_acc")
    assert not found.separated and found.tied[0].p is None
