"""Steady seconds per step of exoframe versus a plain single-process PyTorch loop doing
the same compute (gpt workload, N=4, 1 thread per process).

    python benchmarks/step_time.py [--steps 200]

The plain loop trains the same model with AdamW on the same total batch per step
(N × per-rank batch), once as one batch and once as N sequential micro-batches; exoframe's
figure excludes start-up (summary.json's seconds_per_step).
"""
import argparse
import time

import torch

from exoframe.config import RunConfig
from exoframe.engine import execute, job_from_config
from exoframe.engine.node.data import Batches

NODES = 4


def plain_loop(steps: int, micro_batches: int) -> float:
    torch.set_num_threads(1)
    job = job_from_config(RunConfig(nodes=1, steps=steps))
    model, per_rank = job.model, job.batch_size
    batches = Batches(job.dataset(0, 1, "train"), per_rank * NODES // micro_batches, 0, 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=job.optimizer.lr)
    warmup = 5
    for step in range(steps + warmup):
        if step == warmup:
            start = time.perf_counter()
        for _ in range(micro_batches):
            model(next(batches)).backward()
        optimizer.step()
        optimizer.zero_grad()
    return (time.perf_counter() - start) / steps


def exoframe_step(strategy: str, steps: int, **params) -> dict:
    job = job_from_config(RunConfig(nodes=NODES, steps=steps, strategy=strategy,
                                    strategy_params=params, eval_every=10 * steps))
    return execute(job).summary


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    one_batch = plain_loop(args.steps, 1)
    micro = plain_loop(args.steps, NODES)
    print(f"plain loop, batch {NODES}x16 as one batch:      {one_batch * 1000:.1f} ms/step")
    print(f"plain loop, {NODES} sequential micro-batches of 16: {micro * 1000:.1f} ms/step")
    for strategy, params in (("ddp", {}), ("diloco", {"H": 50})):
        summary = exoframe_step(strategy, args.steps, **params)
        per_step = summary["seconds_per_step"]
        print(f"exoframe {strategy:<6} N={NODES}: {per_step * 1000:.1f} ms/step "
              f"= {per_step / one_batch:.2f}x one-batch loop, {per_step / micro:.2f}x micro-batch "
              f"loop; peak RSS per rank {summary['peak_rss_mb_per_rank']} MB")


if __name__ == "__main__":
    main()
