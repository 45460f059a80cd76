"""This machine's free memory, against which what input decides (a vocabulary, a model times
the nodes, a dataset read whole) is estimated before anything is allocated: a run that
would not fit is one line, not the kernel's out-of-memory killer."""
from __future__ import annotations

from pathlib import Path

from .errors import ExoframeError


def free_bytes() -> int | None:
    """MemAvailable, within this cgroup's limit if it has one; None where unknown."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        free = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    try:  # cgroup v2 ("max" when unlimited: no limit here)
        folder = Path("/sys/fs/cgroup")
        limit = int((folder / "memory.max").read_text()) - int(
            (folder / "memory.current").read_text())
        return max(0, min(free, limit))
    except (OSError, ValueError):
        return free


def gigabytes(size: float) -> str:
    if size < 1e9:
        return f"{size / 1e6:.0f} MB"
    return f"{size / 1e9:.0f} GB" if size >= 10e9 else f"{size / 1e9:.1f} GB"


def check_fits(what: str, need: float, fix: str):
    """Refuse `need` bytes beyond the free memory: '{what} ~N GB; this machine has M GB free:
    {fix}.'"""
    free = free_bytes()
    if free is not None and need > free:
        raise ExoframeError(f"{what} ~{gigabytes(need)}; this machine has {gigabytes(free)} "
                            f"free: {fix}.")
