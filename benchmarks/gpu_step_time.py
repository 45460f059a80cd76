"""Seconds per step on one GPU: exoframe's nodes packed in one worker on the device, against
plain single-process loops doing the same compute (issue 43's cases), side by side.

    python benchmarks/gpu_step_time.py [--cases gpt85m,gpt85m-bf16,one-node,tiny64,tiny1024]
                                       [--steps 20] [--device cuda:0] [--measured]

- gpt85m (fp32) / gpt85m-bf16: a GPT of 85M parameters (-w n_layer=12 -w n_embd=768
  -w n_head=12 -w block_size=256, batch 16), 4 nodes, DiLoCo H=10; the plain loop steps the
  4 models in turn (AdamW each, the outer Nesterov step every 10), and in bf16 the stacked
  limit: the 4 replicas as one model under torch.func vmap, one AdamW over them;
- one-node: that GPT, 1 node (ddp), against 1 model in a loop;
- tiny64: the default gpt workload, 64 nodes fedavg (H=10), against 64 models in turn, and
  stacked under vmap;
- tiny1024: 1024 such nodes on the GPU (exoframe alone: that it runs, and its pace).

exoframe's time per step is (elapsed - start-up) / steps from summary.json, validating at the
last step only (--eval-every STEPS, --compute fixed:100ms, which does not change the work);
the plain loops are timed after 3 warm-up steps. exoframe runs first: its workers are forked,
and a forked process cannot use CUDA that its parent initialized (the plain loops do).
--measured adds each of 4 packed tiny-GPT nodes' own measured GPU compute per step.
"""
from __future__ import annotations

import argparse
import copy
import time

import torch

from exoframe.config import RunConfig
from exoframe.engine import execute, job_from_config
from exoframe.engine.node.data import Batches
from exoframe.engine.node.loop import to_device

GPT_85M = dict(n_layer=12, n_embd=768, n_head=12, block_size=256)
CASES = {  # name: (workload params, nodes, strategy, params, precision)
    "gpt85m": (GPT_85M, 4, "diloco", {"H": 10}, "fp32"),
    "gpt85m-bf16": (GPT_85M, 4, "diloco", {"H": 10}, "bf16"),
    "one-node": (GPT_85M, 1, "ddp", {}, "bf16"),
    "tiny64": ({}, 64, "fedavg", {"H": 10}, "fp32"),
    "tiny1024": ({}, 1024, "fedavg", {"H": 10}, "fp32"),
}
WARMUP = 3


def config(case: str, steps: int, device: str) -> RunConfig:
    params, nodes, strategy, strategy_params, precision = CASES[case]
    return RunConfig(workload="gpt", workload_params=params, nodes=nodes, steps=steps,
                     strategy=strategy, strategy_params=strategy_params, precision=precision,
                     device=device, eval_every=steps, compute="fixed:100ms").validate()


def exoframe_step(case: str, steps: int, device: str) -> float:
    return execute(job_from_config(config(case, steps, device))).summary["seconds_per_step"]


def measured_per_node(steps: int, device: str) -> list[float]:
    """Each of 4 packed tiny-GPT nodes' measured GPU compute per step (CUDA events over its
    own turns), in seconds."""
    run = RunConfig(workload="gpt", nodes=4, steps=steps, device=device, compute="measured",
                    eval_every=steps).validate()
    ranks = execute(job_from_config(run)).summary["per_rank"]
    return [r["compute_seconds"] / steps for r in ranks]


def sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(precision: str, device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def plain_in_turn(case: str, steps: int, device: str) -> float:
    """N models stepped one after another; every H steps their mean (DiLoCo: an outer
    Nesterov step from it) is copied into each."""
    job = job_from_config(config(case, steps, device))
    _, nodes, strategy, params, precision = CASES[case]
    device = torch.device(device)
    models = [copy.deepcopy(job.model).to(device) for _ in range(nodes)]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=job.optimizer.lr) for m in models]
    data = [Batches(job.dataset(r, nodes, "train"), job.batch_size, 0, r) for r in range(nodes)]
    held = copy.deepcopy(job.model).to(device)
    outer = torch.optim.SGD(held.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    every = params.get("H")
    for step in range(steps + WARMUP):
        if step == WARMUP:
            sync(device)
            start = time.perf_counter()
        for model, optimizer, batches in zip(models, optimizers, data):
            with autocast(precision, device):
                loss = model(to_device(next(batches), device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            loss.item()  # (a loss per node and step, as the run records)
        if every and (step + 1) % every == 0:
            with torch.no_grad():
                for i, p in enumerate(held.parameters()):
                    mean = torch.stack([list(m.parameters())[i] for m in models]).mean(0)
                    if strategy == "diloco":
                        p.grad = p - mean
                    else:
                        p.copy_(mean)
                if strategy == "diloco":
                    outer.step()
                for model in models:
                    for p, g in zip(model.parameters(), held.parameters()):
                        p.copy_(g)
    sync(device)
    return (time.perf_counter() - start) / steps


def stacked(case: str, steps: int, device: str) -> float:
    """The stacked limit: N replicas as one model under torch.func.vmap, one AdamW over the
    stacked parameters (exactly N independent ones), no synchronization."""
    from torch.func import functional_call, stack_module_state, vmap

    job = job_from_config(config(case, steps, device))
    _, nodes, _, _, precision = CASES[case]
    device = torch.device(device)
    models = [copy.deepcopy(job.model).to(device) for _ in range(nodes)]
    weights, buffers = stack_module_state(models)
    optimizer = torch.optim.AdamW(weights.values(), lr=job.optimizer.lr)
    base = copy.deepcopy(job.model).to(device)  # (its own weights are not used)
    data = [Batches(job.dataset(r, nodes, "train"), job.batch_size, 0, r) for r in range(nodes)]

    def loss_of(w, b, batch):
        return functional_call(base, (w, b), (batch,))

    for step in range(steps + WARMUP):
        if step == WARMUP:
            sync(device)
            start = time.perf_counter()
        batch = torch.stack([to_device(next(batches), device)[0] for batches in data])
        with autocast(precision, device):
            losses = vmap(loss_of, in_dims=(0, 0, 0))(weights, buffers, (batch,))
        losses.sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.tolist()
    sync(device)
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--measured", action="store_true",
                        help="also print each packed node's measured compute per step")
    options = parser.parse_args()
    cases = options.cases.split(",")
    ours = {case: exoframe_step(case, options.steps, options.device) for case in cases}
    per_node = measured_per_node(options.steps, options.device) if options.measured else None
    torch.set_num_threads(1)
    print(f"{'case':<12} {'exoframe':>10} {'in turn':>10} {'ratio':>7} {'stacked':>10} "
          f"{'ratio':>7}   (ms per step, {options.device})")
    for case in cases:
        turn = plain_in_turn(case, options.steps, options.device) if case != "tiny1024" else None
        stack = None
        if case in ("gpt85m-bf16", "tiny64"):
            try:
                stack = stacked(case, options.steps, options.device)
            except Exception as e:  # a model vmap cannot take: say so, go on
                print(f"  ({case}: stacked limit not measured: {type(e).__name__}: {e})")
        print(f"{case:<12} {ours[case] * 1e3:10.1f} "
              f"{turn * 1e3 if turn else float('nan'):10.1f} "
              f"{ours[case] / turn if turn else float('nan'):7.2f} "
              f"{stack * 1e3 if stack else float('nan'):10.1f} "
              f"{ours[case] / stack if stack else float('nan'):7.2f}", flush=True)
    if per_node is not None:
        print("measured compute per node (4 tiny GPT nodes in one worker, ms per step): "
              + ", ".join(f"{seconds * 1e3:.2f}" for seconds in per_node))


if __name__ == "__main__":
    main()
