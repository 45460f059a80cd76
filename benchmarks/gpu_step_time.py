"""Seconds per step on one GPU: exoframe's nodes packed in one worker on the device, against
plain single-process loops doing the same compute (issue 43's cases), side by side.

    python benchmarks/gpu_step_time.py [--cases gpt85m,gpt85m-tf32,gpt85m-bf16,one-node,tiny64,
                                               tiny1024]
                                       [--steps 41] [--device cuda:0] [--measured]

- gpt85m (fp32) / gpt85m-bf16: a GPT of 85M parameters (-w n_layer=12 -w n_embd=768
  -w n_head=12 -w block_size=256, batch 16), 4 nodes, DiLoCo H=10; the plain loop steps the
  4 models in turn (AdamW each, the outer Nesterov step every 10), and in bf16 and tf32 the
  stacked limit: the 4 replicas as one model under torch.func vmap, one AdamW over them;
- gpt85m-tf32: the same in fp32 with TF32 matmuls (--precision tf32), as EXO Gym runs its
  "fp32" (its TrainNode sets torch's allow_tf32 flags); the plain loops take each case's
  precision as the run does (engine/node/loop.py's Precision);
- one-node: that GPT, 1 node (ddp), against 1 model in a loop;
- tiny64: the default gpt workload, 64 nodes fedavg (H=10), against 64 models in turn, and
  stacked under vmap;
- tiny1024: 1024 such nodes on the GPU (exoframe alone: that it runs, and its pace).

exoframe's time per step is its steady pace: the time between the rows of steps 11 and 31
(of --steps 41: the launcher's clock, as each row is complete), 20 steps that hold two outer
steps as the plain loops' 20 do, and no start-up, warm-up or final validation, which the
whole-run figure beside it, (elapsed - start-up) / (S - 1), includes. Rows 11 and 31 both end
a round of packed turns (engine/node/packing.py's STEPS_PER_TURN). The run validates at its
last step only (--eval-every S, --compute fixed:100ms, which does not change the work).
The plain loops are timed after 3 warm-up steps, each case in a process of its own
(spawned: exoframe forks its workers, and a forked process cannot use CUDA that its parent
initialized), so every row prints as its case ends.
--measured adds each of 4 packed tiny-GPT nodes' own measured GPU compute per step.
`--field stack_replicas=true` runs exoframe's nodes as one stacked model per worker
(engine/node/stacked.py): the "stacked" column is then its limit.
"""
from __future__ import annotations

import argparse
import copy
import multiprocessing
import time

import torch
import yaml

from exoframe.config import RunConfig
from exoframe.engine import execute, job_from_config
from exoframe.engine.node.data import Batches
from exoframe.engine.node.loop import Precision, to_device
from exoframe.engine.node.packing import STEPS_PER_TURN
from exoframe.engine.plan.resolve import resolve_names
from exoframe.errors import ExoframeError

GPT_85M = dict(n_layer=12, n_embd=768, n_head=12, block_size=256)
CASES = {  # name: (workload params, nodes, strategy, params, precision)
    "gpt85m": (GPT_85M, 4, "diloco", {"H": 10}, "fp32"),
    "gpt85m-tf32": (GPT_85M, 4, "diloco", {"H": 10}, "tf32"),
    "gpt85m-bf16": (GPT_85M, 4, "diloco", {"H": 10}, "bf16"),
    "one-node": (GPT_85M, 1, "ddp", {}, "bf16"),
    "tiny64": ({}, 64, "fedavg", {"H": 10}, "fp32"),
    "tiny1024": ({}, 1024, "fedavg", {"H": 10}, "fp32"),
}
WARMUP = 3


def config(case: str, steps: int, device: str, **fields) -> RunConfig:
    """fields: RunConfig fields to change (--field), e.g. nodes_per_process=1."""
    params, nodes, strategy, strategy_params, precision = CASES[case]
    run = dict(workload="gpt", workload_params=params, nodes=nodes, steps=steps,
               strategy=strategy, strategy_params=strategy_params, precision=precision,
               device=device, eval_every=steps, compute="fixed:100ms")
    return RunConfig(**{**run, **fields}).validate()


def check_cases(parser: argparse.ArgumentParser, cases: list[str], steps: int, device: str,
                **fields):
    """Every case known and its run's config valid here (the engine's own up-front checks:
    the device, a precision it has), or one line, before anything runs."""
    for case in cases:
        if case not in CASES:
            parser.error(f"--cases: unknown case {case!r}; cases: {', '.join(CASES)}")
        try:
            resolve_names(config(case, steps, device, **fields))
        except ExoframeError as error:
            parser.error(str(error))


def exoframe_step(case: str, steps: int, device: str, **fields) -> float:
    """The whole run's seconds per step after its first (summary.json's)."""
    return run_summary(case, steps, device, **fields)["seconds_per_step"]


def run_summary(case: str, steps: int, device: str, **fields) -> dict:
    return execute(job_from_config(config(case, steps, device, **fields))).summary


def steady_window(steps: int) -> tuple[int, int] | None:
    """The rows (first, last) between which exoframe's steady pace is read: both end a
    round of packed turns (STEPS_PER_TURN steps each, the first turn one step), the first
    after a full round, the last before the final step's row (which waits for validation).
    None: too few steps for a full round between them."""
    first = 1 + STEPS_PER_TURN
    last = 1 + STEPS_PER_TURN * ((steps - 2) // STEPS_PER_TURN)
    return (first, last) if last > first else None


def exoframe_pace(case: str, steps: int, device: str, **fields) -> tuple[float, float]:
    """(seconds per step in the steady window, the whole run's seconds per step after its
    first, with the run's end): see above."""
    arrived = {}
    summary = execute(job_from_config(config(case, steps, device, **fields)),
                      on_row=lambda row: arrived.setdefault(row["step"],
                                                            time.perf_counter())).summary
    window = steady_window(steps)
    if window is None:
        return summary["seconds_per_step"], summary["seconds_per_step"]
    first, last = window
    return (arrived[last] - arrived[first]) / (last - first), summary["seconds_per_step"]


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


def plain_in_turn(case: str, steps: int, device: str, each_step=None) -> float:
    """N models stepped one after another; every H steps their mean (DiLoCo: an outer
    Nesterov step from it) is copied into each. each_step(i): called as timed step i begins
    (a profiler's window)."""
    job = job_from_config(config(case, steps, device))
    _, nodes, strategy, params, precision = CASES[case]
    device = torch.device(device)
    precision = Precision(precision, device)  # the run's autocast, or TF32 matmuls
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
        if each_step is not None and step >= WARMUP:
            each_step(step - WARMUP)
        for model, optimizer, batches in zip(models, optimizers, data):
            with precision.autocast():
                loss = model(to_device(next(batches), device))
            precision.backward(loss)
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
    from torch.nn.attention import SDPBackend, sdpa_kernel

    job = job_from_config(config(case, steps, device))
    _, nodes, _, _, precision = CASES[case]
    device = torch.device(device)
    precision = Precision(precision, device)
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
        # (vmap's efficient-attention backward rejects its batched strides: flash, or math)
        with precision.autocast(), sdpa_kernel([SDPBackend.FLASH_ATTENTION,
                                                SDPBackend.MATH]):
            losses = vmap(loss_of, in_dims=(0, 0, 0))(weights, buffers, (batch,))
        precision.backward(losses.sum())
        optimizer.step()
        optimizer.zero_grad()
        losses.tolist()
    sync(device)
    return (time.perf_counter() - start) / steps


def plain_loops(case: str, steps: int, device: str, cudnn_attention: bool = True) -> tuple:
    """(in turn, stacked) seconds per step, None where not measured; in a process spawned
    for it (see above)."""
    torch.set_num_threads(1)
    torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)
    turn = plain_in_turn(case, steps, device) if case != "tiny1024" else None
    stack = None
    if case in ("gpt85m-tf32", "gpt85m-bf16", "tiny64"):
        try:
            stack = stacked(case, steps, device)
        except Exception as e:  # a model vmap cannot take: say so, go on
            print(f"  ({case}: stacked limit not measured: {type(e).__name__}: {e})",
                  flush=True)
    return turn, stack


def ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:10.1f}" if seconds else f"{'-':>10}"


def ratio(a: float, b: float | None) -> str:
    return f"{a / b:7.2f}" if b else f"{'-':>7}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--steps", type=int, default=41,
                        help="steps of each run (exoframe's pace is read from step 11 to "
                        "the last turn's end before the last step)")
    parser.add_argument("--steps-1024", type=int, default=4,
                        help="tiny1024's steps (one run: that it runs, and its pace)")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--measured", action="store_true",
                        help="also print each packed node's measured compute per step")
    parser.add_argument("--field", action="append", default=[], metavar="NAME=VALUE",
                        help="a RunConfig field of exoframe's runs (YAML value), e.g. "
                        "nodes_per_process=1; repeatable")
    parser.add_argument("--no-plain", action="store_true", help="exoframe's runs alone")
    parser.add_argument("--no-cudnn-attention", action="store_true",
                        help="attention without cuDNN's kernels, everywhere (torch's flag, "
                        "inherited by exoframe's forked processes)")
    options = parser.parse_args()
    torch.backends.cuda.enable_cudnn_sdp(not options.no_cudnn_attention)
    fields = {name: yaml.safe_load(value)
              for name, _, value in (f.partition("=") for f in options.field)}
    check_cases(parser, options.cases.split(","), options.steps, options.device, **fields)
    spawned = multiprocessing.get_context("spawn")
    print(f"{'case':<12} {'exoframe':>10} {'whole run':>10} {'in turn':>10} {'ratio':>7} "
          f"{'stacked':>10} {'ratio':>7}   (ms per step, {options.device})", flush=True)
    for case in options.cases.split(","):
        steps = options.steps_1024 if case == "tiny1024" else options.steps
        ours, whole = exoframe_pace(case, steps, options.device, **fields)
        turn = stack = None
        if not options.no_plain:
            with spawned.Pool(1) as pool:
                turn, stack = pool.apply(plain_loops, (case, steps, options.device,
                                                       not options.no_cudnn_attention))
        print(f"{case:<12} {ms(ours)} {ms(whole)} {ms(turn)} {ratio(ours, turn)} "
              f"{ms(stack)} {ratio(ours, stack)}", flush=True)
    if options.measured:
        per_node = measured_per_node(options.steps, options.device)
        print("measured compute per node (4 tiny GPT nodes in one worker, ms per step): "
              + ", ".join(f"{seconds * 1e3:.2f}" for seconds in per_node), flush=True)


if __name__ == "__main__":
    main()
