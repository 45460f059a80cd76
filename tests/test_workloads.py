"""Built-in data: the Markov source's known optimum, sharding and per-epoch reshuffling."""
import math
from collections import Counter

import pytest
import torch
from torch.utils.data import TensorDataset

import exoframe
from exoframe.engine.node.data import Batches
from exoframe.workloads.base import shard, split_factory
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


# -- dataset factories: exoframe's (rank, num_nodes, split) and EXO Gym's (..., train: bool) ---

class Offset(torch.nn.Module):
    """loss = (w - y)², w starting at 0: training on y = 0 leaves w at exactly 0."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, batch):
        (y,) = batch
        return ((self.w - y) ** 2).mean()


def targets(rank, is_train):
    """Training targets are 0; rank r's validation targets are 3 + r."""
    return TensorDataset(torch.full((8,), 0.0 if is_train else 3.0 + rank))


def annotated(rank, num_nodes, train: bool):
    assert isinstance(train, bool), train
    return targets(rank, train)


def named_like_exo_gym(rank, num_nodes, train_dataset):
    assert isinstance(train_dataset, bool), train_dataset
    return targets(rank, train_dataset)


def bool_default(rank, num_nodes, use_training_data=True):
    assert isinstance(use_training_data, bool), use_training_data
    return targets(rank, use_training_data)


def split_name(rank, num_nodes, split):
    assert split in ("train", "val"), split
    return targets(rank, split == "train")


@pytest.mark.parametrize("factory", [annotated, named_like_exo_gym, bool_default, split_name])
def test_validation_uses_the_val_data_of_every_kind_of_factory(factory):
    result = exoframe.Trainer(Offset(), factory, batch_size=4).fit(
        strategy="ddp", num_nodes=2, steps=2, eval_every=1, optimizer="sgd", lr=0.1)
    assert [row["loss"] for row in result.metrics] == [0.0, 0.0]
    # w stays 0, so the loss on rank r's validation data is (3 + r)², averaged over ranks;
    # on the training data it would be 0.
    assert [row["val_loss"] for row in result.metrics] == [(9 + 16) / 2] * 2


def test_a_string_annotation_marks_a_bool_split_and_other_names_keep_the_string():
    seen = []

    def postponed(rank, num_nodes, flag: "bool"):  # what `from __future__ import annotations` gives
        seen.append(flag)

    def plain(rank, num_nodes, which):
        seen.append(which)

    for factory in (postponed, plain):
        wrapped = split_factory(factory)
        wrapped(0, 1, "train")
        wrapped(0, 1, "val")
    assert seen == [True, False, "train", "val"]
