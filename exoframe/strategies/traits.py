"""What a strategy declares about itself, read by the engine, the simulator and the report:
one record per strategy class, `traits = Traits(...)`. A subclass of a strategy inherits its
traits; one that changes some writes `traits = dataclasses.replace(Parent.traits, ...)`."""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Traits:
    #: True when the strategy's numerics depend on simulated timing (async methods).
    timing_dependent: bool = False
    #: True when each step's exchange is the all-reduce of the gradients computed by that
    #: step's backward pass, which real DDP overlaps with the backward pass (in buckets):
    #: projections to larger models model that overlap.
    gradient_all_reduce_after_backward: bool = False
    #: True when the strategy's outer synchronization, an all-reduce right after the compute
    #: of the steps that have one (DiLoCo's outer gradient, Streaming DiLoCo's fragments), is
    #: one a real implementation would overlap with that step's backward pass (inner step and
    #: outer gradient computed layer by layer as the backward produces gradients):
    #: projections stream it in buckets during the backward pass, where that is not slower
    #: than sending it after the compute (sim/traces/projection.py).
    outer_sync_overlaps_backward: bool = False
    #: False when a run with this strategy cannot be checkpointed: its state is more than
    #: state_dict() holds at any step end with no exchange in flight
    #: (engine/records/checkpoint.py).
    checkpointable: bool = True
    #: True when the strategy goes on through simulated node failures: every exchange it
    #: makes is inside `with self.sync():` (see exoframe/comm/rank_failures.py).
    survives_failures: bool = False
    #: True when the strategy makes remote calls (exoframe.distributed): its ranks then
    #: serve calls at each step end and, after the last step, until every rank is done.
    remote_calls: bool = False
    #: True when every rank holds the same parameters at the end of each step that ran a
    #: `with self.sync():` block (DDP, DiLoCo, local SGD): the engine then compares their
    #: checksums at those steps and stops the run, naming the ranks, if they differ.
    #: Subclasses inherit it: one that keeps ranks apart sets it False.
    replicas_equal_after_sync: bool = False
    #: True when a worker's nodes may train as one stacked model (--stack-replicas,
    #: engine/node/stacked.py): the strategy writes the model's parameters and buffers only in
    #: place (never rebinding `.data`), zeroes the gradients in every step, and runs no
    #: forward or backward pass of its own. Subclasses inherit it.
    stacks: bool = False
    #: The model a node would deploy, which the run validates and reports (val_loss, time to
    #: target, result.model): each node's `held_weights()`, taken over the nodes as
    #: `held_model_from` says: "average" (their mean) or "rank0" (the lowest live rank's).
    #: By default, the mean of the current weights: "replicas' average" (docs/strategies.md).
    held_model_from: str = "average"
    #: That model in words, for summary.json's `validated_model` and the tables.
    held_model: str = "replicas' average"



TRAIT_NAMES = frozenset(f.name for f in fields(Traits))
