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
