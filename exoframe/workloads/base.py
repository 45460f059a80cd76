"""What a rank trains: a model whose forward(batch) returns a scalar loss, and its data."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
from torch.utils.data import Dataset, Subset, TensorDataset

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
    # The input that decided the model's size, named where the run would not fit in memory
    # (e.g. "data: the largest token id 9 makes a vocabulary of 10").
    sized_by: Optional[str] = None

    def __post_init__(self):
        self.dataset = split_factory(self.dataset)

    @classmethod
    def from_datasets(cls, build_model, train: Dataset, val: Optional[Dataset] = None,
                      labels=None, **kw):
        """labels: the training examples' integer labels, for --partition's label skews."""
        return cls(build_model=build_model, dataset=shard_factory(train, val, labels), **kw)


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


def shard_factory(train: Dataset, val: Optional[Dataset] = None, labels=None) -> "Shards":
    """Split whole datasets into equal contiguous shards, one per rank (the training set may
    be partitioned otherwise: --partition). labels: the training examples' integer labels,
    for label-skew partitions (default: a TensorDataset's last tensor, when integer)."""
    return Shards(train, val, labels)


class Shards:
    """A DatasetFactory over whole datasets: rank r gets the r-th of equal contiguous shards
    of each split, or, once partitioned, the training examples its partition names."""

    def __init__(self, train: Dataset, val: Optional[Dataset] = None, labels=None,
                 parts: Optional[list] = None):
        self.train, self.val, self._labels = train, val, labels
        self.parts = parts  # per-rank training indices (torch.long), or None: equal shards

    def __call__(self, rank: int, num_nodes: int, split: str) -> Dataset:
        if split == "train" and self.parts is not None:
            return Subset(self.train, self.parts[rank])
        dataset = self.train if split == "train" else self.val
        if dataset is None:
            return Subset(self.train, [])
        return shard(dataset, rank, num_nodes, split)

    def labels(self):
        """The training labels as a 1-D integer numpy array, or None when there are none."""
        labels = self._labels
        if labels is None:
            labels = labels_of(self.train)
        if labels is None:
            return None
        labels = np.asarray(labels)
        if labels.ndim != 1 or len(labels) != len(self.train) or labels.dtype.kind not in "iub":
            raise ExoframeError(f"partition: the training labels must be one integer per "
                                f"example ({len(self.train)}), got an array of shape "
                                f"{labels.shape} and type {labels.dtype}.")
        return labels

    def partitioned(self, parts: list) -> "Shards":
        return Shards(self.train, self.val, self._labels,
                      [torch.as_tensor(p, dtype=torch.long) for p in parts])


def labels_of(dataset: Dataset):
    """A dataset's integer labels: a TensorDataset's last tensor (1-D, integer, beside the
    inputs), or a `targets` / `labels` attribute (torchvision's convention)."""
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) >= 2:
        last = dataset.tensors[-1]
        if last.dim() == 1 and not last.is_floating_point() and not last.is_complex():
            return last.numpy()
        return None
    for name in ("targets", "labels"):
        value = getattr(dataset, name, None)
        if value is not None and not callable(value):
            return value.numpy() if isinstance(value, torch.Tensor) else value
    return None


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
