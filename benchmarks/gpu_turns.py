"""Whether taking turns costs anything by itself on a GPU: 4 models of benchmarks/gpu_step_time.py's
gpt85m-bf16 case stepped in one process, in three orders, with cuDNN's attention kernels and
without:

- in turn: one step of each model, then again (the plain loop of gpu_step_time.py);
- consecutive: STEPS_PER_TURN steps of one model, then of the next (packed nodes' order);
- greenlets: each model's steps in a greenlet that gives way every STEPS_PER_TURN steps, as a
  packed node does (engine/node/packing.py), without the rest of the engine;
- greenlets+globals: the same, each turn between a swap of the node's globals in and out
  (NodeGlobals: the random generators, the GPU's among them, grad mode), as the hub does.

    python benchmarks/gpu_turns.py [--device cuda:0] [--steps 20]

Prints ms per step of all 4 (after 3 warm-up steps). On the CPU it runs the tiny64 case's
model instead (4 of them), to check the script.
"""
from __future__ import annotations

import argparse
import copy
import time

import torch
from greenlet import greenlet
from gpu_step_time import config  # beside this file

from exoframe.engine import job_from_config
from exoframe.engine.node.data import Batches
from exoframe.engine.node.loop import to_device
from exoframe.engine.node.node_globals import NodeGlobals
from exoframe.engine.node.packing import STEPS_PER_TURN

MODELS = 4
WARMUP = 3


class Models:
    def __init__(self, device: torch.device):
        case = "gpt85m-bf16" if device.type == "cuda" else "tiny64"
        job = job_from_config(config(case, 20, str(device)))
        self.device = device
        self.models = [copy.deepcopy(job.model).to(device) for _ in range(MODELS)]
        self.optimizers = [torch.optim.AdamW(m.parameters(), lr=job.optimizer.lr)
                           for m in self.models]
        self.data = [Batches(job.dataset(r, MODELS, "train"), job.batch_size, 0, r)
                     for r in range(MODELS)]

    def step(self, i: int):
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            loss = self.models[i](to_device(next(self.data[i]), self.device))
        loss.backward()
        self.optimizers[i].step()
        self.optimizers[i].zero_grad()
        loss.item()

    def in_turn(self, steps: int):
        for _ in range(steps):
            for i in range(MODELS):
                self.step(i)

    def consecutive(self, steps: int):
        for start in range(0, steps, STEPS_PER_TURN):
            for i in range(MODELS):
                for _ in range(start, min(steps, start + STEPS_PER_TURN)):
                    self.step(i)

    def greenlets(self, steps: int, swap: bool = False):
        hub = greenlet.getcurrent()

        def life(i: int):
            for step in range(steps):
                self.step(i)
                if (step + 1) % STEPS_PER_TURN == 0:
                    hub.switch()
        nodes = [greenlet(lambda i=i: life(i)) for i in range(MODELS)]
        kept = [NodeGlobals(self.device.type == "cuda") for _ in nodes]
        while any(not node.dead for node in nodes):
            for node, globals_ in zip(nodes, kept):
                if not node.dead:
                    if swap:
                        globals_.swap_in()
                    node.switch()
                    if swap:
                        globals_.swap_out()

    def greenlets_and_globals(self, steps: int):
        self.greenlets(steps, swap=True)


def seconds_per_step(run, steps: int, device: torch.device) -> float:
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    run(WARMUP)
    sync()
    start = time.perf_counter()
    run(steps)
    sync()
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--steps", type=int, default=20)
    options = parser.parse_args()
    device = torch.device(options.device)
    models = Models(device)
    for cudnn in (True, False):
        torch.backends.cuda.enable_cudnn_sdp(cudnn)
        for order in ("in_turn", "consecutive", "greenlets", "greenlets_and_globals"):
            seconds = seconds_per_step(getattr(models, order), options.steps, device)
            print(f"{order:<22} {'cuDNN attention' if cudnn else 'no cuDNN attention':<19} "
                  f"{seconds * 1e3:8.1f} ms per step of {MODELS}", flush=True)


if __name__ == "__main__":
    main()
