"""Built-in data: the Markov source's known optimum, sharding and per-epoch reshuffling."""
import math
from collections import Counter

import torch
from torch.utils.data import TensorDataset

from exoframe.engine.data import Batches
from exoframe.workloads.base import shard
from exoframe.workloads.markov import MarkovSource
from exoframe.workloads.mlp import best_loss


def empirical_conditional_entropy(sequences, order):
    context_counts, joint_counts = Counter(), Counter()
    for row in sequences.tolist():
        for t in range(order, len(row)):
            context = tuple(row[t - order:t])
            context_counts[context] += 1
            joint_counts[context, row[t]] += 1
    total = sum(context_counts.values())
    return -sum(c / total * math.log(c / context_counts[ctx])
                for (ctx, _), c in joint_counts.items())


def test_markov_entropy_rate_matches_sampled_text():
    for order in (1, 2):
        source = MarkovSource(vocab_size=8, order=order, alpha=0.3, seed=3)
        samples = source.sample(num_chains=50, length=4000, seed=7)
        estimate = empirical_conditional_entropy(samples, order)
        assert abs(estimate - source.entropy_rate()) < 0.02, (order, estimate)
        # The first symbol of a window has no context: it costs more than the rate.
        first = source.conditional_entropies(2)[0]
        if order == 2:
            assert first > source.entropy_rate() + 0.05
            assert abs(empirical_conditional_entropy(samples, 1) - first) < 0.02  # stationary


def test_mlp_best_loss_closed_form():
    assert best_loss(10, 0.0) == 0.0
    eps = 0.1
    assert abs(best_loss(10, eps) - (-(0.9 * math.log(0.9)) - 0.1 * math.log(0.1 / 9))) < 1e-12


def test_shards_are_disjoint_and_epochs_reshuffle():
    data = TensorDataset(torch.arange(40))
    shards = [shard(data, r, 4) for r in range(4)]
    seen = [set(data.tensors[0][list(s.indices)].tolist()) for s in shards]
    assert set.union(*seen) == set(range(40)) and sum(map(len, seen)) == 40
    batches = Batches(shards[1], batch_size=5, seed=0, rank=1)
    epoch0 = torch.cat([next(batches)[0] for _ in range(2)]).tolist()
    epoch1 = torch.cat([next(batches)[0] for _ in range(2)]).tolist()
    assert sorted(epoch0) == sorted(epoch1) == list(range(10, 20))
    assert epoch0 != epoch1
