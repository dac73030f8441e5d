"""The large-batch rules, each against its paper: LR and weight-decay scaling, warmup, schedules."""

import math

import pytest

from bsexp.batch import scaling
from bsexp.batch.hparams import Rules, scaled
from bsexp.batch.layout import Layout
from bsexp.batch.plan import plan_for
from bsexp.batch.scaling import LRSchedule
from bsexp.batch.schedule import BatchSchedule


def test_goyal_linear_rule_reference_numbers():
    # Goyal et al. 2017: LR 0.1 at batch 256; at 8k (k = 32) the linear rule gives 3.2.
    k = scaling.scale_factor(8192, 256)
    assert k == 32
    assert scaling.scaled_lr(0.1, k, "linear") == pytest.approx(3.2)
    assert scaling.scaled_lr(0.1, k, "sqrt") == pytest.approx(0.1 * math.sqrt(32))
    assert scaling.scaled_lr(0.1, k, "none") == 0.1


def per_epoch_decay(batch: int, lr_rule: str, wd_rule: str) -> float:
    """eta * lambda * N / B: the exponent of SGD's weight shrinkage over one epoch, from the LR and
    weight decay the rules give at `batch` (N / B steps, each shrinking by eta * lambda)."""
    n = 3500  # MNIST-1D's training split
    layout = Layout(BatchSchedule(start=batch).run_steps(epochs=20, n=n, drop_last=False), 1, plan_for(batch, 1, None))
    hp, _ = scaled(layout, Rules(lr=0.1, weight_decay=5e-4, ref_batch=128, lr_rule=lr_rule, wd_rule=wd_rule))
    return hp.lr * hp.weight_decay * n / batch


@pytest.mark.parametrize("k", [0.25, 4, 8])
def test_sqrt_weight_decay_keeps_the_per_epoch_decay_only_under_the_sqrt_lr_rule(k):
    # Loshchilov & Hutter's normalised weight decay (lambda x sqrt(k)) keeps B / (eta lambda N) with
    # eta x sqrt(k); under the linear LR rule (the default) the per-epoch decay grows by sqrt(k).
    batch = int(128 * k)
    ref = per_epoch_decay(128, "linear", "sqrt")
    assert per_epoch_decay(batch, "sqrt", "sqrt") == pytest.approx(ref)
    assert per_epoch_decay(batch, "linear", "sqrt") == pytest.approx(ref * math.sqrt(k))
    assert per_epoch_decay(batch, "linear", "none") == pytest.approx(ref)  # Goyal et al.'s recipe


def test_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="valid: linear, sqrt, none"):
        scaling.rule_multiplier("cube", 2.0)


def test_gradual_warmup_starts_at_the_unscaled_lr_and_reaches_the_target():
    k = 8.0
    start = scaling.warmup_start_factor(None, k, "linear")
    assert start == 1 / 8
    schedule = LRSchedule(total=100, warmup=10, start_factor=start, main="constant")
    assert schedule(0) == pytest.approx(1 / 8)  # lr(0) = target / k = the reference LR
    assert schedule(5) == pytest.approx(1 / 8 + (7 / 8) * 0.5)
    assert schedule(10) == 1.0 and schedule(99) == 1.0
    values = [schedule(s) for s in range(11)]
    assert values == sorted(values)


def test_start_factor_never_exceeds_one_and_zero_is_allowed():
    for rule in ("linear", "sqrt", "none"):
        assert scaling.warmup_start_factor(None, 0.5, rule) == 1.0  # batch below ref_batch: no ramp down
    schedule = LRSchedule(total=10, warmup=4, start_factor=0.0, main="constant")
    assert schedule(0) == 0.0 and schedule(2) == 0.5


def test_constant_warmup_holds_low_then_jumps():
    schedule = LRSchedule(total=20, warmup=5, warmup_shape="constant", start_factor=0.1, main="constant")
    assert [schedule(s) for s in (0, 4, 5, 6)] == [0.1, 0.1, 1.0, 1.0]


def test_no_warmup_ignores_warmup_steps():
    schedule = LRSchedule(total=10, warmup=5, warmup_shape="none", start_factor=0.1, main="cosine")
    assert schedule(0) == 1.0
    assert schedule(5) == pytest.approx(0.5)  # cosine runs over the whole run: halfway


def test_cosine_after_warmup_ends_at_the_final_factor():
    schedule = LRSchedule(total=110, warmup=10, start_factor=0.5, main="cosine", final_factor=0.1)
    assert schedule(10) == pytest.approx(1.0)
    assert schedule(60) == pytest.approx(0.1 + 0.9 * 0.5)
    assert schedule(110) == pytest.approx(0.1)
    assert schedule(500) == pytest.approx(0.1)  # past the end it stays at the floor


def test_step_schedule_multiplies_at_each_milestone():
    schedule = LRSchedule(total=100, main="step", milestones=(30, 60), factor=0.1)
    assert [schedule(s) for s in (0, 29, 30, 59, 60, 99)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01])


def test_a_milestone_inside_warmup_takes_effect_when_warmup_ends():
    schedule = LRSchedule(total=20, warmup=10, start_factor=0.5, main="step", milestones=(5, 15))
    assert schedule(4) == pytest.approx(0.5 + 0.5 * 4 / 10)  # still ramping
    assert schedule(10) == pytest.approx(0.1) and schedule(15) == pytest.approx(0.01)


def test_a_one_step_run_uses_the_start_of_its_schedule():
    assert LRSchedule(total=1, warmup=0, main="cosine")(0) == 1.0
    assert LRSchedule(total=1, warmup=3, start_factor=0.25, main="cosine")(0) == 0.25


@pytest.mark.parametrize(
    "multiplier, warmup_steps, warned",
    [
        (26.0, 2, True),  # the default finder batch before its cap: x26 in 2 steps of warmup
        (26.0, 24, True),  # 24 steps raise the LR by more than the reference LR in each
        (26.0, 25, False),  # 25 steps of one reference LR each reach x26
        (1.0, 0, False),  # at the reference batch there is nothing to carry
    ],
)
def test_an_lr_scaled_past_what_the_warmup_can_carry_is_cautioned(multiplier, warmup_steps, warned):
    found = scaling.cautions(multiplier, "linear", warmup_steps, total_steps=1000, steps_per_epoch=100)
    carry = [what for key, what in found if key == "schedule.warmup" and "lengthen it" in what]
    assert bool(carry) is warned, found
    if warned:
        assert f"a warmup of {warmup_steps} step(s) raises the LR x26" in carry[0]


def test_an_lr_scaled_past_goyals_largest_verified_factor_is_cautioned():
    def keys(multiplier):
        return [key for key, _ in scaling.cautions(multiplier, "linear", 10_000, 100_000, 100)]

    assert "scaling.lr_rule" in keys(scaling.LARGEST_VERIFIED_K + 1)
    assert "scaling.lr_rule" not in keys(scaling.LARGEST_VERIFIED_K)


@pytest.mark.parametrize(
    "momentum, total_steps, warned",
    [
        (0.1 / 12, 200, True),  # inverse at 384 / 32 over 200 steps: 19 % of the initial values left
        (0.1 / 12**0.5, 200, False),  # inverse_sqrt: 0.3 %
        (0.1 / 12, 400, False),  # twice the steps: 3.5 %
        (None, 2, False),  # no rule moved it: a short run's statistics are BatchNorm's own matter
    ],
)
def test_a_bn_momentum_slowed_past_what_the_run_can_average_is_cautioned(momentum, total_steps, warned):
    found = scaling.cautions(1.0, "none", 0, total_steps, 100, moved_bn_momentum=momentum)
    stale = [what for key, what in found if key == "scaling.bn_momentum_rule"]
    assert bool(stale) is warned, found
    if warned:
        assert f"of their initial values after the run's {total_steps} steps" in stale[0]
        assert f"{100 * (1 - momentum) ** total_steps:.0f} %" in stale[0]
