"""Where each node runs, decided once per run (build_job calls place): each node's device,
the process group's backend, how many nodes share a process, and which ranks each forked
process runs. The launcher, the rank and the packing read the Placement; nothing else
decides.

A process per node up to a few per core; past that, nodes are packed, a worker per core,
exchanging in memory (engine/packing.py). Packed nodes run on the CPU under the simulator,
launched here (not by torchrun).
"""
from __future__ import annotations

import math
import os
import resource
from dataclasses import dataclass
from typing import Optional

import torch

from ..errors import ExoframeError
from . import devices
from .cluster import ClusterEnv

# A process per node up to this many nodes per core, and this many in all (forked ranks
# start in well under a second each and train in parallel; a gloo group is a full mesh);
# above it, nodes are packed, a worker per core.
PROCESS_PER_NODE_PER_CORE = 4
PROCESS_PER_NODE_UP_TO = 32
# Workers talk over a pipe per pair: this many at most, and as many as the open-file limit
# allows (the launcher holds both ends of every pipe until the fork).
MAX_WORKERS = 64
# A process per node (on a GPU, under --net real): more than this many per core only
# thrashes (on 2 cores and 24 GiB, 128 ranks ran and 256 ran out of memory).
PROCESSES_PER_CORE = 64


@dataclass(frozen=True)
class Placement:
    nodes: int
    device: str  # resolved: cpu, mps, cuda or cuda:N (engine/devices.py)
    # Nodes per worker process, exchanging in memory (engine/packing.py); None: a process
    # per node, exchanging through torch.distributed.
    nodes_per_process: Optional[int]
    backend: str  # the process group's: gloo, or nccl where every rank has a GPU of its own
    # The ranks of each process: consecutive ranks per worker where packed, else one each
    # (under torchrun, rank 0's launcher forks only the first; torchrun starts the others).
    groups: tuple

    @property
    def packed(self) -> bool:
        return self.nodes_per_process is not None

    def device_of(self, rank: int) -> torch.device:
        """The device `rank` trains on (packed nodes: the CPU)."""
        return torch.device("cpu") if self.packed else devices.for_rank(self.device, rank)


def place(nodes: int, asked: Optional[int], device: str, real_network: bool,
          device_asked: str = "") -> Placement:
    """asked: the user's nodes_per_process (None: chosen here); device: resolved;
    device_asked: as the user gave it (for the error line)."""
    cluster = ClusterEnv.from_environ()
    per_process = check_packing(nodes, asked, device, real_network, cluster is not None,
                                device_asked or device)
    groups = packed(nodes, per_process or 1)
    backend = devices.backend(device, cluster.local_world_size if cluster else nodes)
    return Placement(nodes, device, per_process, backend, tuple(map(tuple, groups)))


def check_packing(nodes: int, asked: Optional[int], device: str, real_network: bool,
                  torchrun: bool, device_asked: str) -> Optional[int]:
    """Nodes per process, where nodes are packed; None: a process per node."""
    per_process = nodes_per_process(nodes, asked)
    if asked is None:
        if per_process > 1 and device == "cpu" and not real_network and not torchrun:
            return per_process
        cores = os.cpu_count() or 1
        if not torchrun and nodes > PROCESSES_PER_CORE * cores:
            why = "--net real" if real_network else f"--device {device_asked}"
            raise ExoframeError(
                f"nodes: {nodes} nodes are a process each with {why} (nodes share "
                f"processes on the CPU only, under the simulator), and this machine runs at "
                f"most {PROCESSES_PER_CORE} per CPU core ({cores} here): give at most "
                f"{PROCESSES_PER_CORE * cores}.")
        return None
    workers = max_workers()
    if math.ceil(nodes / per_process) > workers:
        raise ExoframeError(f"nodes_per_process: {nodes} nodes at {per_process} per "
                            f"process make more than {workers} workers, each with a pipe "
                            "to every other; give at least "
                            f"{math.ceil(nodes / workers)}, or leave it unset.")
    if device != "cpu":
        raise ExoframeError("nodes_per_process: nodes share a process on the CPU only; drop "
                            "it (a process per node on the GPU) or use --device cpu.")
    if real_network:
        raise ExoframeError("nodes_per_process: packed nodes run in turn, so the real network's "
                            "wall-clock would mix them; drop it with --net real.")
    if torchrun:
        raise ExoframeError("nodes_per_process: under torchrun each process is one rank; "
                            "drop it.")
    return per_process


def open_files_limit() -> int:
    """The most files this process may open, once raised to the hard limit (launch does)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if hard == resource.RLIM_INFINITY or hard < soft else hard


def max_workers() -> int:
    """W workers' W(W-1)/2 pipes are W(W-1) descriptors in the launcher, with room left."""
    return max(1, min(MAX_WORKERS, int(max(0, open_files_limit() - 256) ** 0.5)))


def nodes_per_process(nodes: int, asked: int | None, cores: int | None = None) -> int:
    """asked: the user's --nodes-per-process (None: chosen from the node count and cores)."""
    if asked is not None:
        return min(asked, nodes)
    cores = cores or os.cpu_count() or 1
    if nodes <= min(PROCESS_PER_NODE_PER_CORE * cores, PROCESS_PER_NODE_UP_TO):
        return 1
    return math.ceil(nodes / min(cores, max_workers()))


def packed(nodes: int, per_process: int) -> list[list[int]]:
    """The ranks of each worker process: consecutive, per_process each (the last fewer)."""
    return [list(range(start, min(start + per_process, nodes)))
            for start in range(0, nodes, per_process)]
