"""How a training set is split over the nodes (`--partition`), seeded by the run's seed:

- `iid` (default): equal contiguous shards, rank r the r-th;
- `dirichlet:ALPHA`: label skew; each class is divided over the nodes in proportions drawn
  from Dirichlet(ALPHA, ..., ALPHA) (small ALPHA: a node sees few classes);
- `shards:K`: pathological label skew (FedAvg's): the examples sorted by label are cut into
  nodes × K equal shards and each node gets K of them at random;
- `quantity:ALPHA`: i.i.d. examples, power-law sizes: node sizes proportional to
  1, 2^-ALPHA, 3^-ALPHA, ... in a random order (ALPHA = 0: equal sizes).

A partition that cannot be made is one line (PartitionError), raised before any rank starts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .errors import ExoframeError, did_you_mean, shorten

KINDS = ("iid", "dirichlet", "shards", "quantity")
NEEDS_LABELS = ("dirichlet", "shards")
FORMS = "iid, dirichlet:ALPHA, shards:K or quantity:ALPHA"
DIRICHLET_DRAWS = 10  # draws before giving up on one that leaves no node empty


@dataclass(frozen=True)
class Partition:
    kind: str
    value: Optional[float] = None  # ALPHA, or K for shards

    def __str__(self):
        if self.value is None:
            return self.kind
        return f"{self.kind}:{int(self.value) if self.kind == 'shards' else self.value:g}"


def parse_partition(text) -> Partition:
    """`iid`, `dirichlet:0.5`, `shards:2`, `quantity:1.5`, or one line saying what is wrong."""
    if not isinstance(text, str):
        raise ExoframeError(f"partition: expected {FORMS}, got {shorten(text)}.")
    kind, sep, value = text.strip().partition(":")
    if kind not in KINDS:
        raise ExoframeError(f"partition: unknown kind '{shorten(kind)}'.{did_you_mean(kind, KINDS)}"
                            f" Use {FORMS}.")
    if kind == "iid":
        if sep:
            raise ExoframeError(f"partition: iid takes no value, got '{shorten(text)}'.")
        return Partition("iid")
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if kind == "shards":
        if not (number.is_integer() and number >= 1):
            raise ExoframeError(f"partition: shards:K needs a whole number K >= 1 of label "
                                f"shards per node, got '{shorten(text)}'.")
        return Partition("shards", int(number))
    if not (np.isfinite(number) and (number > 0 if kind == "dirichlet" else number >= 0)):
        limit = "> 0" if kind == "dirichlet" else ">= 0"
        raise ExoframeError(f"partition: {kind}:ALPHA needs a number ALPHA {limit}, got "
                            f"'{shorten(text)}'.")
    return Partition(kind, number)


def partition_indices(partition: Partition, size: int, num_nodes: int,
                      labels: Optional[np.ndarray], seed: int) -> list:
    """Each node's training example indices (sorted), every node with at least one: a range
    for iid (a large dataset's indices are not spelled out), else an array."""
    if size < num_nodes:
        raise ExoframeError(f"partition: the training set has {size} examples, fewer than the "
                            f"{num_nodes} nodes: every node needs at least one. Use fewer nodes "
                            "or more data.")
    if partition.kind in NEEDS_LABELS and labels is None:
        raise ExoframeError(f"partition: {partition} splits by label, and this training set "
                            "has none (a workload gives them with Workload.from_datasets("
                            "labels=...) or a TensorDataset whose last tensor holds integer "
                            "labels); use iid or quantity:ALPHA.")
    rng = np.random.default_rng(seed)
    if partition.kind == "iid":
        per_node = size // num_nodes
        return [range(r * per_node, (r + 1) * per_node) for r in range(num_nodes)]
    if partition.kind == "dirichlet":
        return dirichlet(labels, num_nodes, partition.value, rng)
    if partition.kind == "shards":
        return label_shards(labels, num_nodes, int(partition.value), rng)
    return quantity(size, num_nodes, partition.value, rng)


def cut(count: int, proportions: np.ndarray) -> np.ndarray:
    """`count` items split in `proportions` (summing to 1): floor of the cumulative shares."""
    cuts = (np.cumsum(proportions)[:-1] * count).astype(np.int64)
    return np.diff(np.concatenate([[0], cuts, [count]]))


def dirichlet(labels: np.ndarray, num_nodes: int, alpha: float, rng) -> list[np.ndarray]:
    classes = np.unique(labels)
    members = [np.flatnonzero(labels == c) for c in classes]
    for _ in range(DIRICHLET_DRAWS):
        shares = rng.dirichlet(np.full(num_nodes, alpha), size=len(classes))  # class x node
        counts = np.stack([cut(len(m), p) for m, p in zip(members, shares)])
        if counts.sum(0).min() > 0:
            break
    else:
        raise ExoframeError(
            f"partition: dirichlet:{alpha:g} left a node with no examples in "
            f"{DIRICHLET_DRAWS} draws ({num_nodes} nodes, {len(labels)} examples, "
            f"{len(classes)} classes); raise ALPHA, use fewer nodes or more data.")
    parts = [[] for _ in range(num_nodes)]
    for m, row in zip(members, counts):
        for node, piece in enumerate(np.split(rng.permutation(m), np.cumsum(row)[:-1])):
            parts[node].append(piece)
    return [np.sort(np.concatenate(p)) for p in parts]


def label_shards(labels: np.ndarray, num_nodes: int, k: int, rng) -> list[np.ndarray]:
    count = num_nodes * k
    if len(labels) < count:
        raise ExoframeError(f"partition: shards:{k} cuts {num_nodes} nodes x {k} = {count} "
                            f"shards from {len(labels)} examples; give fewer shards or nodes.")
    order = rng.permutation(len(labels))
    order = order[np.argsort(labels[order], kind="stable")]  # by label, ties at random
    shard_size = len(labels) // count
    shards = order[:shard_size * count].reshape(count, shard_size)
    chosen = rng.permutation(count).reshape(num_nodes, k)
    return [np.sort(shards[row].ravel()) for row in chosen]


def quantity(size: int, num_nodes: int, alpha: float, rng) -> list[np.ndarray]:
    weights = (np.arange(num_nodes) + 1.0) ** -alpha
    weights = weights[rng.permutation(num_nodes)]
    sizes = 1 + cut(size - num_nodes, weights / weights.sum())  # at least one each
    pieces = np.split(rng.permutation(size), np.cumsum(sizes)[:-1])
    return [np.sort(p) for p in pieces]


def describe(partition: Partition, seed: int, parts: list[np.ndarray],
             labels: Optional[np.ndarray]) -> dict:
    """What summary.json records: each node's size, and its label histogram when there are
    labels (counts per class, classes in sorted order)."""
    record = {"partition": str(partition), "seed": seed, "sizes": [len(p) for p in parts]}
    if labels is not None:
        classes, codes = np.unique(labels, return_inverse=True)
        record["classes"] = classes.tolist()
        record["label_histograms"] = [
            np.bincount(codes[slice(p.start, p.stop) if isinstance(p, range) else p],
                        minlength=len(classes)).tolist() for p in parts]
    return record
