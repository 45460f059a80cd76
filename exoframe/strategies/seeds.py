"""Generator seeds derived from the run's seed (a rank's, a step's, a strategy's draws).

Every seed in [0, 2^63) is valid (config.py), and torch takes a generator seed below 2^64:
the arithmetic mix seed * 1_000_003 + part, which earlier runs drew from, overflows that for
a seed from about 1.8e13 (and a stacked step's, mixed twice, from about 1.8e7). Where it
would, the derived seed is a hash of the seed and the parts instead: the same in every run
of that seed, and the streams of every seed that worked before are unchanged.
"""
from __future__ import annotations

import hashlib

MIX = 1_000_003
GENERATOR_LIMIT = 2 ** 64  # torch.Generator.manual_seed takes [0, 2^64)


def derive(seed: int, *parts: int) -> int:
    """A generator seed in [0, 2^64) for `parts` (rank, step, ...) of the run seeded `seed`:
    ((seed * MIX + parts[0]) * MIX + parts[1]) ... where that fits, else a hash of them all
    (below 2^63, so that it fits any generator that takes a signed 64-bit seed)."""
    value = seed
    for part in parts:
        value = value * MIX + part
    if 0 <= value < GENERATOR_LIMIT:
        return value
    digest = hashlib.blake2b(repr((seed, *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1
