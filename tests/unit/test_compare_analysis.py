"""A comparison's analysis on runs made up for it (bsexp.report.compare): each arm's best chosen on
the tuning seeds by the declared objective; the baseline at each rung chosen on the tuning seeds,
never on the held-out seeds it is held against; ratios over the seeds both reached a rung on; no
verdict where too few seeds reach it; rungs reached with a decayed LR counted, and the batch they were
reached at; the frontier fitted."""

import csv

import pytest

from bsexp.report.compare.analysis import analyse
from bsexp.report.compare.intervals import ratio_of_means
from bsexp.report.compare.load import Run
from bsexp.report.compare.plan import Plan
from bsexp.report.compare.render import batch_text, markdown, write_csv

SPACE = {"optimizer.lr": {"low": 0.01, "high": 1.0, "scale": "log", "type": "float"}}
ARMS = {
    "fixed_32": {"overrides": ["batch.size=32"], "space": {}, "baseline": True, "self_tuning": False},
    "fixed_64": {"overrides": ["batch.size=64"], "space": {}, "baseline": True, "self_tuning": False},
    "fixed_128": {"overrides": ["batch.size=128"], "space": {}, "baseline": True, "self_tuning": False},
    "growing": {"overrides": ["batch=adaptive"], "space": {}, "baseline": False, "self_tuning": False},
    "own": {"overrides": ["batch=adaptive"], "space": {}, "baseline": False, "self_tuning": True},
}


def plan(**changes):
    comparison = {
        "arms": ARMS,
        "space": SPACE,
        "trials": 2,
        "refine": 0,
        "refine_factor": 1.5,
        "refine_width": 0.2,
        "objective": "steps",
        "select_rung": None,
        "tuning_seeds": [0],
        "held_out": 4,
        "margin": 0.01,
        "min_reached": 0.75,
        "search_seed": 0,
    } | changes
    return Plan("made_up", comparison, (0.5, 0.9), "val_acc", True, 10.0)


def reaches(steps_by_rung, batch, lr=0.1, peak=0.1):
    return {r: {"step": s, "samples": s * batch, "lr": lr, "lr_peak": peak} for r, s in steps_by_rung.items() if s}


def run(arm, stage, seed, steps, batch, trial=None, final=0.9, **lr):
    return Run(arm, stage, trial, seed, "completed", f"{arm}-{stage}-{trial}-{seed}", batch=batch,
               reaches=reaches(steps, batch, **lr), final=final, best=final)  # fmt: skip


def tuning(arm, batch, trials):
    """The search's runs of an arm on tuning seed 0: trial -> (steps to 0.5, steps to 0.9)."""
    return [run(arm, "search", 0, {"0.5": a, "0.9": b}, batch, trial=t) for t, (a, b) in trials.items()]


def held(arm, batch, steps, **kw):
    """Held-out seeds 1..4: steps to 0.9 per seed (None: not reached), 0.5 at half of it."""
    return [run(arm, "held_out", s, {"0.5": x and x / 2, "0.9": x}, batch, **kw) for s, x in zip((1, 2, 3, 4), steps)]


RUNS = [
    # On the tuning seed: trial 1 is each fixed batch's best; fixed_64 is the fastest to 0.9 (100 steps).
    *tuning("fixed_32", 32, {0: (90, 300), 1: (70, 200)}),
    *tuning("fixed_64", 64, {0: (60, None), 1: (40, 100)}),
    *tuning("fixed_128", 128, {0: (50, 150), 1: (45, 130)}),
    *tuning("growing", 32, {0: (30, 80), 1: (35, None)}),
    # On the held-out seeds fixed_128 is faster than fixed_64: it must not become the baseline.
    *held("fixed_32", 32, [210, 190, 205, 195]),
    *held("fixed_64", 64, [110, 90, 100, 105]),
    *held("fixed_128", 128, [60, 70, 65, 62]),
    *held("growing", 32, [80, 70, None, 75], lr=0.04, peak=0.1),  # reached with the LR below half its peak
    *held("own", 32, [None, 300, None, None]),
]


def test_each_arms_best_and_the_baseline_are_chosen_on_the_tuning_seeds():
    result = analyse(plan(), RUNS, {})
    assert {arm: (c.stage, c.trial) for arm, c in result.best.items()} == {
        "fixed_32": ("search", 1),
        "fixed_64": ("search", 1),
        "fixed_128": ("search", 1),
        "growing": ("search", 0),  # trial 1 never reached the top rung
    }
    assert result.best["growing"].objective(result.plan) == 80
    assert "own" not in result.best  # self-tuning: no trials
    # The fastest on the tuning seed at 0.9 is fixed_64, at 0.5 fixed_64 too (40 steps).
    assert result.baselines == {"0.5": "fixed_64", "0.9": "fixed_64"}


def test_the_ratios_are_over_the_seeds_both_reached_with_verdicts_and_too_few_seeds_give_none():
    result = analyse(plan(), RUNS, {})
    rows = {(v.arm, v.rung): v for v in result.versus}
    growing = rows[("growing", "0.9")]
    assert (growing.reached, growing.base_reached, growing.pairs) == (3, 4, 3)
    expected = ratio_of_means([80, 70, 75], [110, 90, 105])
    assert growing.steps_ratio == expected and growing.verdict(expected) == "fewer"
    assert growing.samples_ratio.estimate == pytest.approx((225 * 32) / (305 * 64))
    assert growing.decayed == 3  # every seed that reached it did with its LR below half its peak
    fixed_128 = rows[("fixed_128", "0.9")]
    assert fixed_128.verdict(fixed_128.steps_ratio) == "fewer"  # held-out figures, baseline from tuning
    own = rows[("own", "0.9")]
    assert own.steps_ratio is None and own.why_none.startswith("too few seeds reach it (the arm 1, the baseline 4 of 4")
    assert rows[("fixed_64", "0.9")].why_none == "the baseline"


def test_the_batch_each_seed_reached_a_rung_at_says_whether_the_arm_had_changed_it(tmp_path):
    """An adaptive arm that reached the low rung at its start batch on every seed reads `= start`
    (up to there it was a fixed batch with its own tuning); at the top rung two of its three seeds
    had grown it. The table and compare.csv say so; a fixed arm without the record reads `-`."""
    grown = {1: 32, 2: 64, 4: 48}  # seed -> the batch at 0.9 (seed 3 never reached it)
    growing = []
    for seed, steps in zip((1, 2, 3, 4), [80, 70, None, 75]):
        at = {"0.5": {"step": 30, "samples": 960, "lr": 0.1, "lr_peak": 0.1, "batch": 32}}
        if steps:
            at["0.9"] = {"step": steps, "samples": steps * 40, "lr": 0.1, "lr_peak": 0.1, "batch": grown[seed]}
        growing.append(Run("growing", "held_out", None, seed, "completed", f"g{seed}", batch=32, reaches=at, final=0.9))
    runs = [r for r in RUNS if not (r.arm == "growing" and r.stage == "held_out")] + growing
    result = analyse(plan(), runs, {})
    rows = {(v.arm, v.rung): v for v in result.versus}
    low, top = rows[("growing", "0.5")], rows[("growing", "0.9")]
    assert (low.batches, low.changed, batch_text(low)) == ((32, 32), 0, "32 = start")
    assert (top.batches, top.changed, batch_text(top)) == ((32, 64), 2, "32–64, 2 of 3 changed")
    assert rows[("fixed_64", "0.9")].batches is None and batch_text(rows[("fixed_64", "0.9")]) == "-"
    table = markdown(result, tmp_path)
    assert "| LR < ½ peak | batch at the rung |" in table and "| 32–64, 2 of 3 changed |" in table
    write_csv(result, tmp_path / "compare.csv")
    with open(tmp_path / "compare.csv", newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["arm"] == "growing" and r["rung"] == "0.9")
    assert (row["batch_at_rung_low"], row["batch_at_rung_high"], row["batch_changed_seeds"]) == ("32", "64", "2")


def test_a_baseline_that_falls_short_on_the_held_out_seeds_is_said_with_what_chooses_more_sturdily(tmp_path):
    """The baseline is chosen on the tuning seed; where it then reaches the rung on too few held-out
    seeds no arm has a verdict, and the report says why and names comparison.tuning_seeds."""
    assert "No verdict at this rung" not in markdown(analyse(plan(), RUNS, {}), tmp_path)
    short = [r for r in RUNS if not (r.arm == "fixed_64" and r.stage == "held_out")]
    # The baseline at 0.9 reaches it on 2 of 4 held-out seeds; at 0.5 (also fixed_64) on all 4.
    short += [
        run("fixed_64", "held_out", s, {"0.5": 50, "0.9": x}, 64) for s, x in zip((1, 2, 3, 4), [110, None, None, 105])
    ]
    table = markdown(analyse(plan(), short, {}), tmp_path)
    top = table[table.index("### val_acc >= 90 %") :]
    assert "**No verdict at this rung**: its baseline, fixed_64, reached it on 2 of 4 held-out seeds" in top
    assert "(a verdict needs 3)" in top and "`comparison.tuning_seeds=[0,1,2]`" in top
    below = table[table.index("### val_acc >= 50 %") : table.index("### val_acc >= 90 %")]
    assert "No verdict at this rung" not in below  # at 0.5 it reached it on all 4


def test_a_higher_bar_for_reaching_withholds_the_verdict():
    result = analyse(plan(min_reached=1.0), RUNS, {})
    growing = next(v for v in result.versus if v.arm == "growing" and v.rung == "0.9")
    assert growing.steps_ratio is None and "a verdict needs 4 each" in growing.why_none


def test_the_final_values_against_the_margin_and_the_frontier_through_the_fixed_batches():
    runs = [r for r in RUNS if r.arm != "own"]
    result = analyse(plan(), runs, {})
    finals = {f.arm: f for f in result.finals}
    assert finals["growing"].difference.estimate == pytest.approx(0.0) and finals["growing"].verdict == "non-inferior"
    top = result.frontiers[-1]
    assert [p[1] for p in top.points] == [32, 64, 128]
    assert top.points[1][2:4] == pytest.approx((101.25, 101.25 * 64))
    assert top.fit is not None and not top.fit.refused
    assert top.intervals["B_crit"].low <= top.fit.b_crit <= top.intervals["B_crit"].high


def test_the_objective_final_chooses_by_the_final_value_on_the_tuning_seeds():
    runs = [
        run("fixed_32", "search", 0, {"0.5": 10, "0.9": 100}, 32, trial=0, final=0.95),
        run("fixed_32", "search", 0, {"0.5": 10, "0.9": 50}, 32, trial=1, final=0.93),
    ]
    result = analyse(plan(objective="final"), runs, {})
    assert result.best["fixed_32"].trial == 0 and result.baselines["0.9"] == "fixed_32"


def test_a_loss_ladder_is_read_lower_better_in_the_choice_the_finals_and_the_margin():
    """A language model's comparison (trainer.ladder_metric=val_loss, rungs falling): the best
    final value is the lowest, and an arm whose final loss is higher is worse, not better."""
    loss_plan = Plan("lm", plan(objective="final").comparison, (2.0, 1.5), "val_loss", False, 10.0)
    runs = [
        run("fixed_32", "search", 0, {"2.0": 10, "1.5": 100}, 32, trial=0, final=1.40),
        run("fixed_32", "search", 0, {"2.0": 10, "1.5": 50}, 32, trial=1, final=1.30),
        run("growing", "search", 0, {"2.0": 8, "1.5": 40}, 32, trial=0, final=1.32),
        *(run("fixed_32", "held_out", s, {"2.0": 10, "1.5": 60}, 32, final=1.30 + 0.001 * s) for s in (1, 2, 3, 4)),
        *(run("growing", "held_out", s, {"2.0": 8, "1.5": 45}, 32, final=1.40 + 0.001 * s) for s in (1, 2, 3, 4)),
    ]
    result = analyse(loss_plan, runs, {})
    assert result.best["fixed_32"].trial == 1  # 1.30 nats, not 1.40
    growing = next(f for f in result.finals if f.arm == "growing")
    assert growing.difference.estimate == pytest.approx(-0.10)  # 0.10 nats worse, in the direction of better
    assert growing.verdict == "inferior"  # its whole interval below -margin (0.01)
    steps = next(v for v in result.versus if v.arm == "growing" and v.rung == "1.5")
    assert steps.steps_ratio.estimate == pytest.approx(45 / 60) and steps.verdict(steps.steps_ratio) == "fewer"


def test_against_an_arm_named_after_the_runs_reads_every_rung_and_the_final_against_it_and_says_post_hoc(tmp_path):
    """--against: a reader who saw that the declared baseline reached a rung on too few held-out
    seeds holds every arm against another one, at every rung and in the final value; the report says
    the choice is post hoc and gives no 'no verdict at this rung' advice about a baseline it did not use."""
    short = [r for r in RUNS if not (r.arm == "fixed_64" and r.stage == "held_out")]
    short += [
        run("fixed_64", "held_out", s, {"0.5": 50, "0.9": x}, 64) for s, x in zip((1, 2, 3, 4), [110, None, None, 105])
    ]
    declared = analyse(plan(), short, {})
    assert declared.baselines == {"0.5": "fixed_64", "0.9": "fixed_64"} and declared.against is None
    result = analyse(plan(), short, {}, against="fixed_128")
    assert result.baselines == {"0.5": "fixed_128", "0.9": "fixed_128"}
    assert {v.baseline for v in result.versus} == {"fixed_128"}
    rows = {(v.arm, v.rung): v for v in result.versus}
    # growing reached 0.9 on seeds 1, 2, 4; fixed_128 on all four: the pairs are 1, 2, 4.
    assert rows[("growing", "0.9")].steps_ratio == ratio_of_means([80, 70, 75], [60, 70, 62])
    assert rows[("fixed_32", "0.5")].steps_ratio == ratio_of_means([105, 95, 102.5, 97.5], [30, 35, 32.5, 31])
    assert rows[("fixed_128", "0.9")].why_none == "the baseline"
    assert rows[("fixed_64", "0.9")].why_none.startswith("too few seeds reach it (the arm 2, the baseline 4 of 4")
    assert {f.arm for f in result.finals if f.why_none == "the baseline"} == {"fixed_128"}
    # The tuning's choices and the frontier are the declared analysis's, unchanged.
    assert {a: (c.stage, c.trial) for a, c in result.best.items()} == {
        a: (c.stage, c.trial) for a, c in declared.best.items()
    }
    assert [f.points for f in result.frontiers] == [f.points for f in declared.frontiers]
    table = markdown(result, tmp_path)
    assert (
        "**Post hoc: every arm against fixed_128**" in table
        and "### val_acc >= 90 %: against fixed_128 (post hoc)" in table
    )
    assert "No verdict at this rung" not in table and "Against fixed_128 (named after the runs: post hoc)" in table
    assert "No verdict at this rung" in markdown(declared, tmp_path)  # the declared report says it
    with pytest.raises(
        ValueError, match=r"^--against=fixed_99: not an arm of comparison made_up; its arms: fixed_32, "
    ):
        analyse(plan(), RUNS, {}, against="fixed_99")
