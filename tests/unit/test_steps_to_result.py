"""Steps to result's analysis on synthetic tunings with a known critical batch: the best trial per
batch size, the fit S = S_min (1 + B_crit / B) and its regions, a best LR at the edge of the range,
the rules against the tuned LR; the search's points (bsexp.runs.quasi_random)."""

import dataclasses
import json
import math
import re

import pytest
import yaml

from bsexp.engine.evaluate import Evaluator
from bsexp.report.critical.analysis import BranchedCritical, Stage
from bsexp.report.steps.analysis import analyse
from bsexp.report.steps.cli import estimates, nearest_stage
from bsexp.report.steps.render import figures, markdown, rows
from bsexp.runs.quasi_random import sobol, trial_values
from conftest import ROOT
from report_runs import effective_batch, known_b_crit_runs, points, synthetic_run

S_MIN, B_CRIT, TARGET = 40.0, 500.0, 0.9


def best_lr(batch: int) -> float:
    return 0.02 * math.sqrt(batch / 32)  # the optimum follows the square-root rule here


def steps_at(batch: int, lr: float) -> float:
    """The steps a trial of `lr` takes to the target: S_min (1 + B_crit / B) at the best LR, more
    the farther off it (a decade off: twice as many)."""
    return S_MIN * (1 + B_CRIT / effective_batch(batch)) * (1 + abs(math.log10(lr / best_lr(batch))))


def tuning(batches=(16, 32, 64, 128, 256, 512, 1024), factors=(0.1, 1.0, 10.0), seeds=()):
    runs = []
    for batch in batches:
        for seed in (0, *seeds):
            for factor in factors if seed == 0 else (1.0,):
                lr = best_lr(batch) * factor
                scale = steps_at(batch, lr) / TARGET  # accuracy grows linearly: the target at steps_at
                runs.append(synthetic_run(batch, seed, 40, lambda s, k=scale: min(1.0, s / k), lr=lr))
    return points(runs)


def test_the_fit_to_the_best_trials_finds_the_known_critical_batch_and_its_regions():
    result = analyse(tuning(), [], TARGET)
    assert [b.best.lr for b in result.batches] == pytest.approx([best_lr(b.batch) for b in result.batches])
    for b in result.batches:  # the best: the fewest steps, at the optimum
        assert b.best.steps == pytest.approx(steps_at(b.batch, best_lr(b.batch)), rel=1e-3)
    assert result.fit.b_crit == pytest.approx(B_CRIT, rel=0.02) and result.fit.s_min == pytest.approx(S_MIN, rel=0.02)
    assert result.regions.perfect_up_to == pytest.approx(B_CRIT / 4, rel=0.02)
    assert result.regions.maximal_from == pytest.approx(B_CRIT * 4, rel=0.02)
    assert result.region(16) == "perfect scaling" and result.region(512) == "diminishing returns"
    assert result.region(4096) == "maximal data parallelism"
    # The optimum follows the square-root rule: the linear rule is too high by sqrt(k) above 128.
    ratios = {b.batch: result.rule_ratios(b) for b in result.batches}
    assert result.reference == 128
    assert ratios[512]["sqrt"] == pytest.approx(1.0) and ratios[512]["linear"] == pytest.approx(2.0)
    # As the report says it: the fit, the regions, and the tuned curve's row of the four estimates.
    text = markdown(result, estimates(result, [], None, None))
    assert f"maximal data parallelism from batch {result.regions.maximal_from:,.0f}" in text
    assert f"**Regions** (of the fit): perfect scaling up to batch {result.regions.perfect_up_to:,.0f}" in text
    [row] = [line for line in text.splitlines() if line.startswith("| this curve: the LR tuned at each batch |")]
    assert float(row.split("|")[2].replace(",", "")) == pytest.approx(B_CRIT, rel=0.02)
    assert "| a sweep with the LR scaled by a rule | - | not given: --rule-sweep DIR" in text
    assert "| branched runs (Merrill et al. 2025) | - | not given: --branched DIR" in text


def test_steps_to_a_loss_at_or_below_its_target_are_the_steps_to_the_accuracy_it_goes_with():
    # The synthetic runs' loss is 2.5 (1.02 - accuracy): falling to 0.3 as the accuracy rises to 0.9.
    by_acc = analyse(tuning(), [], TARGET)
    by_loss = analyse(tuning(), [], 2.5 * (1.02 - TARGET), metric="val_loss")
    assert [b.best.steps for b in by_loss.batches] == pytest.approx([b.best.steps for b in by_acc.batches])
    assert [b.best.lr for b in by_loss.batches] == [b.best.lr for b in by_acc.batches]
    assert by_loss.fit.b_crit == pytest.approx(by_acc.fit.b_crit)
    assert (by_acc.target_text, by_loss.target_text) == ("val_acc >= 90 %", "val_loss <= 0.3")
    assert markdown(by_loss, []).startswith("# Steps to result: val_loss <= 0.3\n")


def test_a_best_lr_at_the_edge_of_the_range_is_flagged_and_a_batch_that_never_gets_there_said():
    result = analyse(tuning(factors=(1.0, 3.0, 10.0)), [], TARGET)
    assert {b.at_edge for b in result.batches} == {"lowest"}  # the optimum is the lowest LR tried
    assert "**Caution**: the best LR of batch 16, 32, 64, 128, 256, 512, 1024 is at the edge" in markdown(result, [])
    [point] = tuning(batches=(64,), factors=(1.0,))
    never = [dataclasses.replace(point, records=[dict(r, val_acc=0.5) for r in point.records])]  # stuck below it
    result = analyse([*tuning(), *never], [], TARGET)
    assert analyse(never, [], TARGET).not_reached == [64]
    assert result.fit.b_crit == pytest.approx(B_CRIT, rel=0.02)


def test_reruns_over_seeds_give_the_spread_of_the_best():
    runs = tuning(seeds=(1, 2))
    trials = [p for p in runs if p.summary["seed"] == 0]
    reruns = [p for p in runs if p.summary["seed"] != 0]
    result = analyse(trials, reruns, TARGET)
    assert all(len(b.steps_over_seeds()) == 3 for b in result.batches)


def test_reruns_that_miss_the_target_are_counted_and_said():
    runs = tuning(batches=(64, 128), seeds=(1, 2))
    trials = [p for p in runs if p.summary["seed"] == 0]
    reruns = [p for p in runs if p.summary["seed"] != 0]
    stuck = [  # seed 2 of batch 128 ends below the target
        dataclasses.replace(p, records=[dict(r, val_acc=0.5) for r in p.records])
        if (p.summary["seed"], p.summary["batch_size"]) == (2, 128)
        else p
        for p in reruns
    ]
    result = analyse(trials, stuck, TARGET)
    seeds = {r["batch"]: (r["seeds"], r["runs"]) for r in rows(result)}
    assert seeds == {64: (3, 3), 128: (2, 3)}
    text = markdown(result, [])
    assert "(2 of 3 seeds reached)" in text and "(3 of 3" not in text
    assert "**Seeds that missed the target**: batch 128 (1 of 3)" in text


def test_a_rule_sweep_is_fitted_to_the_tunings_target(tmp_path):
    # A sweep on disk whose steps to any accuracy follow S = S_min (1 + 300 / B): its row of the
    # four estimates is the same fit, to the tuning's target.
    for n, run in enumerate(known_b_crit_runs(b_crit=300, top=0.95, batches=(32, 64, 128, 256, 512))):
        job = tmp_path / "rule" / f"{n}_{n}"
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(run["overrides"]))
        (job / "summary.json").write_text(json.dumps(run["summary"]))
        (job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run["records"]))
    found = estimates(analyse(tuning(), [], TARGET), [], tmp_path / "rule", None)
    [(value, how)] = [(v, h) for what, v, h in found if what == "a sweep with the LR scaled by a rule"]
    assert float(value.replace(",", "")) == pytest.approx(300, rel=0.05)
    assert how == f"the same fit, to the same target (val_acc >= {100 * TARGET:g} %)"


def test_the_branch_stage_beside_the_tuned_curve_is_the_one_nearest_its_samples():
    def stage(at, batch, bound="="):
        return Stage(at, 8192, {}, BranchedCritical(batch, bound), [], {}, {})

    found = [stage(0, 32, "<="), stage(1024, 32, "<="), stage(4096, 64), stage(16384, 128), stage(61440, None, "none")]
    assert nearest_stage(found, 6000).at == 4096  # x1.5 from 4,096, x2.7 from 16,384
    assert nearest_stage(found, 12000).at == 16384
    assert nearest_stage(found, 500).at == 1024  # stage 0 counts as 1 sample: far from 500
    assert nearest_stage(found, None).at == 16384  # no fit: the last with a critical batch
    assert nearest_stage(found[-1:], 6000) is None


def test_the_search_is_quasi_random_and_a_trial_depends_on_its_number_alone():
    lrs = [trial_values(i, 0.001, 10.0, False)["lr"] for i in range(16)]
    assert all(0.001 <= lr <= 10.0 for lr in lrs) and len(set(lrs)) == 16
    assert trial_values(5, 0.001, 10.0, False) == trial_values(5, 0.001, 10.0, False)
    # Log-uniform, and spread as a Sobol sequence is: each quarter of the log range holds 4 of 16.
    quarters = [int(4 * math.log(lr / 0.001) / math.log(10.0 / 0.001)) for lr in lrs]
    assert sorted(quarters.count(q) for q in range(4)) == [4, 4, 4, 4]
    assert sobol(16, 2, 0)[:3] == sobol(3, 2, 0)  # the same points, however many are drawn
    momentum = trial_values(3, 0.001, 10.0, True)["momentum"]
    assert 0.5 <= momentum <= 0.99
    # A linear warmup's length searched too: uniform in [0, warmup_max], a Sobol dimension of its own.
    warmups = [trial_values(i, 0.001, 10.0, False, warmup_max=4.0) for i in range(16)]
    assert {w["warmup_shape"] for w in warmups} == {"linear"}
    assert sorted(int(w["warmup"]) for w in warmups) == [q for q in range(4) for _ in range(4)]
    assert [w["lr"] for w in warmups] != lrs  # other points: a search without it keeps its own (above)


def test_a_tuning_where_no_batch_reached_the_target_is_reported_so(tmp_path):
    # Every trial short of the target (a budget too small): figures that say so, not a crash
    # (log axes of nothing ended the report with matplotlib's "Data cannot be log-scaled").
    result = analyse(tuning(batches=(32, 128)), [], 1.5)
    assert result.not_reached == [32, 128] and result.fit.refused
    figures(result, tmp_path)
    assert all((tmp_path / f).stat().st_size for f in ("steps_to_result.png", "tuned_lr.png", "samples_steps.png"))
    assert "**Not reached**: no trial of batch 32, 128" in markdown(result, [])


def test_b_simple_is_the_mean_of_the_runs_that_measured_it():
    measured = points(
        [synthetic_run(64, 0, 4, lambda s: min(1.0, s / 20), lr=0.02, noise_b_simple_mean=v) for v in (300.0, 500.0)]
    )
    result = analyse(measured, [], TARGET)
    [(value, how)] = [(v, h) for what, v, h in estimates(result, measured, None, None) if what.startswith("B_simple")]
    assert value == "400" and how == "each run's mean over training (McCandlish et al. 2018)"
    [(value, how)] = [(v, h) for what, v, h in estimates(result, [], None, None) if what.startswith("B_simple")]
    assert value == "-" and how.startswith("not measured: trainer.noise_scale=always")


def test_the_evaluation_steps_the_docs_and_the_schema_state_for_eval_growth_are_the_evaluators():
    """steps-to-result.md and trainer.eval_growth's comment name the steps evaluated at growth
    0.04 (1, 2, ..., then the first that grows by 4 %): the Evaluator's own."""
    evaluator = Evaluator(every_steps=0, batch_size=1, sinks=[], growth=0.04)
    due = [step for step in range(1, 60) if evaluator.due(step, at_epoch_end=False, total=10**6)]
    assert due[:25] == list(range(1, 26)) and due[25:27] == [26, 28]
    stated = {
        "docs/steps-to-result.md": (ROOT / "docs" / "steps-to-result.md").read_text(),
        "bsexp/config/schema.py": (ROOT / "bsexp" / "config" / "schema.py").read_text(),
    }
    for where, text in stated.items():
        tail = re.search(r"0\.04`?: 1, 2, \.\.\., ([\d, ]+), \.\.\.", text)
        assert tail, where
        steps = [int(n) for n in tail.group(1).split(",")]
        assert steps == due[due.index(steps[0]) : due.index(steps[0]) + len(steps)], (where, steps, due)
