"""The adaptive batch's controller as a pure function: a B_simple series in, sizes out."""

import math

import pytest

from bsexp.batch.closed_loop import Controller, adascale_gain, efficiency


def run(controller: Controller, series, throughput=None) -> list[int]:
    size, sizes = controller.start, []
    for step, b_simple in enumerate(series):
        size = controller.next_size(size, b_simple, throughput, step).size
        sizes.append(size)
    return sizes


def test_the_batch_follows_c_times_b_simple_growing_at_most_max_growth_a_decision():
    controller = Controller(start=32, min_size=32, max_size=4096, c=1.0, max_growth=2.0)
    # B_simple rises from 40 to 3000: the batch doubles while the target runs ahead, then meets it.
    assert run(controller, [40, 100, 300, 1000, 3000, 3000, 3000]) == [40, 80, 160, 320, 640, 1280, 2560]
    assert run(controller, [50, 50, 50]) == [50, 50, 50]  # reached and held


def test_the_target_is_scaled_by_c_and_clipped_to_the_bounds():
    controller = Controller(start=64, min_size=64, max_size=300, c=0.5, max_growth=10.0)
    assert run(controller, [400]) == [200]  # 0.5 x 400
    assert run(controller, [2000]) == [300]  # max_size
    assert run(controller, [10]) == [64]  # never below min_size (and no shrinking by default)


def test_power_half_aims_at_the_geometric_mean_of_the_first_batch_and_b_simple():
    controller = Controller(start=32, min_size=32, max_size=4096, c=1.5, power=0.5, max_growth=100.0)
    assert run(controller, [800]) == [240]  # 1.5 x sqrt(32 x 800) = 1.5 x 160
    assert run(controller, [3200]) == [480]  # B_simple x4, the batch x2
    assert run(Controller(start=32, min_size=32, max_size=4096, power=0.5, max_growth=100.0), [32]) == [32]


def test_sizes_divide_over_the_ranks_and_stay_within_the_growth_cap():
    controller = Controller(start=48, min_size=48, max_size=10_000, quantum=8, c=1.0, max_growth=1.5)
    sizes = run(controller, [37, 500, 500, 500, 5000])
    assert all(size % 8 == 0 for size in sizes)
    previous = 48
    for size in sizes:
        assert previous <= size <= previous * 1.5
        previous = size
    assert sizes == [48, 72, 104, 152, 224]


def test_the_batch_shrinks_only_when_asked():
    series = [1000, 1000, 100, 100, 100]
    grow_only = Controller(start=128, min_size=32, max_size=2048, max_growth=2.0)
    assert run(grow_only, series) == [256, 512, 512, 512, 512]
    shrinking = Controller(start=128, min_size=32, max_size=2048, max_growth=2.0, shrink=True)
    assert run(shrinking, series) == [256, 512, 256, 128, 100]


def test_an_unknown_or_non_finite_noise_scale_keeps_the_batch():
    controller = Controller(start=64, min_size=64, max_size=1024)
    for value in (None, math.nan, math.inf, -5.0, 0.0):
        decision = controller.next_size(128, value)
        assert decision.size == 128 and not decision.changed and decision.b_simple is None


def test_goodput_picks_the_batch_with_the_most_progress_per_second():
    # Throughput grows linearly up to 256 samples then saturates; B_noise = 200 from b0 = 32:
    # goodput(b) = min(b, 256) x (232 / (200 + b)) is largest at b = 256 among the reachable sizes.
    def throughput(b):
        return float(min(b, 256))

    controller = Controller(start=32, min_size=32, max_size=2048, quantum=32, max_growth=100.0, objective="goodput")
    decision = controller.next_size(32, 200.0, throughput)
    assert decision.size == 256
    assert decision.efficiency == pytest.approx(232 / 456)
    # Flat throughput: every larger batch only loses efficiency, so it stays small.
    assert controller.next_size(32, 200.0, lambda b: 1.0).size == 32


def test_efficiency_and_the_adascale_gain_agree_with_their_definitions():
    b_noise, b0 = 500.0, 50
    for scale in (1, 2, 4, 16):
        b = scale * b0
        sigma2, g2 = b_noise / b0, 1.0  # tr(Σ)/b0 with |G|^2 = 1 gives B_simple = b_noise
        r = (sigma2 + g2) / (sigma2 / scale + g2)
        assert adascale_gain(b_noise, b0, b) == pytest.approx(r)
        assert 1.0 <= r <= scale
        assert efficiency(b_noise, b0, b) == pytest.approx(r / scale)
    assert adascale_gain(None, b0, 4 * b0) == 1.0


def test_the_adascale_gain_stays_while_the_noise_scale_is_unknown():
    # A loss spike can drive the |G|^2 average below zero for hundreds of steps (seed 2 of
    # experiment=adaptive_vs_fixed at step 340, batch 390 = 12 x 32, gain 6.6): B_simple is
    # unknown, and falling back to 1 would cut the LR to batch 32's and slow the schedule 12-fold.
    b0, b = 32, 390
    for unknown in (None, -120.0, 0.0, float("nan"), float("inf")):
        assert adascale_gain(unknown, b0, b, kept=6.6) == 6.6
    assert adascale_gain(None, b0, b) == 1.0  # before the first measurement
    assert adascale_gain(300.0, b0, b, kept=6.6) == pytest.approx(b / b0 * (300 + b0) / (300 + b))


def test_shrinking_over_ranks_stays_within_min_size_and_the_growth_cap():
    # 8 ranks, min_size 10, at most /2 a decision: from 24 the least is 16 (not 8, below min_size
    # and a third of 24); 16 ranks, min 20: from 48, 32.
    assert Controller(start=24, min_size=10, max_size=1024, quantum=8, shrink=True).next_size(24, 1.0).size == 16
    assert Controller(start=48, min_size=20, max_size=1024, quantum=16, shrink=True).next_size(48, 1.0).size == 32
    for quantum, start, min_size in ((8, 24, 10), (16, 48, 20), (3, 99, 7), (1, 50, 1)):
        controller = Controller(start=start, min_size=min_size, max_size=4096, quantum=quantum, shrink=True)
        previous = start
        for size in run(controller, [1.0] * 6):
            assert size % quantum == 0 and size >= min_size and size >= previous / 2
            previous = size


def test_a_growth_cap_under_one_multiple_of_the_ranks_still_lets_the_batch_grow():
    # 8 ranks at batch 8 with x1.5 a decision: 12 does not divide over the ranks; 16, one multiple
    # more, is the least growth there is (it held at 8 for good, whatever B_simple said).
    controller = Controller(start=8, min_size=8, max_size=64, quantum=8, max_growth=1.5)
    assert run(controller, [1000] * 8) == [16, 24, 32, 48, 64, 64, 64, 64]


def test_the_target_rounds_to_the_nearest_multiple_of_the_ranks():
    controller = Controller(start=32, min_size=32, max_size=4096, quantum=8, max_growth=100.0)
    assert run(controller, [99]) == [96]  # 12.4 multiples of 8: down
    assert run(controller, [101]) == [104]  # 12.6: up


def test_growth_may_land_exactly_on_max_size():
    # 8 ranks at 8, x1.5 a decision (12, under one multiple more) and max_size 16: one multiple
    # more is exactly max_size, and within it.
    controller = Controller(start=8, min_size=8, max_size=16, quantum=8, max_growth=1.5)
    assert run(controller, [1000] * 2) == [16, 16]


def test_goodput_breaks_a_tie_towards_the_smaller_batch():
    # B_noise 224 from b0 32: efficiency 1 at 32 and 256/512 = 1/2 at 288, which runs twice as
    # fast: equal goodput, and the smaller batch spends fewer samples for it.
    throughput = {32: 1.0, 288: 2.0}
    controller = Controller(start=32, min_size=32, max_size=2048, quantum=32, max_growth=100.0, objective="goodput")
    assert controller.next_size(32, 224.0, lambda b: throughput.get(b, 0.1)).size == 32


@pytest.mark.parametrize("max_size, expected", [(None, 3500), (1024, 1024), (10_000, 3500)])
def test_the_policy_never_lets_the_batch_grow_past_the_training_set(max_size, expected):
    from bsexp.batch.policies import Probe, RunSpec
    from bsexp.batch.policies.adaptive import Adaptive, AdaptiveBatch, AdaptiveConfig, controller

    config = AdaptiveBatch(find_micro_size=False, adaptive=AdaptiveConfig(max_size=max_size))
    policy = Adaptive(config=config, spec=RunSpec(epochs=20, world_size=2))
    policy.lay_out(Probe(3500))  # MNIST-1D's training samples
    made = controller(config, policy.world, policy.n_train)  # the n_train it laid out with
    assert made.max_size == expected and made.quantum == 2
    # A measured noise scale far above the data: the batch stops at the cap, a multiple of the ranks.
    size = 32
    for _ in range(20):
        size = made.next_size(size, 1e9).size
    assert size <= expected and size % 2 == 0 and size >= expected - 2
