"""What a rank trains: a model whose forward(batch) returns a scalar loss, and its data."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.utils.data import Dataset, Subset

from ..errors import ExoframeError, did_you_mean

# (rank, num_nodes, split) -> that rank's Dataset; split is "train" or "val"
DatasetFactory = Callable[[int, int, str], Dataset]


@dataclass
class Workload:
    """A model builder plus per-rank data. Returned by workload factories (`--workload`)."""

    build_model: Callable[[], torch.nn.Module]
    dataset: DatasetFactory
    batch_size: int = 32
    lr: float = 1e-3
    best_loss: Optional[float] = None  # the best achievable validation loss, when known
    name: str = "custom"

    @classmethod
    def from_datasets(cls, build_model, train: Dataset, val: Optional[Dataset] = None, **kw):
        return cls(build_model=build_model, dataset=shard_factory(train, val), **kw)


def shard_factory(train: Dataset, val: Optional[Dataset] = None) -> DatasetFactory:
    """Split whole datasets into equal contiguous shards, one per rank."""

    def factory(rank: int, num_nodes: int, split: str) -> Dataset:
        dataset = train if split == "train" else val
        if dataset is None:
            return Subset(train, [])
        return shard(dataset, rank, num_nodes, split)

    return factory


def shard(dataset: Dataset, rank: int, num_nodes: int, split: str = "train") -> Dataset:
    n = len(dataset)
    if n < num_nodes:
        raise ExoframeError(
            f"the {split} dataset has {n} examples, fewer than the {num_nodes} nodes: "
            f"every rank needs at least one. Use fewer nodes or more data.")
    per_rank = n // num_nodes
    return Subset(dataset, range(rank * per_rank, (rank + 1) * per_rank))


def call_with_params(factory, params: dict, what: str):
    """Call a factory with keyword params, turning unknown names into a clear error."""
    signature = inspect.signature(factory)
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    if not accepts_any:
        valid = [n for n, p in signature.parameters.items()
                 if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        for key in params:
            if key not in valid:
                raise ExoframeError(
                    f"{what}: unknown parameter '{key}'.{did_you_mean(key, valid)} "
                    f"Valid parameters: {', '.join(valid) or '(none)'}.")
    return factory(**params)
