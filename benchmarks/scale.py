"""How far the node count goes on this machine: start-up, peak memory and seconds per step
of `exoframe run --workload mlp --strategy fedavg --nodes N`, next to a plain
single-process loop training N models one after another (the same compute).

    python benchmarks/scale.py [--nodes 64,256,1024] [--steps 20] [--strategy fedavg]
                               [--nodes-per-process N]

Past 8 nodes on 2 cores the run packs its nodes into a worker per core (engine/node/packing.py);
--nodes-per-process sets the packing (N = the node count: one worker, the plain loop's
single process).

- start-up: summary.json's startup_seconds (the launch to the first finished step);
- per step: (elapsed - startup) / (steps - 1), from the same summary;
- peak memory: the most memory in use on the machine during the run above what was in use
  before it (MemTotal - MemAvailable, sampled every 0.1 s): the whole run, launcher
  included (run it on an otherwise idle machine);
- plain loop: N copies of the model, each with its AdamW and its own batch of the same
  size, stepped in turn by one process with one thread, and for fedavg averaged every H
  steps (each parameter set to the models' mean), then the models' average validated as the
  run's last step is: seconds per step of all N, the end's share included.
A run that fails (out of memory: the kernel kills a rank) is reported as such.
"""
import argparse
import copy
import glob
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from node_packing import average, nodes_of, plain  # beside this file

from exoframe.engine.launch.evaluator import validate
from exoframe.engine.launch.validation_set import validation_set
from exoframe.strategies.localsgd import LocalSGD


def used_bytes() -> int:
    """Memory in use on this machine: MemTotal - MemAvailable."""
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return (int(fields["MemTotal"].split()[0]) - int(fields["MemAvailable"].split()[0])) * 1024


class PeakMemory(threading.Thread):
    """The most memory in use above what was in use before the run (sampled every 0.1 s)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.before, self.peak, self.running = used_bytes(), 0, True

    def run(self):
        while self.running:
            self.peak = max(self.peak, used_bytes() - self.before)
            time.sleep(0.1)


def exoframe_run(nodes: int, steps: int, strategy: str, per_process: int | None) -> dict:
    out = tempfile.mkdtemp(prefix="exoframe-scale-")
    memory = PeakMemory()
    memory.start()
    proc = subprocess.Popen([sys.executable, "-m", "exoframe", "run", "--workload", "mlp",
                             "--strategy", strategy, "--nodes", str(nodes), "--steps", str(steps),
                             "--eval-every", str(steps), "--out", out,
                             *(["--nodes-per-process", str(per_process)] if per_process else [])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate()
    memory.running = False
    memory.join()
    if proc.returncode != 0:
        return {"failed": err.strip().splitlines()[-1] if err.strip() else
                f"exit {proc.returncode}", "peak_gb": memory.peak / 1e9}
    [path] = glob.glob(f"{out}/*/summary.json")
    said = json.loads(Path(path).read_text())
    return {"startup": said["startup_seconds"], "peak_gb": memory.peak / 1e9,
            "elapsed": said["elapsed_seconds"],
            "per_step": (said["elapsed_seconds"] - said["startup_seconds"]) / (steps - 1)}


def plain_loop(nodes: int, steps: int, strategy: str = "fedavg", end: bool = True) -> float:
    """Seconds per step of N mlp models trained one after another in this process; for
    fedavg, averaged every H steps as the run does (other strategies: never averaged). With
    `end`, the run's end is in it too, as it is in the run's: the models' average validated
    on the run's validation set (the run's --eval-every steps)."""
    torch.set_num_threads(1)
    step = nodes_of(nodes, steps)
    every = LocalSGD.Params().H if strategy in ("fedavg", "localsgd") else None
    plain(step, nodes, 1)  # the first step warms up
    start = time.perf_counter()
    plain(step, nodes, steps - 1, every, first=2)
    if end:
        validate_average(step.models, step.job, nodes)
    return (time.perf_counter() - start) / (steps - 1)


def validate_average(models: list, job, nodes: int):
    """The models' average, validated as the run's evaluator does (its validate())."""
    held = copy.deepcopy(models[0])
    average(models, into=[held])
    validate(held, validation_set(job.dataset, nodes, job.val_examples).dataset,
             job.batch_size, job.metrics)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="64,256,1024")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--strategy", default="fedavg")
    parser.add_argument("--nodes-per-process", type=int)
    options = parser.parse_args()
    for nodes in map(int, options.nodes.split(",")):
        run = exoframe_run(nodes, options.steps, options.strategy, options.nodes_per_process)
        plain = plain_loop(nodes, options.steps, options.strategy)
        if "failed" in run:
            print(f"N={nodes}: failed ({run['failed']}), peak memory {run['peak_gb']:.1f} GB; "
                  f"plain loop {plain * 1000:.1f} ms/step")
            continue
        print(f"N={nodes}: start-up {run['startup']:.1f} s, peak memory {run['peak_gb']:.1f} GB, "
              f"{run['per_step'] * 1000:.1f} ms/step; plain loop {plain * 1000:.1f} ms/step "
              f"(ratio {run['per_step'] / plain:.2f})")


if __name__ == "__main__":
    main()
