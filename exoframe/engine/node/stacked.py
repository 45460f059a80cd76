"""A worker's nodes as one stacked model (--stack-replicas): every parameter and buffer of
the worker's N nodes is one tensor with a leading node dimension, and each node's model is a
copy of the workload's whose parameters and buffers are views of its slice. A step's
forward and backward passes run once for all the nodes, under torch.func.vmap; every node
then goes on with its own gradients (views too), optimizer and strategy, as an unstacked
node does, so the strategies, exchanges, clocks and records are the packed run's.

The nodes meet at each step's compute: each gives its batches and waits (packing.Hub.block)
until the last one is there, which computes for all; or until the simulator says that it
waits for that node (its clock paused: sim/clocks/protocol.py's Paused and Resume), which
then computes for the nodes there, the others later. One pass for N nodes is a few kernels
instead of N times as many: on a GPU, where nodes stepped in turn are bound by launching
kernels, it is the limit benchmarks/gpu_step_time.py calls "stacked"; on the CPU, the
batched matmuls are slower than N small ones.

What differs from the unstacked run, by design:
- the losses and gradients equal the unstacked ones to float tolerance, not bit for bit
  (batched kernels add in another order);
- random draws inside the model (dropout) come from a generator seeded by the run's seed,
  the first rank of the nodes computing together and the step, not from each node's;
- under --compute measured, each node is charged an equal share of the stacked compute.
Strategies declare that they may stack (Traits.stacks): they write parameters in place and
zero the gradients every step. The up-front checks are engine/plan/resolve.py's
check_stacking and engine/plan/placement.py's check_stacked."""
from __future__ import annotations

import contextlib
import copy
from typing import Callable

import torch
from torch.func import functional_call, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._pytree import tree_map

from ...errors import ExoframeError, shorten
from ...sim.clocks.clock import RankClock
from ...strategies.seeds import derive
from .loop import Precision, check_loss, to_device

# Attention kernels a stacked pass may use, by device type: on a GPU, torch's
# memory-efficient kernel rejects the strides vmap gives its backward pass; on the CPU, the
# flash kernel has no batching rule (vmap would loop over the nodes), and matmuls batch.
ATTENTION = {"cuda": [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH], "cpu": [SDPBackend.MATH]}


class StackedReplicas:
    """The stacked weights and buffers of a worker's nodes, their models (views), and the
    step's shared compute."""

    def __init__(self, model: torch.nn.Module, ranks: list, device: torch.device, seed: int,
                 block: Callable, shared: Callable):
        """block(ready): make the calling node wait until ready() holds; shared(ranks): a
        context whose compute is charged to those nodes in equal shares
        (packing.Hub.shared_compute)."""
        self.ranks, self.device, self.seed = list(ranks), device, seed
        self.row = {rank: index for index, rank in enumerate(self.ranks)}  # in the stack
        self.block, self.shared = block, shared
        self.base = copy.deepcopy(model).to(device)  # the template functional_call runs
        size = len(self.ranks)
        # (named_parameters lists a tied parameter once; functional_call ties it again)
        self.weights = {name: stack(p, size).requires_grad_(p.requires_grad)
                        for name, p in self.base.named_parameters()}
        self.buffers = {name: stack(b, size) for name, b in self.base.named_buffers()}
        self.models: dict[int, torch.nn.Module] = {}
        self.arrived: dict[int, dict] = {}  # step -> rank -> (its batches, clock), until computed
        self.paused: set[int] = set()  # the nodes whose clocks are paused
        self.computed: dict[int, int] = {}  # step -> how many nodes have computed it
        self.losses: dict[tuple, float] = {}  # (step, rank) -> its loss, until it takes it

        def loss_of(weights, buffers, batch):
            return functional_call(self.base, (weights, buffers), (batch,))
        self.vmapped = vmap(loss_of, randomness="different")

    def model_of(self, rank: int) -> torch.nn.Module:
        """The node's model: the workload's, its parameters and buffers views of its slice."""
        index = self.row[rank]
        memo = {id(p): torch.nn.Parameter(self.weights[name].detach()[index],
                                          requires_grad=p.requires_grad)
                for name, p in self.base.named_parameters()}
        memo.update({id(b): self.buffers[name][index]
                     for name, b in self.base.named_buffers()})
        model = copy.deepcopy(self.base, memo)  # (the memo's views stand for the base's)
        self.models[rank] = model
        return model

    def forward_backward(self, rank: int, batches, accumulate: int, precision: Precision,
                         step: int, clock: RankClock) -> float:
        """loop.forward_backward for one node of the stack: its mean loss, its gradients in
        its parameters' .grad, once every node of the worker has given its batches, or once
        the simulator waits for this node (clock.pause: its peers wait for the simulated
        network, which waits for it); then those that are here compute together."""
        arrived = self.arrived.setdefault(step, {})
        arrived[rank] = batches, clock
        if len(arrived) + self.computed.get(step, 0) < len(self.ranks):
            clock.pause(step)
            self.paused.add(rank)
            self.block(lambda: (step, rank) in self.losses or clock.resumed(step))
        if (step, rank) not in self.losses:
            self.compute_those_here(step, accumulate, precision)
        return self.losses.pop((step, rank))

    def compute_those_here(self, step: int, accumulate: int, precision: Precision):
        arrived = self.arrived.pop(step)
        ranks = sorted(arrived)
        # Their clocks go on now, said before anything this node says next: the simulator
        # must not take a paused clock for one that still waits (and resume another node
        # while this one's peers can still come without it).
        for rank in ranks:
            if rank in self.paused:
                self.paused.discard(rank)
                arrived[rank][1].go_on()
        computed = self.computed.get(step, 0) + len(ranks)
        if computed < len(self.ranks):
            self.computed[step] = computed
        else:
            self.computed.pop(step, None)
        losses = self.compute(ranks, [arrived[r][0] for r in ranks], accumulate, precision,
                              step)
        self.losses.update(((step, rank), loss) for rank, loss in zip(ranks, losses))

    def compute(self, ranks: list, every_batches: list, accumulate: int,
                precision: Precision, step: int) -> list:
        """The forward and backward passes of the nodes `ranks` over `accumulate`
        micro-batches, as one; each node's mean loss (as loop.forward_backward gives it)."""
        indices = [self.row[rank] for rank in ranks]
        for weight in self.weights.values():
            weight.grad = None  # (the nodes that computed before keep theirs: views)
        attention = ATTENTION.get(self.device.type, ATTENTION["cpu"])
        with self.shared(ranks), self.generators(ranks[0], step), sdpa_kernel(attention), \
                torch.enable_grad():
            total = None
            for _ in range(accumulate):
                weights, buffers = self.of_nodes(indices)
                losses = self.losses_of(weights, buffers, every_batches, precision, step)
                precision.backward(losses.sum() if accumulate == 1
                                   else (losses / accumulate).sum())
                self.keep_buffers(indices, buffers)
                losses = losses.detach().float()
                total = losses if total is None else total + losses
        for rank, index in zip(ranks, indices):
            for weight, p in zip(self.weights.values(), self.models[rank].parameters()):
                p.grad = None if weight.grad is None else weight.grad[index]
        values = (total if accumulate == 1 else total / accumulate).tolist()
        return [value + 0.0 for value in values]  # (a loss of -0.0 is logged 0.0)

    def of_nodes(self, indices: list) -> tuple[dict, dict]:
        """The stacked weights and buffers of the nodes at those indices: every node's, the
        tensors themselves; else copies of their rows, whose gradients land in the stacked
        ones' rows (and whose buffers keep_buffers writes back)."""
        if len(indices) == len(self.ranks):
            return self.weights, self.buffers
        index = torch.tensor(indices, device=self.device)
        return ({name: w[index] for name, w in self.weights.items()},
                {name: b[index] for name, b in self.buffers.items()})

    def keep_buffers(self, indices: list, buffers: dict):
        """What the pass wrote into copies of the nodes' buffers (BatchNorm's statistics),
        written back into their rows."""
        if buffers is self.buffers:
            return
        with torch.no_grad():
            for name, values in buffers.items():
                self.buffers[name][indices] = values

    def losses_of(self, weights: dict, buffers: dict, every_batches: list,
                  precision: Precision, step: int) -> torch.Tensor:
        """The nodes' losses on their next micro-batches, as one tensor."""
        batches = [to_device(next(batches), self.device) for batches in every_batches]
        try:
            batch = tree_map(lambda *parts: torch.stack(parts), *batches)
        except RuntimeError as e:
            raise ExoframeError(f"stack_replicas: the nodes' batches at step {step} cannot be "
                                f"stacked ({shorten(str(e))}); give batches of one shape "
                                "(keep --drop-last), or drop --stack-replicas.") from None
        try:
            with precision.autocast():
                losses = self.vmapped(weights, buffers, batch)
        except (ExoframeError, torch.OutOfMemoryError):
            raise
        except Exception as e:
            raise ExoframeError(f"stack_replicas: the model cannot run stacked under "
                                f"torch.func.vmap ({type(e).__name__}: {shorten(str(e))}); "
                                "drop --stack-replicas.") from e
        if not isinstance(losses, torch.Tensor) or losses.dim() != 1:
            check_loss(losses[0] if isinstance(losses, torch.Tensor) else losses, step)
        return losses

    @contextlib.contextmanager
    def generators(self, first: int, step: int):
        """Random generators for a stacked compute (dropout), seeded by the run's seed, its
        first node and the step: the same in every run of this seed; the running node's own
        are put back after."""
        cuda = self.device.type == "cuda"
        seed = derive(self.seed, first, step)
        with torch.random.fork_rng(devices=[self.device] if cuda else []):
            # (torch.manual_seed would also queue a seed for every GPU kind: rank.seed_rank)
            torch.default_generator.manual_seed(seed)
            if cuda:
                torch.cuda.manual_seed(seed)
            yield


def stack(tensor: torch.Tensor, size: int) -> torch.Tensor:
    """`size` copies of `tensor` along a new first dimension, in memory of their own."""
    return tensor.detach().unsqueeze(0).expand(size, *tensor.shape).clone(
        memory_format=torch.contiguous_format)

