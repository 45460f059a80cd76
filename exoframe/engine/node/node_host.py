"""What the process a node runs in gives the node: its device, how it exchanges tensors, the
timer its measured compute reads, and where its models go at evaluation steps.

Two hosts, both here: a process of its own (OwnProcess), which joins a torch process group;
and a worker shared with other nodes (PackedNode, run by engine/node/packing.py's hub), whose
nodes exchange in memory and take turns. The node's code (rank.py's train) is the same on both."""
from __future__ import annotations

import copy
import datetime
from typing import Callable, Iterable, Protocol

import torch
import torch.distributed as dist

from ...comm.exchange import Exchange, TorchExchange
from ...comm.memory import MemoryExchange
from ..ipc.messages import Rendezvous
from ..ipc.sender import Sender
from ..plan.job import Job
from . import model_state
from .loop import forward_backward
from .stacked import StackedReplicas


class NodeHost(Protocol):
    # The compute timer under --compute measured (None: the rank's thread's CPU time, or the
    # GPU's where the rank has one to itself: rank.make_clock).
    timer: Callable[[], float] | None

    def join(self, rank: int, job: Job) -> tuple[torch.device, Exchange, torch.nn.Module]:
        """The node's device, exchange and model (on that device), once the node starts."""

    def forward_backward(self, model, batches, accumulate: int, precision, device,
                         step: int, clock) -> float:
        """The step's forward and backward passes (engine/node/loop.py's forward_backward),
        or the node's part of its worker's stacked ones (engine/node/stacked.py), which
        may pause the node's simulated `clock` while it waits for the others."""

    def keeps(self, state: Callable[[], Iterable[torch.Tensor]]):
        """How to list the node's state (weights, gradients, optimizer and strategy state),
        once it has one: a packed node's may leave the GPU between its turns."""

    def add_models(self, strategy, rank: int, step: int, live: bool, held: bool,
                   replicas: bool, device):
        """The node's models at an evaluation step, on their way to the evaluator
        (engine/node/model_state.py)."""

    def close(self):
        """The node trained its last step: whatever it sent is on its way."""


class OwnProcess:
    """A node that is a process of its own: it joins the process group on its Placement's
    device and sends its models to the evaluator through its own pipe there (`evaluator`),
    or through `conn` (None: a rank on another machine, whose launcher relays them)."""

    timer = None

    def __init__(self, conn, evaluator):
        self.conn, self.sender = conn, None
        self.send = conn.send
        if evaluator is not None:  # written by a thread: the rank goes on while it is read
            self.sender = Sender()
            self.sender.start()
            self.send = self.sender.sender_for(evaluator)

    def join(self, rank: int, job: Job):
        torch.set_num_threads(job.threads)
        rendezvous = self.conn.recv()
        device = job.placement.device_of(rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL's communicator and the default CUDA stream
        exchange = TorchExchange(p2p_group=join_group(rank, job.nodes, rendezvous, device))
        return device, exchange, job.model.to(device)

    def forward_backward(self, model, batches, accumulate: int, precision, device, step: int,
                         clock) -> float:
        return forward_backward(model, batches, accumulate, precision, device, step)

    def keeps(self, state):
        pass  # (its GPU, if any, is its own: the state stays there)

    def add_models(self, *models):
        self.send(model_state.add_models(None, *models))

    def close(self):
        if self.sender is not None:
            self.sender.close()  # every model sent before the rank says it is done


def join_group(rank: int, world_size: int, rendezvous: Rendezvous,
               device: torch.device | None = None):
    """Meet the other ranks through a file in the launcher's private folder (no port), or
    under torchrun through its rendezvous store. Returns the group for point-to-point
    transfers when it is not the default group.

    NCCL makes its communicators eagerly here (device_id), but would make one per pair of
    ranks at their first send/recv, blocking until both are there, while the simulator may
    hold the peer back: under NCCL, point-to-point goes through a gloo group."""
    backend = rendezvous.backend
    timeout = datetime.timedelta(seconds=rendezvous.timeout_seconds)
    if rendezvous.tcp_store is not None:
        host, port, prefix = rendezvous.tcp_store
        store = dist.PrefixStore(prefix + "group/", dist.TCPStore(
            host, port, is_master=False, timeout=timeout))
    else:
        store = dist.FileStore(rendezvous.store_path, world_size)
    eager = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timeout, **eager)
    p2p_group = dist.new_group(backend="gloo") if backend == "nccl" else None
    # gloo's connect on a slow rank reads a socket its peer has already connected: a peer
    # with nothing to exchange (a 1-step local-SGD run) may finish and exit first, and the
    # slow rank fails with "Connection closed by peer". No rank leaves before all have met.
    dist.barrier(group=p2p_group)
    return p2p_group


class PackedNode:
    """A node's host in a worker of packed nodes (engine/node/packing.py): it exchanges in
    memory with the other nodes (comm/memory.py), its compute is timed over its own turns,
    and its models are added into the worker's fold (Hub.add_models). Its model is a view of
    a stacked one where the worker's nodes are stacked (`stacked`, engine/node/stacked.py)."""

    def __init__(self, node, gpu_timing: bool, stacked: StackedReplicas | None = None):
        """node: its packing.Node."""
        self.node, self.stacked = node, stacked
        self.timer = node.gpu_timer if gpu_timing else node.timer

    def keeps(self, state):
        self.node.state = state

    def join(self, rank: int, job):
        device = job.placement.device_of(rank)
        model = (self.stacked.model_of(rank) if self.stacked is not None
                 else copy.deepcopy(job.model).to(device))
        return device, MemoryExchange(rank, self.node.hub.pack), model

    def forward_backward(self, model, batches, accumulate: int, precision, device, step: int,
                         clock):
        if self.stacked is None:
            return forward_backward(model, batches, accumulate, precision, device, step)
        return self.stacked.forward_backward(self.node.rank, batches, accumulate, precision,
                                             step, clock)

    def add_models(self, *models):
        self.node.hub.add_models(*models)

    def close(self):
        pass  # (the hub sends the fold once every node's models are in)
