"""The devices asked for and what this machine has.

`cpu`, `mps`, `cuda:N` (every node on GPU N), `cuda` (nodes spread over the visible GPUs),
or `auto` (cuda if present, else mps, else cpu).

Which rank or worker goes on which GPU, and the backend, are the Placement's
(engine/plan/placement.py): nodes that share a GPU are packed into one worker per GPU.

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

from ...errors import ExoframeError


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


def gpu_memory() -> tuple:
    """Each visible GPU's memory in bytes (None where the driver does not say), read through
    nvidia-smi without initializing CUDA in this process; () without a GPU."""
    count = gpu_count()
    if not count:
        return ()
    try:
        lines = subprocess.run(["nvidia-smi", "--query-gpu=memory.total",
                                "--format=csv,noheader,nounits"], capture_output=True,
                               text=True, timeout=20).stdout.split()
        every = [int(line) * 2**20 for line in lines]
    except (OSError, subprocess.SubprocessError, ValueError):
        return (None,) * count
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        order = [int(i) for i in visible.split(",")] if visible else range(len(every))
        return tuple(every[i] for i in order)[:count] + (None,) * (count - len(every))
    except (ValueError, IndexError):  # GPU UUIDs, or an index the driver does not list
        return (None,) * count


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
