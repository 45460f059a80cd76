"""A seeded Markov source over a small alphabet, whose entropy rate is known exactly.

The best loss any model can reach on this text is computable, so a run shows how close
a strategy gets to the optimum.
"""
from __future__ import annotations

import numpy as np


class MarkovSource:
    """Order-k Markov chain over `vocab_size` symbols with Dirichlet(alpha) transition rows."""

    def __init__(self, vocab_size: int = 32, order: int = 2, alpha: float = 0.1, seed: int = 0):
        self.V, self.k = vocab_size, order
        self.num_states = vocab_size ** order
        rng = np.random.default_rng(seed)
        self.transitions = rng.dirichlet(np.full(vocab_size, alpha), size=self.num_states)
        # The state holds the last k symbols, oldest first (most significant digit).
        self.next_state = (np.arange(self.num_states)[:, None] * vocab_size
                           + np.arange(vocab_size)[None, :]) % self.num_states
        self.stationary = self._stationary()

    def _stationary(self) -> np.ndarray:
        """π with π = πM, solved directly (small state spaces) or by power iteration."""
        S = self.num_states
        if S <= 4096:
            M = np.zeros((S, S))
            np.add.at(M, (np.repeat(np.arange(S), self.V), self.next_state.ravel()),
                      self.transitions.ravel())
            A = M.T - np.eye(S)
            A[-1] = 1.0  # replace one (redundant) balance equation by Σπ = 1
            b = np.zeros(S)
            b[-1] = 1.0
            return np.clip(np.linalg.solve(A, b), 0.0, None)
        pi = np.full(S, 1.0 / S)
        for _ in range(100_000):
            new = np.bincount(self.next_state.ravel(), weights=(pi[:, None] * self.transitions).ravel(),
                              minlength=S)
            if np.abs(new - pi).sum() < 1e-12:
                return new
            pi = new
        return pi

    def entropy_rate(self) -> float:
        """h = Σ_s π(s) H(P(·|s)), in nats per symbol."""
        row_entropy = -(self.transitions * np.log(self.transitions + 1e-300)).sum(1)
        return float((self.stationary * row_entropy).sum())

    def conditional_entropies(self, context_len: int) -> list[float]:
        """H(X_{i+1} | X_0..X_i) for i = 0..context_len-1 (stationary start), in nats."""

        def block_entropy(j):  # H(X_0..X_{j-1}) for j <= k, from the stationary state law
            if j == 0:
                return 0.0
            joint = self.stationary.reshape([self.V] * self.k)
            marginal = joint.sum(axis=tuple(range(j, self.k))) if j < self.k else joint
            p = marginal.ravel()
            return float(-(p * np.log(p + 1e-300)).sum())

        h = self.entropy_rate()
        out = []
        for i in range(context_len):
            known = i + 1  # symbols seen before predicting X_{i+1}
            out.append(h if known >= self.k else block_entropy(known + 1) - block_entropy(known))
        return out

    def best_window_loss(self, block_size: int) -> float:
        """Best mean next-symbol cross-entropy over a window of `block_size` predictions."""
        return float(np.mean(self.conditional_entropies(block_size)))

    def sample(self, num_chains: int, length: int, seed: int) -> np.ndarray:
        """num_chains independent stationary sequences of `length` symbols, as int64."""
        rng = np.random.default_rng(seed)
        cdf = np.cumsum(self.transitions, axis=1)
        cdf[:, -1] = 1.0
        state = rng.choice(self.num_states, size=num_chains, p=self.stationary)
        out = np.empty((num_chains, length), dtype=np.int64)
        for pos in range(self.k):  # the first k symbols are the digits of the initial state
            out[:, pos] = (state // self.V ** (self.k - 1 - pos)) % self.V
        for t in range(self.k, length):
            u = rng.random(num_chains)
            symbol = (u[:, None] > cdf[state]).sum(axis=1)
            out[:, t] = symbol
            state = self.next_state[state, symbol]
        return out
