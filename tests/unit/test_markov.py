"""data=text's default source: its entropy rate and window floor, computed exactly from the chain
(bsexp.engine.markov), against estimates from the bytes it generates."""

import math
from collections import Counter

import numpy as np
import pytest

from bsexp.engine.markov import MarkovSource
from bsexp.errors import ConfigError


def conditional_entropy(sequences: np.ndarray, given: int, at: int) -> float:
    """Plug-in estimate of H(X_at | the `given` bytes before it), in nats, over the rows."""
    pairs = Counter(map(bytes, sequences[:, at - given : at + 1]))
    contexts = Counter(map(bytes, sequences[:, at - given : at]))
    n = len(sequences)
    return -sum(c / n * math.log(c / contexts[key[:-1]]) for key, c in pairs.items())


@pytest.mark.parametrize("order, symbols, branching", [(2, 16, 4), (1, 8, 3), (3, 6, 2)])
def test_the_entropy_rate_is_what_the_bytes_it_generates_show(order, symbols, branching):
    source = MarkovSource.of(order, symbols, branching, seed=3)
    rows = source.sequences(200_000, order + 2, np.random.default_rng(0))
    assert set(np.unique(rows)) <= set(source.alphabet)
    # Started from the stationary distribution, every position past the order has entropy H given
    # the `order` bytes before it (the plug-in estimate's bias is about cells / 2n: below 0.005).
    for at in (order, order + 1):
        assert conditional_entropy(rows, order, at) == pytest.approx(source.entropy_rate, abs=0.01)
    assert 0 < source.entropy_rate <= math.log(branching) + 1e-12


def test_the_window_floor_is_the_mean_conditional_entropy_of_its_targets():
    source = MarkovSource.of(2, 16, 4, seed=3)
    rows = source.sequences(200_000, 5, np.random.default_rng(1))
    # Target 1 has one byte to condition on (more entropy than H), targets 2 to 4 have two (H).
    first = conditional_entropy(rows, 1, 1)
    assert first == pytest.approx(source.block_entropy(2) - source.block_entropy(1), abs=0.01)
    assert first > source.entropy_rate + 0.05
    assert source.window_floor(4) == pytest.approx((first + 3 * source.entropy_rate) / 4, abs=0.005)
    assert source.window_floor(1000) == pytest.approx(source.entropy_rate, abs=0.002)


def test_the_same_seed_gives_the_same_chain_another_seed_another():
    a, b, c = (MarkovSource.of(2, 16, 4, seed=s) for s in (5, 5, 6))
    assert np.array_equal(a.probs, b.probs) and a.entropy_rate == b.entropy_rate
    assert not np.array_equal(a.probs, c.probs)


def test_a_chain_too_large_to_hold_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"data.symbols=64: .*states; valid: at most"):
        MarkovSource.of(4, 64, 4, seed=0)
    with pytest.raises(ConfigError, match="data.branching=9: valid: at most data.symbols=8"):
        MarkovSource.of(1, 8, 9, seed=0)
