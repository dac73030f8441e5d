"""scripts/noise_by_rung.py --against: the ratio of two sweeps' fitted B_crit is paired over the
seeds — a resample draws a seed's runs in both sweeps together — so against a sweep whose every run
took twice the samples, seed by seed, the ratio is exactly 1/2 on every resample."""

import importlib.util
import math
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from bsexp.report.compare.intervals import over_seeds

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "noise_by_rung.py"
spec = importlib.util.spec_from_file_location("noise_by_rung_script", SCRIPT)
nbr = importlib.util.module_from_spec(spec)
sys.modules["noise_by_rung_script"] = nbr
spec.loader.exec_module(nbr)

BATCHES = np.array([8, 16, 32, 64, 128, 256, 512])


def sweep(seed: int, s_min=400.0, e_min=20_000.0, spread=0.15) -> np.ndarray:
    """reaches_at's table, (batches, seeds, 2) steps and samples: S = S_min + E_min / B, each seed's
    run off the curve by its own noise."""
    rng = np.random.default_rng(seed)
    steps = (s_min + e_min / BATCHES)[:, None] * np.exp(rng.normal(0, spread, (len(BATCHES), 10)))
    return np.stack([steps, steps * BATCHES[:, None]], axis=-1)


def test_a_sweep_taking_twice_the_samples_seed_by_seed_has_half_the_ratio_on_every_resample():
    this = sweep(1)
    other = this.copy()
    other[..., 1] *= 2  # every run the same steps, twice the samples: E_min and B_crit twice
    found, refused = over_seeds(10, partial(nbr.fit_ratio, this, other), ["ratio"])
    ratio = found["ratio"]
    assert refused == 0
    assert ratio.estimate == pytest.approx(0.5, rel=1e-9)
    assert ratio.low == pytest.approx(0.5, rel=1e-9) and ratio.high == pytest.approx(0.5, rel=1e-9)
    assert nbr.agreement(ratio.low, ratio.high, "higher", "lower") == "lower"


def test_a_refused_fit_in_either_sweep_is_no_ratio():
    this = sweep(1)
    flat = this.copy()
    flat[..., 0] = (100.0 + BATCHES / 10)[:, None]  # steps that rise with the batch: E_min negative, refused
    flat[..., 1] = flat[..., 0] * BATCHES[:, None]
    assert math.isnan(nbr.fit_ratio(this, flat, np.arange(10))[0])
    assert math.isnan(nbr.fit_ratio(flat, this, np.arange(10))[0])


@pytest.mark.parametrize(("low", "high", "said"), [(0.8, 1.2, "agree"), (1.1, 2.0, "higher"), (0.2, 0.9, "lower")])
def test_two_fits_agree_only_where_the_interval_of_their_ratio_covers_one(low, high, said):
    assert nbr.agreement(low, high, "higher", "lower") == said
