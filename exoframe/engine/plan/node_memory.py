"""How much GPU memory one packed node needs, estimated from the built model before anything
starts (engine/plan/placement.py admits nodes on a GPU by it).

A node keeps its weights, their gradients, its optimizer's state and its strategy's copies
(DiLoCo's global model and outer momentum, a compressor's error feedback): counted here as
slots of the parameters' size; a worker adds its folds of the models it sends to validation.
Activations live only during the node's own step (nodes step in turn), so they are one
node's at a time, within the GPU's reserve.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...host_memory import check_fits, gigabytes

# Optimizer state, in parameter-sized slots: Adam's two moments; SGD's momentum buffer.
OPTIMIZER_SLOTS = {"adamw": 2, "adam": 2, "nadam": 2, "radam": 2, "adamax": 2, "muon": 2,
                   "sgd": 1, "rmsprop": 1, "adagrad": 1}
STRATEGY_SLOTS = 2  # the most a built-in strategy keeps beside the model (DiLoCo's two)


# A worker's folds of its nodes' models at an evaluation step (engine/node/model_state.py): the
# held model and the current weights in float64 (two slots each), the last held model sent,
# and a float32 copy on its way to the host.
WORKER_SLOTS = 6


# What a node keeps on its GPU while its state is offloaded (engine/node/offload.py moves
# the weights, gradients, optimizer state and what the strategy gives a node back from a
# failure, such as DiLoCo's global model), in parameter-sized slots: a strategy's other
# state (a streaming fragment's global copy and momentum, error feedback), and its part of
# an exchange in flight, which stays while the exchange holds it.
KEPT_WHEN_OFFLOADED_SLOTS = STRATEGY_SLOTS + 1


@dataclass(frozen=True)
class NodeMemory:
    node: int  # bytes one node keeps on its GPU between its steps
    worker: int  # bytes a worker of packed nodes keeps beside them
    kept: int = 0  # bytes a node keeps on its GPU between its turns under --offload


def node_memory(model: torch.nn.Module, optimizer: str) -> NodeMemory:
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    slots = 2 + OPTIMIZER_SLOTS.get(optimizer.lower(), 2) + STRATEGY_SLOTS  # weights, grads
    return NodeMemory(params * slots + buffers, params * WORKER_SLOTS,
                      params * KEPT_WHEN_OFFLOADED_SLOTS)


# Pinned host memory comes in blocks of a power of two bytes (torch's host allocator): an
# offloaded node's state may take up to twice its size there.
PINNED_ROUNDING = 2


def check_host_memory(model: torch.nn.Module, optimizer: str, nodes: int, nodes_on_host: bool,
                      sized_by: str, pinned: bool = False):
    """The launcher's and the evaluator's copies of `model` and, for nodes on the CPU (or
    an Apple GPU, which shares its memory, or offloaded to pinned memory: `pinned`), every
    node's (node_memory), against this machine's free memory. sized_by: the input that
    decided the model's size."""
    size = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    who = f"{nodes} nodes with {optimizer}'s state" if nodes_on_host else "its copies"
    per_node = node_memory(model, optimizer).node * (PINNED_ROUNDING if pinned else 1)
    check_fits(f"{sized_by}, a model of {sum(p.numel() for p in model.parameters()):,} "
               f"parameters (~{gigabytes(size)}); {who} need",
               2 * size + (nodes * per_node if nodes_on_host else 0),
               "give a smaller model (-w) or fewer nodes (--nodes)")
