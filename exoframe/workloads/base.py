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

# EXO Gym's factories take (rank, num_nodes, train_dataset: bool) instead of a split name.
BOOL_SPLIT_NAMES = {"train", "train_dataset", "is_train", "training", "is_training"}


@dataclass
class Workload:
    """A model builder plus per-rank data. Returned by workload factories (`--workload`)."""

    build_model: Callable[[], torch.nn.Module]
    dataset: DatasetFactory
    batch_size: int = 32
    lr: float = 1e-3
    best_loss: Optional[float] = None  # the best achievable validation loss, when known
    name: str = "custom"
    # metrics(model, batch) -> {name: number} on a validation batch (e.g. accuracy),
    # reported next to val_loss as val_<name>, averaged over examples.
    metrics: Optional[Callable[[torch.nn.Module, object], dict]] = None
    tokens_per_sample: Optional[int] = None  # for "tokens seen" in the summary

    def __post_init__(self):
        self.dataset = split_factory(self.dataset)

    @classmethod
    def from_datasets(cls, build_model, train: Dataset, val: Optional[Dataset] = None, **kw):
        return cls(build_model=build_model, dataset=shard_factory(train, val), **kw)


def split_factory(factory) -> DatasetFactory:
    """`factory` as a (rank, num_nodes, split) factory: one written for EXO Gym, whose third
    parameter is a bool, gets True for "train" and False for "val" (the string "val" is
    truthy: passed as is, validation would silently run on training data)."""
    if takes_bool_split(factory):
        def bool_split(rank: int, num_nodes: int, split: str) -> Dataset:
            return factory(rank, num_nodes, split == "train")
        return bool_split
    return factory


def takes_bool_split(factory) -> bool:
    """Whether the factory's third parameter is a train flag: annotated bool, defaulting to
    a bool, or named like one (train, train_dataset, is_train, ...)."""
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):  # a callable without an inspectable signature
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 3:
        return False
    third = positional[2]
    # Under `from __future__ import annotations` the annotation is the string "bool".
    return (third.annotation in (bool, "bool") or isinstance(third.default, bool)
            or third.name in BOOL_SPLIT_NAMES)


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
