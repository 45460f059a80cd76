"""What a run validates on: a fixed number of examples, the same whatever the node count.

Whole datasets (Workload.from_datasets) give one validation set: the examples are spread
evenly over it, so 2, 8 or 64 nodes validate the same ones, and every rank's equal shard of it
is represented once there are at least as many examples as nodes. A workload that makes each
rank's data itself (a dataset factory, a stream) has no whole set: the examples are drawn
from every rank's validation shard in proportion to its size, at least one from each, so a
non-IID split is still represented.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional

import torch
from torch.utils.data import ConcatDataset, Dataset, IterableDataset, Subset

from ...errors import ExoframeError
from ...workloads.base import Shards
from ..node.data import fetch

DEFAULT_EXAMPLES = 256  # a default run's validation stays under a tenth of its training compute


@dataclass(frozen=True)
class ValidationSet:
    dataset: Optional[Dataset]  # None: the workload has no validation data
    examples: int
    drawn_from: str  # in words, for summary.json

    def describe(self) -> dict:
        return {"examples": self.examples, "drawn_from": self.drawn_from}


def spread(size: int, count: int) -> torch.Tensor:
    """`count` indices spread evenly over range(size), the first at 0."""
    return torch.arange(count, dtype=torch.long) * size // count


def validation_set(dataset, nodes: int, examples: Optional[int]) -> ValidationSet:
    """The validation set of a run of `nodes` nodes: `examples` examples (None: up to
    DEFAULT_EXAMPLES) of the workload's validation data. More than the data holds is refused."""
    if isinstance(dataset, Shards):
        if dataset.val is None or len(dataset.val) == 0:
            return ValidationSet(None, 0, "no validation data")
        count = _count(examples, len(dataset.val))
        return ValidationSet(Subset(dataset.val, spread(len(dataset.val), count).tolist()), count,
                             f"the workload's validation set ({len(dataset.val)} examples), "
                             "spread evenly")
    shards = [dataset(rank, nodes, "val") for rank in range(nodes)]
    if any(isinstance(shard, IterableDataset) for shard in shards):
        return _from_streams(shards, examples)
    sizes = [len(shard) for shard in shards]
    if not sum(sizes):
        return ValidationSet(None, 0, "no validation data")
    count = _count(examples, sum(sizes))
    parts = [Subset(shard, spread(size, n).tolist())
             for shard, size, n in zip(shards, sizes, quotas(sizes, count)) if n]
    return ValidationSet(ConcatDataset(parts), count,
                         f"the {nodes} ranks' validation shards, in proportion to their sizes")


def quotas(sizes: list, count: int) -> list:
    """How many examples each shard gives: in proportion to its size (largest remainders), at
    least one from every non-empty shard while `count` allows."""
    nonempty = [i for i, size in enumerate(sizes) if size]
    floor = 1 if count >= len(nonempty) else 0
    given = [floor if size else 0 for size in sizes]
    left, total = count - sum(given), sum(sizes)
    shares = [left * size / total for size in sizes]
    for i in range(len(sizes)):
        given[i] += min(int(shares[i]), sizes[i] - given[i])
    order = sorted(nonempty, key=lambda i: (-(shares[i] - int(shares[i])), i))
    for i in itertools.cycle(order):
        if sum(given) >= count:
            break
        if given[i] < sizes[i]:
            given[i] += 1
    return given


def _from_streams(shards: list, examples: Optional[int]) -> ValidationSet:
    """From streams (IterableDatasets), with no sizes known: the first examples of each
    rank's, an equal number from each (read once, here, and kept)."""
    wanted = examples or DEFAULT_EXAMPLES
    each = -(-wanted // len(shards))
    items = []
    for shard in shards:
        items.extend(itertools.islice(iter(shard), each))
    if not items:
        return ValidationSet(None, 0, "no validation data")
    if examples is not None and len(items) < examples:
        raise ExoframeError(f"val_examples: {examples} is more than the validation streams "
                            f"hold ({len(items)} examples); give at most {len(items)}.")
    items = items[:wanted]
    return ValidationSet(Items(items), len(items),
                         f"the first examples of the {len(shards)} ranks' validation streams")


class Items(Dataset):
    """Examples held in a list."""

    def __init__(self, items: list):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _count(examples: Optional[int], available: int) -> int:
    if examples is None:
        return min(DEFAULT_EXAMPLES, available)
    if examples > available:
        raise ExoframeError(f"val_examples: {examples} is more than the validation data holds "
                            f"({available} examples); give at most {available}.")
    return examples


def batches(dataset: Dataset, batch_size: int):
    """The validation set in batches of `batch_size`, in order."""
    size = len(dataset)
    for start in range(0, size, batch_size):
        yield fetch(dataset, torch.arange(start, min(start + batch_size, size)))
