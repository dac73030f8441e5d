"""The regularisers a batch size moves, as pure functions: dropout ∝ √batch (or ∝ batch) with a
cap, BatchNorm's momentum ∝ 1/batch (or 1/√batch) with a floor."""

import math

import pytest

from bsexp.batch.scaling import scaled_bn_momentum, scaled_dropout


@pytest.mark.parametrize(
    "rule, k, expected",
    [
        ("none", 8, 0.1),
        ("sqrt", 4, 0.2),
        ("linear", 4, 0.4),
        ("sqrt", 0.25, 0.05),
        ("linear", 16, 0.5),
        ("sqrt", 100, 0.5),
    ],
)
def test_dropout_grows_with_the_batch_by_its_rule_up_to_the_cap(rule, k, expected):
    assert scaled_dropout(0.1, k, rule, cap=0.5) == pytest.approx(expected)


def test_no_dropout_stays_none_whatever_the_rule():
    assert scaled_dropout(0.0, 64, "linear", cap=0.5) == 0.0


@pytest.mark.parametrize(
    "rule, k, expected",
    [
        ("none", 8, 0.1),
        ("inverse", 4, 0.025),
        ("inverse_sqrt", 4, 0.05),
        ("inverse", 1000, 0.001),
        ("inverse", 0.05, 1.0),
    ],
)
def test_batchnorm_momentum_falls_with_the_batch_by_its_rule_down_to_the_floor(rule, k, expected):
    assert scaled_bn_momentum(0.1, k, rule, floor=0.001) == pytest.approx(expected)


def test_the_inverse_rule_keeps_the_weight_of_a_sample_in_the_running_statistics():
    # A batch of k x ref samples with momentum m / k weighs each sample as ref with m does.
    for k in (2, 8, 32):
        assert scaled_bn_momentum(0.1, k, "inverse", 1e-9) * k == pytest.approx(0.1)
    assert math.isclose(scaled_bn_momentum(0.1, 4, "inverse_sqrt", 1e-9), 0.1 / 2)


def test_an_unknown_momentum_rule_is_refused():
    with pytest.raises(ValueError, match="valid: inverse, inverse_sqrt, none"):
        scaled_bn_momentum(0.1, 2, "square", 0.001)
