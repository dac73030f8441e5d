"""scripts/noise_by_rung.py on a real sweep: B_simple up to each rung, weighted by the progress of
each stretch between two records, computed here again from the runs' own metrics.jsonl; and the
fit's B_crit, the comparison report's own."""

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY_RUN, cli_env

SCRIPT = Path(__file__).parents[2] / "scripts" / "noise_by_rung.py"


def by_hand(records, step) -> float | None:
    """sum w tr(Sigma) / sum w |G|^2 over the records up to `step`, w the training loss's fall; None
    where the weighted |G|^2 is not positive (its estimate is unbiased, so it can fall below 0)."""
    trace = grad = 0.0
    before = math.log(10)
    for r in records:
        if r["step"] > math.ceil(step):
            break
        if r.get("noise/trace_sigma_raw") is not None and r.get("noise/grad_sq_raw") is not None:
            w = max(before - r["train_loss"], 0.0)
            trace += w * r["noise/trace_sigma_raw"]
            grad += w * r["noise/grad_sq_raw"]
        before = r["train_loss"]
    return trace / grad if grad > 0 else None


@pytest.mark.slow  # nine tiny runs: 30-60 s on 2 cores
def test_b_simple_up_to_each_rung_is_the_progress_weighted_ratio_of_the_runs_own_estimates(
    data_root, tmp_path, run_cli
):
    sweep = tmp_path / "sweep"
    args = [*TINY_RUN, "epochs=3", "batch.size=16,32,64", "seed=1,2,3", "trainer.noise_scale=always"]
    args += ["trainer.eval_growth=0.2", "trainer.ladder=[0.2,0.3]", "trainer.threads=1", f"hydra.sweep.dir={sweep}"]
    done = run_cli("-m", *args, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    made = subprocess.run(
        [sys.executable, str(SCRIPT), str(sweep)], env=cli_env(data_root), capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    rows = {r["rung"]: r for r in csv.DictReader((sweep / "noise_by_rung.csv").open())}
    assert set(rows) == {"0.2", "0.3"}
    runs = {}
    for job in sweep.glob("*/summary.json"):
        summary = json.loads(job.read_text())
        records = [json.loads(line) for line in (job.parent / "metrics.jsonl").open()]
        runs[(summary["batch_size"], summary["seed"])] = (summary, records)
    checked = 0
    for rung, row in rows.items():
        for batch in (16, 32, 64):
            found = [
                by_hand(records, summary["ladder"][rung]["step"])
                for (b, _), (summary, records) in runs.items()
                if b == batch and rung in (summary["ladder"] or {})
            ]
            values = [v for v in found if v is not None]
            assert int(row[f"fixed_{batch}_seeds"]) == len(values)
            if values:
                assert float(row[f"fixed_{batch}"]) == pytest.approx(np.mean(values), rel=1e-9)
                checked += 1
            else:
                assert row[f"fixed_{batch}"] == ""
    assert checked >= 3
    assert "| 0.2 | " in made.stdout and "B_simple up to each rung (progress-weighted)" in made.stdout

    # --against itself: the paired ratio of a fit to itself is 1 on every resample (the ratio's
    # arithmetic on fits that hold: tests/unit/test_noise_by_rung_against.py); --out leaves the
    # first CSV as it was; a sweep with no completed run is one line naming --against, exit 2
    def script(*args):
        return subprocess.run(
            [sys.executable, str(SCRIPT), *args], env=cli_env(data_root), capture_output=True, text=True
        )

    written = (sweep / "noise_by_rung.csv").read_bytes()
    out = tmp_path / "against.csv"
    paired = script(str(sweep), "--against", str(sweep), "--out", str(out))
    assert paired.returncode == 0, paired.stderr
    assert (sweep / "noise_by_rung.csv").read_bytes() == written
    for row in csv.DictReader(out.open()):
        assert row["B_crit_fit"] == rows[row["rung"]]["B_crit_fit"]
        if row["B_crit_fit"]:
            assert float(row["fit_ratio"]) == float(row["fit_ratio_low"]) == float(row["fit_ratio_high"]) == 1.0
            assert row["fit_agree"] == "agree" and float(row["against_B_crit"]) == float(row["B_crit_fit"])
        else:  # a refused fit (this tiny sweep's, where fewer than 3 batches reach a rung on every seed): no ratio
            assert row["fit_ratio"] == row["fit_agree"] == row["against_B_crit"] == ""
    (tmp_path / "empty").mkdir()
    refused = script(str(sweep), "--against", str(tmp_path / "empty"))
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "--against" in refused.stderr and "Traceback" not in refused.stderr
    nowhere = script(str(sweep), "--out", str(tmp_path / "missing" / "x.csv"))
    assert nowhere.returncode == 2 and nowhere.stderr.count("\n") == 1 and "--out" in nowhere.stderr
    assert (sweep / "noise_by_rung.csv").read_bytes() == written
