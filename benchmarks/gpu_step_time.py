"""Seconds per step of N ranks sharing one device versus one plain process training the
same N batches per step on it (issue 12's GPU figure; runs on the CPU too).

    python benchmarks/gpu_step_time.py [--device cuda:0] [--nodes 8] [--steps 100]

The plain loop trains the gpt workload with AdamW, one backward per rank's batch (N
sequential batches of 16) and one optimizer step, under the same precision; exoframe runs
`ddp` with N ranks on the device (`--device`), seconds per step from summary.json
(start-up excluded).
"""
import argparse
import time

import torch

from exoframe.config import RunConfig
from exoframe.engine import devices, execute, job_from_config
from exoframe.engine.data import Batches
from exoframe.engine.loop import to_device


def plain_loop(device: str, nodes: int, steps: int, precision: str) -> float:
    job = job_from_config(RunConfig(nodes=1, steps=steps, device=device))
    model = job.model.to(device)
    batches = Batches(job.dataset(0, 1, "train"), job.batch_size, 0, 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=job.optimizer.lr)
    dtype = {"bf16": torch.bfloat16, "fp32": None}[precision]
    kind = torch.device(device).type
    warmup = 5
    for step in range(steps + warmup):
        if step == warmup:
            if kind == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        for _ in range(nodes):
            with torch.autocast(kind, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = model(to_device(next(batches), torch.device(device)))
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    if kind == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def exoframe_step(device: str, nodes: int, steps: int, precision: str) -> float:
    job = job_from_config(RunConfig(nodes=nodes, steps=steps, device=device,
                                    precision=precision, eval_every=10 * steps))
    return execute(job).summary["seconds_per_step"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda:0" if devices.gpu_count() else "cpu")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    # exoframe first: its ranks are forked, and a forked process cannot use CUDA that its
    # parent has initialized (the plain loop does).
    ours = exoframe_step(args.device, args.nodes, args.steps, args.precision)
    plain = plain_loop(args.device, args.nodes, args.steps, args.precision)
    print(f"device {args.device}, {args.nodes} batches of 16 per step, {args.precision}")
    print(f"plain single-process loop: {plain * 1000:.1f} ms/step")
    print(f"exoframe ddp, {args.nodes} ranks on the device: {ours * 1000:.1f} ms/step "
          f"= {ours / plain:.2f}x")


if __name__ == "__main__":
    main()
