"""A comparison through the CLI (python -m bsexp.tune DIR comparison=NAME), at a tiny budget: a fixed
batch and batch=adaptive, 4 trials each and 1 around the best, through Hydra's joblib launcher,
killed once and continued by the same command; then the report's best trials, ratios, intervals and
verdict words checked against values computed from the runs' own summary.json files. And bad input
to the command: one line, exit 2, nothing written."""

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import bootstrap

from bsexp import api
from bsexp.report.compare.plan import Plan
from bsexp.runs.search_space import arm_space, trial_values
from conftest import cli_env

COMPARISON = """# @package _global_
epochs: 3
scaling: {lr_rule: none, wd_rule: none}
schedule: {main: constant, warmup_shape: none}
trainer: {eval_growth: 0.2, ladder: [0.25, 0.3, 0.4], ladder_stop: true, progress: false}
comparison:
  trials: 4
  refine: 1
  held_out: 3
  select_rung: 0.3
  space:
    optimizer.lr: {low: 0.03, high: 0.3}
  arms:
    fixed_32: {overrides: [batch=fixed, batch.size=32], baseline: true}
    adaptive:
      overrides: [batch=adaptive, batch.find_micro_size=false, batch.adaptive.interval=5]
      space:
        batch.adaptive.c: {low: 0.5, high: 2.0, scale: log}
"""
SHIPPED = sorted(p.stem for p in (Path(__file__).parents[2] / "bsexp" / "conf" / "comparison").glob("*.yaml"))
SCRIPTS = Path(__file__).parents[2] / "scripts"
TINY = ["data.num_samples=600", "data.val_size=100", "model.width=8", "logger=none", "trainer.threads=1"]


def comparison(tmp_path, text=COMPARISON, name="two_arms"):
    (tmp_path / "conf" / "comparison").mkdir(parents=True, exist_ok=True)
    (tmp_path / "conf" / "comparison" / f"{name}.yaml").write_text(text)
    return [f"comparison={name}", f"hydra.searchpath=[file://{tmp_path / 'conf'}]"]


def tune(data_root, cwd, args, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-m", "bsexp.tune", *args],
        cwd=cwd,
        env=cli_env(data_root),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def killed_after(proc, folder, pattern, count, timeout):
    """SIGKILL the process group of `proc` once `count` files match `pattern` in `folder`."""
    deadline = time.time() + timeout
    while len(list(folder.glob(pattern))) < count:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def summaries(folder):
    return {p.parent.name: json.loads(p.read_text()) for p in folder.glob("*/summary.json")}


def paired_interval(arm, base):
    """The ratio of means over paired seeds and its 95 % paired bootstrap (BCa; percentile where BCa
    is undefined), as the protocol states it, computed here from the runs' own numbers."""
    ratio = lambda x, y, axis=-1: np.mean(x, axis=axis) / np.mean(y, axis=axis)  # noqa: E731
    for method in ("BCa", "percentile"):
        ci = bootstrap(
            (np.asarray(arm), np.asarray(base)),
            ratio,
            paired=True,
            vectorized=True,
            n_resamples=9999,
            confidence_level=0.95,
            method=method,
            rng=np.random.default_rng(0),
        ).confidence_interval
        if math.isfinite(ci.low) and math.isfinite(ci.high):
            return ratio(np.asarray(arm), np.asarray(base)), ci.low, ci.high
    return ratio(np.asarray(arm), np.asarray(base)), ratio(arm, base), ratio(arm, base)


def best_by_steps(runs, rung):
    """The run with the fewest steps to `rung` by its own summary (the selection's objective)."""
    reached = [r for r in runs if rung in (r["summary"]["ladder"] or {})]
    return min(reached, key=lambda r: r["summary"]["ladder"][rung]["step"])


@pytest.mark.slow  # about 3-6 minutes on 2 busy cores: scripts/test_slow.sh runs it
def test_two_arms_tuned_alike_killed_and_continued_and_the_report_from_the_runs_own_files(data_root, tmp_path):
    out = tmp_path / "cmp"
    args = [str(out), *comparison(tmp_path), *TINY, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    killed_after(tune(data_root, tmp_path, args, start_new_session=True), out / "search", "*/*/summary.json", 2, 900)
    done = {p: p.stat().st_mtime_ns for p in (out / "search").glob("*/*/summary.json")}
    assert done and len(done) < 8
    # Another command in its directory is refused, not taken as the same.
    refused = tune(data_root, tmp_path, [*args, "epochs=4"])
    _, stderr = refused.communicate(timeout=300)
    assert refused.returncode == 2 and len(stderr.splitlines()) == 1, stderr
    assert stderr.startswith("error: comparison=two_arms: the comparison in") and "another epochs" in stderr
    proc = tune(data_root, tmp_path, args)  # the same command: continued
    _, stderr = proc.communicate(timeout=1800)
    assert proc.returncode == 0, stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in done} == done  # the runs that had finished were not run again
    _check_stages_and_best(out)
    _check_report(out)
    _check_final_against(out)


# An adaptive arm that searches its start batch (batch.size=${bsexp_tuned:batch.size}), searched
# first; two trials, so a search stopped after its first has a finished point to continue past.
BATCH_SEARCHED = """# @package _global_
epochs: 1
scaling: {lr_rule: none, wd_rule: none}
schedule: {main: constant, warmup_shape: none}
trainer: {eval_growth: 0.2, ladder: [0.25, 0.3], ladder_stop: true, progress: false}
comparison:
  trials: 2
  refine: 0
  held_out: 0
  select_rung: 0.3
  space:
    optimizer.lr: {low: 0.03, high: 0.3}
  arms:
    adaptive:
      overrides: [batch=adaptive, batch.find_micro_size=false, batch.adaptive.interval=5]
      space:
        batch.size: {low: 16, high: 64, scale: log, type: int}
    fixed_32: {overrides: [batch=fixed, batch.size=32], baseline: true}
"""


@pytest.mark.slow  # 36-53 s on 2 busy cores: scripts/test_slow.sh runs it
def test_a_comparison_killed_after_a_point_that_searches_its_batch_continues_its_own_runs(data_root, tmp_path):
    """The same command continues a comparison killed after the first point of an arm that
    searches batch.size: each point is checked against its own run with its own trial's values.
    The sweep's preflight once read its overrides resolved in the sweep's config, where every point
    was trial 0's: it refused this continuation (batch.size=58 differs from the run being resumed,
    which has batch.size=${bsexp_tuned:batch.size}), and, where a point's directory name holds its
    searched values (the baseline's, short), looked for the point elsewhere and did not check it:
    the edited comparison below resumed its runs, the change taken unasked."""
    out = tmp_path / "cmp"
    args = [str(out), *comparison(tmp_path, BATCH_SEARCHED, "batch_searched"), *TINY]
    killed_after(
        tune(data_root, tmp_path, args, start_new_session=True), out / "search" / "adaptive", "*/summary.json", 1, 300
    )
    done = {p: p.stat().st_mtime_ns for p in (out / "search").glob("*/*/summary.json")}
    assert len(done) == 1
    proc = tune(data_root, tmp_path, args)  # the same command: continued
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in done} == done  # the point that had finished was not run again
    search = summaries(out / "search" / "adaptive")
    assert len(search) == 2 and {s["status"] for s in search.values()} == {"completed"}
    # Each trial trained from its own values as the search draws them (not trial 0's for both).
    declared = Plan.read(out).comparison
    for name, summary in search.items():
        drawn = trial_values(arm_space(declared, "adaptive"), int(name.split("_")[0]), declared["search_seed"])
        first = json.loads((out / "search" / "adaptive" / name / "metrics.jsonl").read_text().splitlines()[0])
        assert (first["batch_size"], summary["lr"]) == (drawn["batch.size"], pytest.approx(drawn["optimizer.lr"]))
    # A real change is still refused, in one line before any point runs again: the baseline's search
    # continued after the shared space was edited (its runs drew their LR from another range).
    conf = tmp_path / "conf" / "comparison" / "batch_searched.yaml"
    conf.write_text(BATCH_SEARCHED.replace("high: 0.3", "high: 0.4"))
    ended = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    sweep = [sys.executable, "-m", "bsexp.train", "-m", "resume=auto", f"hydra.sweep.dir={out / 'search' / 'fixed_32'}"]
    edited = subprocess.run(sweep, cwd=tmp_path, env=cli_env(data_root), capture_output=True, text=True)
    assert edited.returncode == 2 and edited.stderr.startswith(
        "error: sweep point 0 (tune.trial=0): comparison.space.optimizer.lr.high=0.4: differs from the run being "
        "resumed, which has comparison.space.optimizer.lr.high=0.3;"
    ), edited.stderr[-2000:]
    assert len(edited.stderr.splitlines()) == 1
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == ended  # nothing written


# A fixed batch searched past the data: trial 0 draws batch 807 of 380 training samples, which the run
# refuses at its start (trials 1-3: 57, 249, 99).
PAST_THE_DATA = """# @package _global_
epochs: 1
scaling: {lr_rule: none, wd_rule: none}
schedule: {main: constant, warmup_shape: none}
trainer: {eval_growth: 0.2, ladder: [0.2, 0.25], ladder_stop: true, progress: false}
comparison:
  trials: 4
  refine: 0
  held_out: 2
  select_rung: 0.25
  space:
    optimizer.lr: {low: 0.03, high: 0.3}
  arms:
    fixed: {overrides: [batch=fixed], baseline: true, space: {batch.size: {low: 32, high: 1024, scale: log, type: int}}}
"""


@pytest.mark.slow  # six short runs and a refusal, one after another: 40-80 s on 2 cores
def test_a_trial_whose_values_the_run_refuses_is_a_result_of_the_search_not_the_end_of_the_comparison(
    data_root, tmp_path
):
    """A trial the space allows but the run refuses (its batch past the training set) ended the
    whole comparison with exit code 2, and the same command again ran it and stopped again: it is
    recorded as refused, the comparison goes on to choose among the others and rerun the best, and
    the report counts it."""
    out = tmp_path / "cmp"
    args = [str(out), *comparison(tmp_path, PAST_THE_DATA, "past_the_data"), *TINY]
    proc = tune(data_root, tmp_path, args)
    _, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    declared = Plan.read(out).comparison
    drawn = {t: trial_values(arm_space(declared, "fixed"), t, declared["search_seed"]) for t in range(4)}
    index = list(map(json.loads, (out / "search" / "fixed" / "jobs.jsonl").open()))
    trial = lambda e: next(int(o.split("=")[1]) for o in e["overrides"] if o.startswith("tune.trial="))  # noqa: E731
    statuses = {trial(e): e["status"] for e in index}
    assert statuses == {t: "refused" if v["batch.size"] > 380 else "completed" for t, v in drawn.items()}
    assert "refused" in statuses.values() and "completed" in statuses.values()
    assert "exceeds the 380 training samples" in " ".join(e.get("error") or "" for e in index)
    assert "refused their values" in stderr
    best = json.loads((out / "best.json").read_text())["fixed"]
    assert drawn[best["trial"]]["batch.size"] <= 380
    held = summaries(out / "held_out" / "fixed")
    assert len(held) == 2 and {s["batch_size"] for s in held.values()} == {drawn[best["trial"]]["batch.size"]}
    assert "4 trials (4 + 0 declared), 1 refused their values" in (out / "compare.md").read_text()
    # The same command again: nothing left to run, the refused trial not tried again.
    before = (out / "search" / "fixed" / "jobs.jsonl").read_text()
    again = tune(data_root, tmp_path, args)
    _, stderr = again.communicate(timeout=600)
    assert again.returncode == 0, stderr[-3000:]
    assert (out / "search" / "fixed" / "jobs.jsonl").read_text() == before


# A GPT comparison: a fixed batch against a batch warmup at sequences seen, to a loss ladder.
LM_WARMUP = """# @package _global_
epochs: 2
scaling: {lr_rule: none, wd_rule: none}
schedule: {main: constant, warmup_shape: none}
trainer: {eval_every_steps: 4, ladder: [4.5, 3.5], ladder_metric: val_loss, ladder_stop: false, progress: false}
comparison:
  trials: 2
  refine: 0
  held_out: 2
  select_rung: 3.5
  margin: 0.05
  space:
    optimizer.lr: {low: 0.005, high: 0.02}
  arms:
    fixed_32: {overrides: [batch=fixed, batch.size=32], baseline: true}
    warmup:
      overrides: [batch=scheduled, batch.size=16, batch.schedule.kind=list, batch.schedule.unit=samples,
                  'batch.schedule.points=[[0,16],[256,64]]']
"""
TINY_GPT = ["model=gpt", "data=text", "data.train_tokens=8192", "data.val_size=64", "model.width=32", "model.heads=2"]


@pytest.mark.slow  # eight GPT runs of 2 epochs: about a minute on 2 cores
def test_a_language_models_comparison_counts_tokens_and_its_warmup_grows_at_sequences_seen(data_root, tmp_path):
    out = tmp_path / "cmp"
    args = [str(out), *comparison(tmp_path, LM_WARMUP, "tiny_lm_warmup"), *TINY_GPT, "logger=none", "trainer.threads=1"]
    proc = tune(data_root, tmp_path, args)
    _, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    for run in (out / "held_out" / "warmup").glob("*/metrics.jsonl"):  # 512 sequences an epoch: 16 steps of 16, then 64
        steps = [r for r in map(json.loads, run.open()) if "batch_size" in r]
        assert {(r["batch_size"], r["samples_seen"] <= 256) for r in steps} == {(16, True), (64, False)}
        assert steps[-1]["samples_seen"] == 2 * 512
    rows = list(csv.DictReader((out / "compare.csv").open()))
    with_samples = [r for r in rows if r["samples"]]
    assert with_samples and all(float(r["tokens"]) == pytest.approx(16 * float(r["samples"])) for r in with_samples)
    assert all(not r["tokens"] for r in rows if not r["samples"])
    text = (out / "compare.md").read_text()
    assert "A sample is a sequence of 16 tokens: `tokens` = samples × 16." in text
    assert "| arm | reached | steps | samples | tokens | steps ratio |" in text and "val_loss <= 3.5" in text
    # Each fixed batch's tuned LR, as a file tune.best reads (the branches at their tuned LR: docs: Branches)
    lrs = out / "lr_by_batch.json"
    made = subprocess.run(
        [sys.executable, str(SCRIPTS / "tuned_lrs.py"), str(out), str(lrs)], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    best = json.loads((out / "best.json").read_text())
    lr = best["fixed_32"]["values"]["optimizer.lr"]
    assert json.loads(lrs.read_text()) == {"32": {"lr": lr, "arm": "fixed_32", "optimizer.lr": lr}}


def _check_stages_and_best(out):
    for arm in ("fixed_32", "adaptive"):
        search, refine, held = (summaries(out / stage / arm) for stage in ("search", "refine", "held_out"))
        assert (len(search), len(refine), len(held)) == (4, 1, 3)
        assert {s["seed"] for s in search.values()} == {0} and {s["seed"] for s in held.values()} == {1, 2, 3}
        best = json.loads((out / "best.json").read_text())[arm]
        runs = [{"stage": "search", "dir": d, "summary": s} for d, s in search.items()]
        runs += [{"stage": "refine", "dir": d, "summary": s} for d, s in refine.items()]
        fewest = best_by_steps(runs, "0.3")
        assert (best["stage"], best["runs"]) == (fewest["stage"], [fewest["dir"]])
        # The best trial's LR, and every held-out run trained with it (given as it is, not resolved).
        assert best["values"]["optimizer.lr"] == pytest.approx(fewest["summary"]["lr"])
        assert all(s["lr"] == pytest.approx(best["values"]["optimizer.lr"]) for s in held.values())
    # Four distinct points of the search, within its range.
    lrs = sorted(s["lr"] for s in summaries(out / "search" / "fixed_32").values())
    assert len(set(lrs)) == 4 and 0.03 <= lrs[0] and lrs[-1] <= 0.3
    # The same comparison from Python (bsexp.api): every run, by stage and arm, its searched values resolved.
    rows = api.points(out)
    assert len(rows) == 16 and {(r["stage"], r["arm"]) for r in rows} == {
        (stage, arm) for stage in ("search", "refine", "held_out") for arm in ("fixed_32", "adaptive")
    }
    assert all(r["optimizer.lr"] == pytest.approx(r["lr"]) for r in rows if r["arm"] == "fixed_32")


def _check_final_against(out):
    """scripts/final_against.py holds every arm against the arms named: against the report's baseline
    (fixed_32) the report's own final difference and interval; against the other arm, the same
    mirrored; each arm's mean final value, test accuracy and training loss from its held-out runs."""
    made = subprocess.run(
        [sys.executable, str(SCRIPTS / "final_against.py"), str(out), "fixed_32", "adaptive"],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    report = {r["arm"]: r for r in csv.DictReader((out / "compare.csv").open()) if r["rung"] == "final"}
    rows = {r["arm"]: r for r in csv.DictReader((out / "final_against.csv").open())}
    assert set(rows) == {"fixed_32", "adaptive"} and (out / "final_against.png").stat().st_size
    ends = ("", "_low", "_high")
    theirs = [float(report["adaptive"][f"final_difference{end}"]) for end in ends]
    ours = [float(rows["adaptive"][f"vs_fixed_32{end}"]) for end in ends]
    assert ours == pytest.approx(theirs, abs=1e-12)
    assert rows["adaptive"]["vs_fixed_32_non_inferiority"] == report["adaptive"]["final_verdict"]
    mirrored = [-float(rows["fixed_32"][f"vs_adaptive{end}"]) for end in ("", "_high", "_low")]
    assert mirrored == pytest.approx(ours, abs=1e-9)
    for arm, row in rows.items():
        held = summaries(out / "held_out" / arm).values()
        assert int(row["seeds"]) == len(held) == 3
        assert float(row["final"]) == pytest.approx(float(report[arm]["final"]), abs=1e-12)
        assert float(row["test_acc"]) == pytest.approx(np.mean([s["test_acc"] for s in held]), abs=1e-12)
        assert float(row["train_loss"]) == pytest.approx(np.mean([s["train_loss"] for s in held]), abs=1e-12)
    words = {"better", "worse", "not distinguished"}
    assert {rows["adaptive"]["vs_fixed_32_direction"], rows["fixed_32"]["vs_adaptive_direction"]} <= words
    assert "| adaptive | 3 |" in made.stdout


def _check_report(out):
    rows = list(csv.DictReader((out / "compare.csv").open()))
    held = {arm: summaries(out / "held_out" / arm) for arm in ("fixed_32", "adaptive")}
    checked = 0
    for row in (r for r in rows if r["arm"] == "adaptive" and r["rung"] != "final"):
        best = json.loads((out / "best.json").read_text())["fixed_32"]
        chosen = summaries(out / best["stage"] / "fixed_32")[best["runs"][0]]
        if row["rung"] not in chosen["ladder"]:  # its best did not reach this rung on the tuning seed
            assert row["baseline"] == "" and row["no_verdict"].startswith("no fixed batch reached this rung")
            continue
        assert row["baseline"] == "fixed_32"
        steps = {arm: {s["seed"]: s["ladder"].get(row["rung"]) for s in runs.values()} for arm, runs in held.items()}
        pairs = sorted(s for s in (1, 2, 3) if steps["adaptive"][s] and steps["fixed_32"][s])
        assert int(row["pairs"]) == len(pairs)
        if len(pairs) < 3:
            assert row["steps_verdict"] == "" and row["no_verdict"].startswith("too few seeds reach it")
            continue
        for measure in ("steps", "samples"):
            key = "step" if measure == "steps" else "samples"
            arm = [steps["adaptive"][s][key] for s in pairs]
            base = [steps["fixed_32"][s][key] for s in pairs]
            ratio, low, high = paired_interval(arm, base)
            assert float(row[f"{measure}_ratio"]) == pytest.approx(ratio, rel=1e-9)
            assert (float(row[f"{measure}_ratio_low"]), float(row[f"{measure}_ratio_high"])) == pytest.approx(
                (low, high), rel=1e-9
            )
            word = "fewer" if high < 1 else "more" if low > 1 else "not distinguished"
            assert row[f"{measure}_verdict"] == word
        checked += 1
    assert checked >= 1  # at least the lowest rung has a verdict
    table = (out / "compare.md").read_text()
    assert "| fixed_32 | `batch=fixed` `batch.size=32` | 5 trials (4 + 1 declared) |" in table
    assert "### val_acc >= 25 %: baseline fixed_32" in table and (out / "compare_frontier.png").stat().st_size


@pytest.mark.parametrize(
    "extra, yaml_edit, line",
    [
        (
            ["comparison=nosuch"],
            None,
            # every shipped comparison, and the test's own
            "error: comparison=nosuch: unknown option; valid: " + ", ".join(sorted([*SHIPPED, "two_arms"])),
        ),
        ([], ("batch.adaptive.c", "batch.adaptive.cc"), "error: comparison.arms.adaptive="),
        (["seed=3"], None, "error: seed=3: is set by the comparison for each run"),
        ([], ("select_rung: 0.3", "select_rung: 0.35"), "error: comparison.select_rung=0.35: must be a rung"),
    ],
)
def test_bad_input_to_a_comparison_is_one_line_and_exit_2(data_root, tmp_path, extra, yaml_edit, line):
    text = COMPARISON if yaml_edit is None else COMPARISON.replace(*yaml_edit)
    args = [str(tmp_path / "cmp"), *comparison(tmp_path, text), *TINY, *extra]
    if extra[:1] == ["comparison=nosuch"]:
        args = [a for a in args if not a.startswith("comparison=two_arms")]
    command = [sys.executable, "-m", "bsexp.tune", *args]
    done = subprocess.run(command, cwd=tmp_path, env=cli_env(data_root), capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith(line) and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "cmp").exists()


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_comparison_passes_the_drivers_checks_before_any_run(name):
    """What `python -m bsexp.tune DIR comparison=NAME` checks before it writes anything: the
    declaration, and each arm's first trial composed and checked by the runs' own checks (a
    searched factor that makes a batch of 67.98 samples is refused there, not an hour in)."""
    from bsexp.tune.comparison import check_arms, declare

    plan, computes, runs_how = declare([f"comparison={name}"])
    check_arms(plan, computes, runs_how)
    assert len(plan.arms) >= 2 and any(arm.get("baseline") for arm in plan.arms.values())
    assert plan.comparison["held_out"] >= 10  # a headline's held-out seeds (docs: Comparing arms)


def test_the_report_of_a_directory_that_holds_no_comparison_is_one_line_and_exit_2(data_root, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bsexp.report.compare", str(tmp_path)],
        env=cli_env(data_root),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stderr.startswith(f"error: {tmp_path} holds no comparison"), done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_a_report_against_an_arm_named_after_the_runs_goes_apart_and_a_name_no_arm_bears_is_one_line(
    data_root, tmp_path
):
    """--against ARM: the report goes to TUNE_DIR/against_ARM, the comparison's own report untouched;
    a name that is no arm of the comparison: one line naming it and the arms, exit 2, nothing written."""
    arms = {
        "fixed_32": {"overrides": ["batch.size=32"], "baseline": True},
        "adaptive": {"overrides": ["batch=adaptive"]},
    }
    declared = {"arms": arms, "space": {}, "trials": 2, "refine": 0, "objective": "steps", "select_rung": None}
    declared |= {"tuning_seeds": [0], "held_out": 3, "margin": 0.01, "min_reached": 0.8, "search_seed": 0}
    declared |= {"refine_factor": 1.5, "refine_width": 0.2}
    ladder = {"rungs": [0.25, 0.3], "metric": "val_acc", "stop": True}
    (tmp_path / "comparison.json").write_text(
        json.dumps({"name": "two_arms", "comparison": declared, "ladder": ladder, "epochs": 3})
    )
    (tmp_path / "compare.md").write_text("the comparison's own report\n")

    def report(*args):
        command = [sys.executable, "-m", "bsexp.report.compare", str(tmp_path), *args]
        return subprocess.run(command, env=cli_env(data_root), capture_output=True, text=True)

    done = report("--against", "fixed_64")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr == "error: --against=fixed_64: not an arm of comparison two_arms; its arms: fixed_32, adaptive\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compare.md", "comparison.json"]
    done = report("--against", "adaptive")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f"report: {tmp_path / 'against_adaptive' / 'compare.md'}")
    assert (tmp_path / "compare.md").read_text() == "the comparison's own report\n"
    table = (tmp_path / "against_adaptive" / "compare.md").read_text()
    assert (
        "**Post hoc: every arm against adaptive**" in table
        and "### val_acc >= 30 %: against adaptive (post hoc)" in table
    )
