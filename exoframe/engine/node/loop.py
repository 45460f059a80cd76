"""The pieces of one training step that surround the strategy: precision, micro-batches,
clipping and the learning rate. engine/node/rank.py strings them together:

    lr = set_lr(strategy, ...)                     # the schedule's lr for this step
    loss = forward_backward(model, batches, ...)   # K micro-batches, gradients accumulated
    grad_norm = precision.unscale_and_clip(...)    # local gradients, before the strategy
    strategy.step()                                # replaces optimizer.step()
    precision.update()
"""
from __future__ import annotations

import contextlib
import copy
import math

import torch

from ...errors import ExoframeError


def to_device(batch, device: torch.device):
    """The batch (a tensor, or tuples, lists and dicts of them) on `device`."""
    if device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


@contextlib.contextmanager
def tf32_matmuls():
    """CUDA matmuls of fp32 tensors in TF32 inside, and convolutions (which torch runs in
    TF32 by default), as in any process that sets torch's allow_tf32 flags (EXO Gym does).
    The flags are process-wide, so they are put back on leaving: validation and the user's
    own code keep their matmuls in fp32."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn
    before = matmul.allow_tf32, conv.allow_tf32
    matmul.allow_tf32 = conv.allow_tf32 = True
    try:
        yield
    finally:
        matmul.allow_tf32, conv.allow_tf32 = before


class Precision:
    """fp32; tf32 (fp32, the forward and backward passes' CUDA matmuls in TF32); bf16
    (autocast); fp16 (autocast and a dynamic loss scale, torch's GradScaler).

    With fp16, a step whose unscaled local gradients overflow contributes zero gradients on
    that rank and the scale is halved. Unlike GradScaler, which skips the optimizer step,
    the strategy still runs (so every rank's exchanges stay matched): its optimizer steps
    with zero local gradients (Adam's moments decay, momentum carries on)."""

    DTYPES = {"fp32": None, "tf32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

    def __init__(self, name: str, device: torch.device):
        self.name, self.device_type = name, device.type
        self.dtype = self.DTYPES[name]
        self.scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None
        # what holds both passes besides autocast: TF32 matmuls, or nothing
        self.passes = tf32_matmuls if name == "tf32" else contextlib.nullcontext

    def autocast(self):
        if self.dtype is None:  # fp32, tf32: autocast(enabled=False) would do nothing, at ~3 µs
            return self.passes()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor):
        with self.passes():
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale_and_clip(self, optimizer, params, max_norm) -> float | None:
        """Unscale the local gradients (fp16), clip their total norm to `max_norm` (None: no
        clipping) and return the norm before clipping (None when neither applies)."""
        if max_norm is None and self.scaler is None:
            return None
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        with_grad = [p for p in params if p.grad is not None]
        norm = float(torch.nn.utils.clip_grad_norm_(with_grad, max_norm or math.inf))
        if self.scaler is not None and not math.isfinite(norm):
            for p in with_grad:
                p.grad.zero_()
        return norm

    def update(self):
        if self.scaler is not None:
            self.scaler.update()

    def metrics(self) -> dict:
        return {"loss_scale": self.scaler.get_scale()} if self.scaler is not None else {}


def forward_backward(model, batches, accumulate: int, precision: Precision,
                     device: torch.device, step: int) -> float:
    """Forward and backward over `accumulate` micro-batches, each loss divided by
    `accumulate`: the gradient is that of the mean loss over all of them. Returns the mean
    loss as a float32 value (a loss of -0.0 is logged 0.0)."""
    if accumulate == 1:  # no division by 1, no tensor sum: the same bits in fewer ops
        loss = forward(model, batches, precision, device, step)
        precision.backward(loss)
        return loss.detach().float().item() + 0.0
    total = 0.0
    for _ in range(accumulate):
        loss = forward(model, batches, precision, device, step)
        precision.backward(loss / accumulate)
        total = total + loss.detach().float()
    return (total / accumulate).item()


def forward(model, batches, precision: Precision, device: torch.device, step: int):
    """The loss of the next micro-batch, checked to be a scalar tensor."""
    batch = to_device(next(batches), device)
    with precision.autocast():
        loss = model(batch)
    check_loss(loss, step)
    return loss


def check_loss(loss, step=None):
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ExoframeError(
            f"the model's forward(batch) must return a scalar loss tensor; it returned {shape}"
            f"{f' at step {step}' if step else ''}. Reduce it, e.g. with .mean().")


def set_lr(strategy, lr: float) -> float:
    """The step's learning rate, in the local optimizer and visible to the strategy."""
    strategy.lr = lr
    for group in strategy.optimizer.param_groups:
        group["lr"] = lr
    return lr


def warm_up(job, batches, device: torch.device):
    """One throwaway step of a copy of the model on the worker's GPU before its nodes start,
    under measured compute: the GPU's one-time set-up (kernels loaded on first use, cuBLAS and
    cuDNN handles) would otherwise be the first node's compute (an H200 charged rank 0 about
    16 ms more per step than its three peers over 30 steps of a tiny GPT). No generator,
    batch or node state changes: first() keeps the batch for the node."""
    model = copy.deepcopy(job.model).to(device)
    optimizer = job.optimizer.build(model.parameters(), model)
    cuda = device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else []):
        forward_backward(model, iter([batches.first()]), 1, Precision(job.precision, device),
                         device, 0)
        optimizer.step()
    if cuda:
        torch.cuda.synchronize(device)
