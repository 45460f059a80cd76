"""DDP: average gradients across ranks every step, then take a local optimizer step.

Update: g = mean_r(g_r); θ ← opt(θ, g). Every rank ends each step with identical weights.
Buffers (BatchNorm statistics and counters) are broadcast from rank 0 every step, as torch's
DistributedDataParallel does (broadcast_buffers=True), so ranks end each step identical.
Bytes per step: one all-reduce of the full gradient, plus one broadcast of the buffers' bytes
when the model has buffers.
"""
from dataclasses import dataclass

from .base import Strategy
from .traits import Traits


class DDP(Strategy):
    """Data parallel: all-reduce (mean) of gradients every step."""

    traits = Traits(
        gradient_all_reduce_after_backward=True,
        stacks=True,
        survives_failures=True,
        replicas_equal_after_sync=True,
        held_model="replicas' model (equal on every node)")

    @dataclass
    class Params:
        pass

    def step(self):
        with self.sync():
            self.average_gradients()
            # After the gradient all-reduce, so that a projection still sees that all-reduce
            # right after the step's compute and splits it into buckets.
            self.broadcast_buffers()
            self.optimizer.step()
            self.optimizer.zero_grad()
