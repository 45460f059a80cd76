"""Which device each rank trains on.

`cpu`, `mps`, `cuda:N` (every rank on GPU N), `cuda` (ranks spread over the visible GPUs
round-robin: rank r on GPU r mod count, so 8 ranks on 1 GPU share it), or `auto` (cuda if
present, else mps, else cpu).

The backend: NCCL when every rank has a GPU of its own (`cuda` with at least as many GPUs
as nodes); otherwise gloo, which exchanges host memory: a GPU tensor then travels through
a host copy (exoframe/comm/communicator.py). NCCL refuses two ranks on one GPU, the usual
case when many simulated nodes share a GPU. Both bind to loopback only.

The launcher asks only how many devices exist, through NVML, and never initializes CUDA
itself: the ranks are forked from it, and a forked process cannot use CUDA that its parent
initialized (torch.cuda.is_available() alone would poison the fork).
"""
from __future__ import annotations

import os
import subprocess

import torch

# torch counts GPUs through NVML, without touching the CUDA runtime, when this is set.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")


def gpu_count() -> int:
    """Visible CUDA GPUs, counted without initializing CUDA in this process."""
    return torch.cuda.device_count() if torch.backends.cuda.is_built() else 0

from ..errors import ExoframeError


def resolve(spec: str) -> str:
    """`spec` with `auto` decided, checked against what this machine has."""
    kind, _, index = spec.partition(":")
    if kind == "auto":
        return "cuda" if gpu_count() else "mps" if _has_mps() else "cpu"
    if kind == "cuda":
        if not gpu_count():
            raise ExoframeError(f"device: '{spec}' asked for, but torch sees no CUDA GPU here "
                                "(a CPU build of torch, or no driver); use --device cpu or auto.")
        if index and int(index) >= gpu_count():
            raise ExoframeError(f"device: '{spec}' asked for, but this machine has "
                                f"{gpu_count()} GPU(s): cuda:0 to cuda:{gpu_count() - 1}.")
    if kind == "mps" and not _has_mps():
        raise ExoframeError("device: 'mps' asked for, but torch sees no Apple GPU here; use "
                            "--device cpu or auto.")
    return spec


def backend(spec: str, nodes: int) -> str:
    """The process group's backend for a resolved device spec."""
    if spec == "cuda" and gpu_count() >= nodes and torch.distributed.is_nccl_available():
        return "nccl"
    return "gloo"


def for_rank(spec: str, rank: int) -> torch.device:
    """The device of `rank` for a resolved spec."""
    if spec == "cuda":
        return torch.device("cuda", rank % gpu_count())
    return torch.device(spec)


def _has_mps() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def gpu_model() -> str | None:
    """The first GPU's product name as the driver reports it (e.g. 'NVIDIA H100 80GB HBM3'),
    read without initializing CUDA in this process; None without an NVIDIA GPU."""
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return None
    return names[0].strip() or None


def gpu_timer(device: torch.device):
    """Seconds of GPU time on `device` since the timer was made, read with CUDA events (the
    `measured` compute model on a GPU: CPU time would miss the kernels)."""
    start = torch.cuda.Event(enable_timing=True)
    start.record()

    def seconds() -> float:
        now = torch.cuda.Event(enable_timing=True)
        now.record()
        now.synchronize()
        return start.elapsed_time(now) / 1000
    return seconds
