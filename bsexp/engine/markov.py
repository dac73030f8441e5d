"""A random sparse Markov source over bytes whose entropy rate is known exactly: the default text of
`data=text`, against which a language model's loss has a floor (pure numpy).

The chain is of order k over an alphabet of `symbols` bytes (the letters a, b, c, ... where there
are at most 26): after each context of k symbols, `branching` distinct next symbols are possible,
chosen (below, `_supports`) with probabilities from a flat Dirichlet, all fixed by the seed. Its state is the
last k symbols; π is the stationary distribution over states (from the uniform one, by lazy power
iteration: the process started from π is stationary even where the chain is periodic or has several
closed classes). Then

    entropy rate   H = -Σ_s π_s Σ_x P(x | s) log P(x | s)            (nats per symbol)

and a model that sees a window of T + 1 symbols and predicts the last T from those before them can
reach at best the window floor: the mean over the T targets of H(X_t | X_0 ... X_{t-1}), which is
H(X_0 ... X_t) - H(X_0 ... X_{t-1}) for the first k - 1 targets (the marginals of π) and H after."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bsexp.errors import ConfigError

MAX_STATES = 1 << 20  # symbols ** order: the tables' rows


@dataclass(frozen=True, eq=False)
class MarkovSource:
    order: int
    symbols: int
    next_symbols: np.ndarray  # (states, branching): the possible next symbols of each state
    probs: np.ndarray  # (states, branching): their probabilities
    stationary: np.ndarray  # (states,): π

    @classmethod
    def of(cls, order: int, symbols: int, branching: int, seed: int) -> MarkovSource:
        if symbols**order > MAX_STATES:
            raise ConfigError(
                "data.symbols",
                symbols,
                f"symbols ** data.order = {symbols**order:,} states; valid: at most {MAX_STATES:,}",
            )
        if branching > symbols:
            raise ConfigError("data.branching", branching, f"valid: at most data.symbols={symbols}")
        rng = np.random.default_rng([seed, 0])
        states = symbols**order
        next_symbols = _supports(rng, order, symbols, branching)
        probs = rng.dirichlet(np.ones(branching), size=states)
        return cls(order, symbols, next_symbols, probs, _stationary(next_symbols, probs, symbols))

    @property
    def alphabet(self) -> np.ndarray:
        """The byte each symbol is written as."""
        first = ord("a") if self.symbols <= 26 else 0
        return np.arange(first, first + self.symbols, dtype=np.uint8)

    def _next_state(self, state: np.ndarray, symbol: np.ndarray) -> np.ndarray:
        return (state * self.symbols + symbol) % (self.symbols**self.order)

    @property
    def entropy_rate(self) -> float:
        """H in nats per symbol."""
        plogp = np.where(self.probs > 0, self.probs * np.log(np.where(self.probs > 0, self.probs, 1.0)), 0.0)
        return float(-(self.stationary * plogp.sum(axis=1)).sum())

    def block_entropy(self, length: int) -> float:
        """H(X_0 ... X_{length-1}) of the stationary process, for length <= order: the entropy of π's
        marginal over a state's first `length` symbols (a state's symbols are oldest first)."""
        marginal = self.stationary.reshape(self.symbols**length, -1).sum(axis=1)
        marginal = marginal[marginal > 0]
        return float(-(marginal * np.log(marginal)).sum())

    def window_floor(self, context: int) -> float:
        """The lowest mean loss per target (nats) over windows of `context` targets, as above."""
        early = [self.block_entropy(t + 1) - self.block_entropy(t) for t in range(1, min(self.order, context + 1))]
        return (sum(early) + (context - len(early)) * self.entropy_rate) / context

    def sequences(self, count: int, length: int, rng: np.random.Generator) -> np.ndarray:
        """`count` independent sequences of `length` bytes, each started from π (so stationary), as
        uint8 (count, length)."""
        out = np.empty((count, length), dtype=np.int64)
        state = rng.choice(len(self.stationary), size=count, p=self.stationary)
        for i in range(min(self.order, length)):  # the state's symbols, oldest first
            out[:, i] = state // self.symbols ** (self.order - 1 - i) % self.symbols
        cumulative = np.cumsum(self.probs, axis=1)
        for i in range(self.order, length):
            draw = rng.random(count)[:, None]
            pick = np.minimum((draw > cumulative[state]).sum(axis=1), self.probs.shape[1] - 1)
            symbol = self.next_symbols[state, pick]
            out[:, i] = symbol
            state = self._next_state(state, symbol)
        return self.alphabet[out]


def _supports(rng: np.random.Generator, order: int, symbols: int, branching: int) -> np.ndarray:
    """Each state's possible next symbols: `branching` of a pool of 2 x branching that its last
    symbol allows (the whole alphabet for order 1), so that the last symbol alone tells part of what
    comes next and the ones before it the rest: a model learns the bigrams first, then the longer
    contexts, as it learns a language, instead of facing a plateau until it finds the whole context."""
    states = symbols**order
    pool_size = symbols if order == 1 else min(symbols, 2 * branching)
    pools = np.argsort(rng.random((symbols, symbols)), axis=1)[:, :pool_size]  # by last symbol
    picks = np.argsort(rng.random((states, pool_size)), axis=1)[:, :branching]
    return np.take_along_axis(pools[np.arange(states) % symbols], picks, axis=1)


def _stationary(next_symbols: np.ndarray, probs: np.ndarray, symbols: int, tol: float = 1e-13) -> np.ndarray:
    """π from the uniform distribution by lazy power iteration, π <- (π + πP) / 2 (converges for
    any chain; the limit is stationary)."""
    states = len(next_symbols)
    successor = (np.arange(states)[:, None] * symbols + next_symbols) % states
    pi = np.full(states, 1.0 / states)
    for _ in range(200_000):
        moved = np.bincount(successor.ravel(), weights=(pi[:, None] * probs).ravel(), minlength=states)
        new = 0.5 * (pi + moved)
        if np.abs(new - pi).sum() < tol:
            return new / new.sum()
        pi = new
    return pi / pi.sum()
