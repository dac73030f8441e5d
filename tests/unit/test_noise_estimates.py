"""The gradient noise scale's estimates (McCandlish et al. 2018, App. A.1) on known moments."""

import pytest
import torch

from bsexp.engine.gradient_noise import NoiseScale, estimates

# The backward hooks that count backward passes see no input gradients (the data needs none).
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")

# Logistic regression (no hidden layer) on overlapping Gaussian classes, with an LR so small that
# the parameters stay put: the exact |G|^2 and tr(Sigma) at those parameters are the target.
LOGISTIC = [
    "data=synthetic",
    "data.shape=[1,8]",
    "data.num_classes=4",
    "data.noise=3.0",
    "data.num_samples=8100",
    "data.val_size=100",
    "model=mlp",
    "model.hidden=[]",
    "optimizer.lr=1e-9",
    "optimizer.weight_decay=0",
    "optimizer.momentum=0",
    "schedule.warmup_shape=none",
    "schedule.main=constant",
    "trainer.progress=false",
    "trainer.eval_every_steps=1000",
    "epochs=10",
]


def test_the_estimates_are_unbiased_on_known_moments():
    # |G_B|^2 has expectation |G|^2 + tr(Sigma) / B: feed exact expectations, get exact answers back.
    g2, tr = 2.0, 300.0
    grad_sq, trace = estimates(g2 + tr / 16, 16, g2 + tr / 64, 64)
    assert grad_sq == pytest.approx(g2) and trace == pytest.approx(tr)
    noise = NoiseScale(decay=0.9)
    for _ in range(5):
        noise.update(torch.tensor(g2 + tr / 16), 16, torch.tensor(g2 + tr / 64), 64)
    assert noise.record()["noise/b_simple"] == pytest.approx(tr / g2)  # bias-corrected moving averages
    assert noise.summary()["noise_b_simple_mean"] == pytest.approx(tr / g2)


def test_the_estimates_of_steps_drawn_without_replacement_are_unbiased_on_known_moments():
    # b of N samples drawn without replacement: |G_b|^2 has expectation |G|^2 + tr(Sigma)(1/b - 1/N).
    # Read as independent draws, |G|^2 would come out short by tr(Sigma)/N (1.17 of 2 here).
    g2, tr, n = 2.0, 300.0, 256
    grad_sq, trace = estimates(g2 + tr * (1 / 16 - 1 / n), 16, g2 + tr * (1 / 64 - 1 / n), 64, population=n)
    assert grad_sq == pytest.approx(g2) and trace == pytest.approx(tr)


def measure(noise: NoiseScale, moments: list[tuple[float, float]]) -> None:
    """One update per (|G|^2, tr(Sigma)): the expected squared norms at batches 16 and 64."""
    for g2, tr in moments:
        noise.update(torch.tensor(g2 + tr / 16), 16, torch.tensor(g2 + tr / 64), 64)


def test_the_logged_averages_are_the_bias_corrected_moving_averages_of_the_estimates():
    # Moments that change from update to update: after n updates the moving average weighs the
    # i-th by (1 - d) d^(n-1-i), weights that sum to 1 - d^n; corrected (as Adam's moments are),
    # it is the weighted mean. Uncorrected, |G|^2 and tr(Sigma) would both read 1 - 0.9^4 = 34 %
    # of it, which their ratio B_simple cannot show: the critical-batch report reads them apart.
    d, moments = 0.9, [(2.0, 300.0), (3.0, 240.0), (1.5, 420.0), (2.5, 330.0)]
    noise = NoiseScale(decay=d)
    measure(noise, moments)
    n = len(moments)
    weights = [(1 - d) * d ** (n - 1 - i) for i in range(n)]
    g2 = sum(w * m[0] for w, m in zip(weights, moments)) / (1 - d**n)
    tr = sum(w * m[1] for w, m in zip(weights, moments)) / (1 - d**n)
    assert noise.averaged() == pytest.approx((g2, tr), rel=1e-12)
    record = noise.record()
    assert record["noise/grad_sq"] == pytest.approx(g2, rel=1e-12)
    assert record["noise/trace_sigma"] == pytest.approx(tr, rel=1e-12)
    assert record["noise/b_simple"] == pytest.approx(tr / g2, rel=1e-12)


def test_the_raw_estimates_of_a_record_are_the_mean_over_its_own_window():
    # The windowed B_simple of the critical-batch report is built from these: each record's raw
    # figures are the plain mean of the estimates since the record before, not since the start.
    noise = NoiseScale(decay=0.9)
    first, second = [(2.0, 300.0), (4.0, 100.0)], [(1.0, 500.0), (2.0, 200.0), (3.0, 50.0)]
    measure(noise, first)
    one = noise.record()
    measure(noise, second)
    two = noise.record()
    assert one["noise/grad_sq_raw"] == pytest.approx(3.0) and one["noise/trace_sigma_raw"] == pytest.approx(200.0)
    # Over both windows the means would be 2.4 and 230.
    assert two["noise/grad_sq_raw"] == pytest.approx(2.0) and two["noise/trace_sigma_raw"] == pytest.approx(250.0)


def test_a_measurement_that_is_not_finite_is_left_out_and_the_next_ones_count():
    g2, tr = 2.0, 300.0
    clean, hit = NoiseScale(decay=0.9), NoiseScale(decay=0.9)
    for step in range(6):
        small, big = torch.tensor(g2 + tr / 16), torch.tensor(g2 + tr / 64)
        clean.update(small, 16, big, 64)
        if step == 2:  # an fp16 overflow: inf in one norm, nan in the other
            hit.update(torch.tensor(float("inf")), 16, torch.tensor(float("nan")), 64)
        hit.update(small, 16, big, 64)
    assert hit.count == clean.count == 6 and int(hit.skipped) == 1
    assert hit.record()["noise/b_simple"] == pytest.approx(clean.record()["noise/b_simple"]) == pytest.approx(tr / g2)
    assert hit.summary()["noise_b_simple_mean"] == pytest.approx(tr / g2)
    assert hit.summary()["noise_skipped"] == 1


def test_a_checkpoint_from_before_the_correction_for_drawing_without_replacement_resumes_corrected():
    # Averages saved uncorrected (no population in the checkpoint) and corrected on restoring equal
    # those of a run that measured corrected from the start: the correction is linear.
    from dataclasses import asdict

    draws = [(torch.tensor(2.0 + 300 / 16 + k), 16, torch.tensor(2.0 + 300 / 64), 64) for k in range(5)]
    before, after = NoiseScale(decay=0.9), NoiseScale(decay=0.9, population=500)
    for draw in draws[:3]:
        before.update(*draw)
        after.update(*draw)
    saved = {k: v for k, v in asdict(before).items() if k != "population"}  # as checkpoints had it
    resumed = NoiseScale.restored(saved, 500)
    assert NoiseScale.restored(asdict(after), 500).summary() == after.summary()  # a new checkpoint: as saved
    for draw in draws[3:]:
        resumed.update(*draw)
        after.update(*draw)
    assert resumed.record() == pytest.approx(after.record())
    assert resumed.summary() == pytest.approx(after.summary())
    assert resumed.summary()["noise_b_simple_mean"] != pytest.approx(before.summary()["noise_b_simple_mean"])
