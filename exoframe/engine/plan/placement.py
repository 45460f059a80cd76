"""Where each node runs, decided once per run (build_job calls place): each node's device,
the process group's backend, how many nodes share a process, and which ranks each forked
process runs. The launcher, the rank and the packing read the Placement; nothing else
decides. place() reads nothing itself: the machine's facts come in as a Machine.

On the CPU, a process per node up to a few per core; past that, nodes are packed, a worker
per core, exchanging in memory (engine/node/packing.py). On GPUs, nodes that share a GPU are
packed into one worker per GPU, whose nodes exchange on the device, whenever nodes
outnumber the GPUs; a worker is admitted only if its nodes' state fits its GPU's memory.
Packed nodes run under the simulator, launched here (not by torchrun).
"""
from __future__ import annotations

import bisect
import math
import os
import resource
from dataclasses import dataclass
from typing import Optional

import torch

from ...errors import ExoframeError
from . import devices
from .cluster_env import ClusterEnv
from .node_memory import NodeMemory

# A process per node up to this many nodes per core, and this many in all (forked ranks
# start in well under a second each and train in parallel; a gloo group is a full mesh);
# above it, nodes are packed, a worker per core.
PROCESS_PER_NODE_PER_CORE = 4
PROCESS_PER_NODE_UP_TO = 32
# Workers talk over a pipe per pair: this many at most, and as many as the open-file limit
# allows (the launcher holds both ends of every pipe until the fork).
MAX_WORKERS = 64
# A process per node (under --net real, or as asked): more than this many per core only
# thrashes (on 2 cores and 24 GiB, 128 ranks ran and 256 ran out of memory).
PROCESSES_PER_CORE = 64
# What a GPU holds beside its nodes' state: the worker's CUDA context and allocator slack,
# and on rank 0's GPU the evaluator's context and model.
GPU_RESERVED_BYTES = 2 * 2**30


@dataclass(frozen=True)
class Machine:
    """The facts of this machine a placement depends on."""
    cores: int
    gpu_memory: tuple = ()  # each visible GPU's memory, in bytes (None: unknown)
    open_files: int = 1024  # the most files a process may open (its hard limit)
    torchrun: Optional[ClusterEnv] = None  # set when torchrun started this process

    @property
    def gpus(self) -> int:
        return len(self.gpu_memory)

    @classmethod
    def current(cls, with_gpus: bool = True) -> "Machine":
        """This machine, read without initializing CUDA (with_gpus=False: no GPU query)."""
        return cls(os.cpu_count() or 1, devices.gpu_memory() if with_gpus else (),
                   open_files_limit(), ClusterEnv.from_environ())


@dataclass(frozen=True)
class Placement:
    nodes: int
    device: str  # resolved: cpu, mps, cuda or cuda:N (engine/plan/devices.py)
    # Nodes per worker process, exchanging in memory (engine/node/packing.py); None: a process
    # per node, exchanging through torch.distributed.
    nodes_per_process: Optional[int]
    backend: str  # the process group's: gloo, or nccl where every rank has a GPU of its own
    # The ranks of each process: consecutive ranks per worker where packed, else one each
    # (under torchrun, rank 0's launcher forks only the first; torchrun starts the others).
    groups: tuple
    gpus: int = 0  # the GPUs visible (device cuda: ranks or workers round-robin over them)
    in_process: bool = False  # every node in the launcher's process (engine/launch/hosting.py)
    offload: bool = False  # packed nodes' state in host memory between turns (node/offload.py)
    stacked: bool = False  # each worker's nodes as one stacked model (engine/node/stacked.py)

    @property
    def packed(self) -> bool:
        return self.nodes_per_process is not None

    def device_of(self, rank: int) -> torch.device:
        """The device `rank` trains on: a packed node its worker's (workers round-robin over
        the GPUs with --device cuda), else its own."""
        if self.packed:
            if self.device != "cuda":
                return torch.device(self.device)
            starts = [group[0] for group in self.groups]
            return torch.device("cuda", (bisect.bisect_right(starts, rank) - 1) % self.gpus)
        if self.device == "cuda":
            return torch.device("cuda", rank % self.gpus)
        return torch.device(self.device)


def place(nodes: int, asked: Optional[int], device: str, real_network: bool,
          device_asked: str = "", machine: Machine | None = None,
          memory: NodeMemory | None = None, in_process: bool = False,
          offload: bool = False, stacked: bool = False) -> Placement:
    """asked: the user's nodes_per_process (None: chosen here); device: resolved;
    device_asked: as the user gave it (for the error line); machine: this machine's facts
    (default: read now); memory: what a node and a worker keep on a GPU
    (engine/plan/node_memory.py), to admit nodes packed on a GPU; in_process: every node in
    the launcher's process, as one worker; offload: packed nodes keep their state in host
    memory between their turns; stacked: each worker's nodes train as one stacked model."""
    machine = machine or Machine.current(with_gpus=device.startswith("cuda"))
    torchrun = machine.torchrun
    if in_process:
        check_in_process(nodes, asked, device, real_network, machine)
        asked = nodes
    per_process = check_packing(nodes, asked, device, real_network, machine,
                                device_asked or device)
    if per_process is not None and device == "cuda" and asked is None:
        groups = split(nodes, min(nodes, gpus_used(device, machine)))  # a worker per GPU
        per_process = max(map(len, groups))
    else:
        groups = packed(nodes, per_process or 1)
    placement = Placement(nodes, device, per_process,
                          backend(device, torchrun.local_world_size if torchrun else nodes,
                                  machine.gpus),
                          tuple(map(tuple, groups)), machine.gpus, in_process, offload,
                          stacked)
    if offload:
        check_offload(placement, device_asked or device)
    if stacked:
        check_stacked(placement)
    if per_process is not None and device.startswith("cuda") and memory is not None:
        admit(placement, machine, memory)
    return placement


def split(nodes: int, parts: int) -> list[list[int]]:
    """Consecutive ranks in `parts` groups of near-equal sizes (the first ones larger)."""
    size, extra = divmod(nodes, parts)
    starts = [i * size + min(i, extra) for i in range(parts + 1)]
    return [list(range(starts[i], starts[i + 1])) for i in range(parts)]


def backend(device: str, nodes: int, gpus: int) -> str:
    """NCCL where every rank has a GPU of its own, else gloo (engine/plan/devices.py)."""
    if device == "cuda" and gpus >= nodes and torch.distributed.is_nccl_available():
        return "nccl"
    return "gloo"


def gpus_used(device: str, machine: Machine) -> int:
    return max(1, machine.gpus) if device == "cuda" else 1


def check_packing(nodes: int, asked: Optional[int], device: str, real_network: bool,
                  machine: Machine, device_asked: str) -> Optional[int]:
    """Nodes per process, where nodes are packed; None: a process per node."""
    torchrun, cores = machine.torchrun is not None, machine.cores
    gpu = device.startswith("cuda")
    if asked is None:
        if real_network or torchrun or device == "mps":
            per_process = 1
        elif gpu:  # a worker per GPU whenever nodes outnumber the GPUs
            used = gpus_used(device, machine)
            per_process = 1 if nodes <= used else math.ceil(nodes / used)
        else:
            per_process = nodes_per_process(nodes, None, cores, machine.open_files)
        if per_process > 1:
            return per_process
        if not torchrun and nodes > PROCESSES_PER_CORE * cores:
            why = "--net real" if real_network else f"--device {device_asked}"
            raise ExoframeError(
                f"nodes: {nodes} nodes are a process each with {why} (nodes share "
                f"processes only under the simulator), and this machine runs at "
                f"most {PROCESSES_PER_CORE} per CPU core ({cores} here): give at most "
                f"{PROCESSES_PER_CORE * cores}.")
        return None
    per_process = min(asked, nodes)
    workers = max_workers(machine.open_files)
    if math.ceil(nodes / per_process) > workers:
        raise ExoframeError(f"nodes_per_process: {nodes} nodes at {per_process} per "
                            f"process make more than {workers} workers, each with a pipe "
                            "to every other; give at least "
                            f"{math.ceil(nodes / workers)}, or leave it unset.")
    if device == "mps":
        raise ExoframeError("nodes_per_process: nodes share a process on the CPU or a CUDA "
                            "GPU; drop it (a process per node) or use --device cpu.")
    if real_network:
        raise ExoframeError("nodes_per_process: packed nodes run in turn, so the real network's "
                            "wall-clock would mix them; drop it with --net real.")
    if torchrun:
        raise ExoframeError("nodes_per_process: under torchrun each process is one rank; "
                            "drop it.")
    return per_process


def check_in_process(nodes: int, asked: Optional[int], device: str, real_network: bool,
                     machine: Machine):
    """Every node in this process: one worker, on the simulator, on the CPU or one GPU."""
    if asked is not None and asked < nodes:
        raise ExoframeError(f"in_process: every node runs in this process, as one worker; "
                            f"drop nodes_per_process or give it {nodes} (the nodes).")
    if real_network:
        raise ExoframeError("in_process: the nodes run in turn in one process, so the real "
                            "network's wall-clock would mix them; drop it with --net real.")
    if machine.torchrun is not None:
        raise ExoframeError("in_process: under torchrun each process is one rank; drop it.")
    if device == "mps":
        raise ExoframeError("in_process: the nodes share a process on the CPU or a CUDA GPU; "
                            "drop it or use --device cpu.")


def check_offload(placement: Placement, device_asked: str):
    """Offloading moves packed nodes' state between their GPU and host memory."""
    if not placement.device.startswith("cuda"):
        raise ExoframeError(f"offload: nodes' state moves between a CUDA GPU and host memory, "
                            f"and these nodes train on {device_asked or placement.device}, "
                            "where it already is; drop --offload or use --device cuda.")
    if not placement.packed or len(placement.groups) == placement.nodes:
        raise ExoframeError("offload: only nodes that take turns on a GPU (packed in a "
                            "worker) leave it between turns, and here each node is a process "
                            "of its own; drop --offload or give --nodes-per-process above 1.")


def check_stacked(placement: Placement):
    """Stacking trains a worker's packed nodes as one model."""
    if not placement.packed or len(placement.groups) == placement.nodes:
        raise ExoframeError("stack_replicas: only nodes packed in a worker train as one "
                            "stacked model, and here each node is a process of its own; drop "
                            "--stack-replicas or give --nodes-per-process above 1.")
    if placement.offload:
        raise ExoframeError("stack_replicas: stacked nodes keep their state in the stacked "
                            "model, on their device, so it cannot leave between turns; drop "
                            "--offload or --stack-replicas.")


# Under --offload a worker's GPU holds the whole state of the node whose turn it is, and
# room for one more: the next node's state regrows into the blocks the last one freed (in
# stream order: no copy is waited for), which the caching allocator may not fit exactly.
RESIDENT_WHEN_OFFLOADED = 2


def admit(placement: Placement, machine: Machine, memory: NodeMemory):
    """Refuse, in one line, a packing whose nodes' state does not fit their GPU (under
    --offload: what each node keeps there between turns, beside the running node's whole
    state and room for another's)."""
    per_gpu, workers, resident = {}, {}, {}
    for group in placement.groups:
        index = placement.device_of(group[0]).index or 0
        per_gpu[index] = per_gpu.get(index, 0) + len(group)
        workers[index] = workers.get(index, 0) + 1
        resident[index] = resident.get(index, 0) + min(RESIDENT_WHEN_OFFLOADED, len(group))

    def fits(index: int) -> int:
        free = machine.gpu_memory[index] - GPU_RESERVED_BYTES - workers[index] * memory.worker
        if not placement.offload:
            return max(0, free // memory.node)
        free -= resident[index] * memory.node
        if free < 0:
            return 0
        return free // memory.kept if memory.kept else per_gpu[index]

    known = [i for i in per_gpu if i < machine.gpus and machine.gpu_memory[i] is not None]
    for index in sorted(known):  # (where the driver did not say, CUDA's own error will)
        count, has = per_gpu[index], machine.gpu_memory[index]
        if count <= fits(index):
            continue
        if placement.offload:
            need = (f"with --offload keep about {gib(count * memory.kept)} there between "
                    f"turns (a strategy's other state and its part of an exchange in "
                    f"flight, {gib(memory.kept)} each) beside the running node's whole state "
                    f"and room for another's ({gib(memory.node)} each)")
        else:
            need = (f"need about {gib(count * memory.node)} for their parameters, gradients, "
                    f"optimizer and strategy state ({gib(memory.node)} each)")
        may_offload = not placement.offload and len(placement.groups) < placement.nodes
        fix = ("Give fewer nodes, a smaller model, or more GPUs (--device cuda)"
               + (", or --offload (each node's state in host memory between its turns)."
                  if may_offload else "."))
        raise ExoframeError(
            f"nodes: {count} nodes on GPU {index} {need}, and it has {gib(has)} "
            f"({gib(GPU_RESERVED_BYTES)} kept for the CUDA contexts and the evaluator, "
            f"{gib(memory.worker)} per worker for folding models to validate): {fits(index)} "
            f"fit there, {sum(map(fits, known))} on the GPUs used. {fix}")


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def open_files_limit() -> int:
    """The most files this process may open, once raised to the hard limit (launch does)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if hard == resource.RLIM_INFINITY or hard < soft else hard


def max_workers(open_files: int | None = None) -> int:
    """W workers' W(W-1)/2 pipes are W(W-1) descriptors in the launcher, with room left."""
    open_files = open_files_limit() if open_files is None else open_files
    return max(1, min(MAX_WORKERS, int(max(0, open_files - 256) ** 0.5)))


def nodes_per_process(nodes: int, asked: int | None, cores: int | None = None,
                      open_files: int | None = None) -> int:
    """On the CPU. asked: the user's --nodes-per-process (None: chosen from the node count
    and cores)."""
    if asked is not None:
        return min(asked, nodes)
    cores = cores or os.cpu_count() or 1
    if nodes <= min(PROCESS_PER_NODE_PER_CORE * cores, PROCESS_PER_NODE_UP_TO):
        return 1
    return math.ceil(nodes / min(cores, max_workers(open_files)))


def packed(nodes: int, per_process: int) -> list[list[int]]:
    """The ranks of each worker process: consecutive, per_process each (the last fewer)."""
    return [list(range(start, min(start + per_process, nodes)))
            for start in range(0, nodes, per_process)]
