"""One rank's state in a checkpoint: what it takes for the rank to go on exactly as if it
had never stopped (see checkpoint.py)."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

from ...errors import ExoframeError
from ...files import disk_full, replacing
from .checkpoint import CheckpointFolder


class RankCheckpoints:
    """When a rank saves: at the first step end at or after a multiple of `every`, or
    after a step the launcher asked for (request), with no operation in flight."""

    def __init__(self, every: int | None, run_dir: str | None, rank: int = 0):
        self.every, self.rank = every, rank
        self.folder = CheckpointFolder(run_dir) if every is not None else None
        self.due_since = None  # the step a checkpoint became due, while it waits
        self.requested = None  # a step the launcher asked for, until saved at or after it
        self.warned = False

    def request(self, step: int, now: int) -> bool:
        """Save at or after `step`; False when this rank has ended a later step already
        (`now`): the ranks would save at different steps."""
        if now > step:
            return False
        self.requested = step if self.requested is None else max(self.requested, step)
        return True

    def save_now(self, step: int, comm) -> bool:
        if self.every is None:
            return False
        asked = self.requested is not None and step >= self.requested
        if self.due_since is None and (step % self.every == 0 or asked):
            self.due_since = step
        if self.due_since is None:
            return False
        if comm.in_flight() == 0:
            self.due_since = None
            if asked:
                self.requested = None
            return True
        if step - self.due_since >= self.every and not self.warned and self.rank == 0:
            self.warned = True
            print(f"warning: the checkpoint due at step {self.due_since} still waits at step "
                  f"{step}: an exchange is in flight at every step end (the strategy's "
                  "overlap); it is saved at the first step end with none.", file=sys.stderr)
        return False


def own_storage(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor, copied where it is a view of a larger storage (a stacked node's weights,
    engine/node/stacked.py): torch.save writes a view's whole storage."""
    if tensor.untyped_storage().nbytes() > tensor.numel() * tensor.element_size():
        return tensor.clone()
    return tensor


def capture(step: int, model, strategy, batches, clock, comm, precision) -> dict:
    return {
        "step": step,
        "model": {name: own_storage(t) for name, t in model.state_dict().items()},
        "strategy": strategy.state_dict(),
        "data": batches.state_dict(),
        "clock": clock.state_dict(),
        "traffic": comm.traffic.as_dict(),
        "loss_scale": precision.scaler.state_dict() if precision.scaler is not None else None,
        "rng": rng_states(),
        # simulated failures: who is down, and who was live at the last sync
        "faults": comm.faults.state_dict() if comm.faults is not None else None,
        "live": list(comm.live),
        "healing": comm.healing_state(),
    }


def restore(state: dict, model, strategy, batches, clock, comm, precision) -> int:
    """Put the rank back where `state` was taken; returns the step it ended."""
    model.load_state_dict(state["model"])
    strategy.load_state_dict(state["strategy"])
    # Loaded onto the rank's device: RNG states and the data order belong on the CPU.
    batches.load_state_dict(_on_cpu(state["data"]))
    clock.load_state_dict(state["clock"])
    comm.traffic.load_state_dict(state["traffic"])
    if precision.scaler is not None:
        precision.scaler.load_state_dict(state["loss_scale"])
    set_rng_states(_on_cpu(state["rng"]))
    if comm.faults is not None:
        comm.faults.load_state_dict(state["faults"])
        comm.live = tuple(state["live"])
        comm.load_healing_state(state["healing"])
    return state["step"]


def _on_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value)
    return value


def save(path: Path, state: dict):
    """Written whole or not at all (exoframe.files.replacing); a full disk is one line."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path, "wb") as f:
            torch.save(state, f)
    except Exception as e:
        full = disk_full(e)
        if full is None:
            raise
        raise ExoframeError(f"{path} could not be written: {full.strerror.lower()}. Free some "
                            "space on that disk (or give --out on another), or checkpoint less "
                            "often (--checkpoint-every).") from None


def load(path, device: torch.device, mmap: bool = False) -> dict:
    """mmap: leave the tensors in the file, read only where used (the launcher's checks)."""
    try:
        return torch.load(path, map_location=device, weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise ExoframeError(f"checkpoint file {path} is missing: the checkpoint is incomplete "
                            "(a machine crash before it reached the disk?); the run cannot "
                            "be resumed from it.") from None
    except Exception as e:
        raise ExoframeError(f"checkpoint file {path} cannot be read ({type(e).__name__}: "
                            f"{str(e)[:200]}); it is corrupt or was written by another "
                            "version.") from None


def rng_states() -> dict:
    states = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:  # as plain values: checkpoints load with weights_only
        name, keys, position, has_gauss, gauss = numpy.random.get_state()
        states["numpy"] = [name, keys.tolist(), int(position), int(has_gauss), float(gauss)]
    return states


def set_rng_states(states: dict):
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_initialized():
        torch.cuda.set_rng_state_all(states["cuda"])
    numpy = sys.modules.get("numpy")
    if "numpy" in states and numpy is not None:
        name, keys, position, has_gauss, gauss = states["numpy"]
        numpy.random.set_state((name, numpy.array(keys, dtype=numpy.uint32), position,
                                has_gauss, gauss))

