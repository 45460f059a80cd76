"""Where a node-step's time goes: the engine's own work per node-step, by part, as a share
of a plain step (one mlp model stepped by a plain PyTorch loop), at 4, 64 and 1024 nodes.

    pip install -e '.[bench]'        # py-spy, the sampling profiler
    python benchmarks/step_overhead.py [--nodes 4,64,1024] [--strategy diloco -p H=10]

Each run packs all its nodes into one worker process (--nodes-per-process N, one thread),
so that the worker never waits for a core, and is sampled by py-spy (each thread's Python
stack, --rate times a second; a thread blocked in a wait is left out). A sample is given to a part by its innermost
frame that names one (PARTS, in order: the model, the optimizers, the exchanges, the data,
the clock, messages to the launcher, the packing's node switches, the strategy's own code,
the engine's per-step bookkeeping). The worker's start-up (before its first step) and the
launcher (the simulator, the records) are reported apart. Seconds per node-step of a part =
its samples / rate / (nodes x steps); its share = that / the plain loop's seconds per
node-step (the same mlp, AdamW, batch, one thread, in this process: the reference).
"""
import argparse
import collections
import glob
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from node_packing import nodes_of, plain  # noqa: E402 - beside this file

# (part, what in a frame's file path or function names it): the innermost match decides.
PARTS = [
    ("model: forward and backward", r"torch/(nn|autograd)/|exoframe/workloads/|forward_backward"),
    ("optimizers (inner, outer)", r"torch/optim/"),
    ("exchanges", r"torch/distributed/|exoframe/comm/"),
    ("data", r"torch/utils/data/|exoframe/engine/node/data\.py"),
    ("clock", r"exoframe/sim/"),
    ("messages to the launcher", r"multiprocessing/|exoframe/engine/ipc/"),
    ("packing: node switches", r"greenlet|exoframe/engine/node/(packing|node_globals|node_host)\.py"),
    ("strategy", r"exoframe/strategies/"),
    ("engine bookkeeping", r"exoframe/"),
]
PLAIN_PARTS = ("model: forward and backward", "optimizers (inner, outer)", "data")  # in a plain step too
# A node's start-up: rank.py's phases before its first step (its model copied, its
# generators seeded, its pieces built, a checkpoint read), and what they call.
STARTUP = re.compile(r"init_process_group|rendezvous|prepare \(|_bootstrap|make_clock|"
                     r"Strategy\.__init__|setup \(|join \([^)]*exoframe/engine/node/|seed_rank \(|"
                     r"Rank\.__init__|Rank\.resume")
WAITING = re.compile(r"(^|\.)(select|poll|wait|_recv|_recv_bytes|recv_bytes|sleep|acquire|get) \(")
IN_TRAINING = re.compile(r"exoframe/engine/node/(rank|packing)\.py")


def classify(frames: list[str]) -> str:
    for frame in reversed(frames):
        for part, pattern in PARTS:
            if re.search(pattern, frame):
                return part
    return "other (interpreter, torch internals)"


def profile_run(nodes: int, steps: int, rate: int, extra: list[str]) -> dict:
    """{"worker": Counter(part -> samples), "startup": samples, "launcher": samples}"""
    out = Path(tempfile.mkdtemp(prefix="exoframe-overhead-"))
    raw = out / "stacks.txt"
    command = [sys.executable, "-m", "exoframe", "run", "--workload", "mlp", "--nodes",
               str(nodes), "--nodes-per-process", str(nodes), "--steps", str(steps),
               "--eval-every", str(steps), "--compute", "fixed:10ms", "--out", str(out / "runs"),
               *extra]
    proc = subprocess.run(["py-spy", "record", "--subprocesses", "--nonblocking", "--format",
                           "raw", "--rate", str(rate), "--output", str(raw), "--", *command],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0 or not raw.exists():
        raise SystemExit(f"py-spy record failed: {proc.stderr.strip()[-500:]}")
    summary = json.loads(Path(glob.glob(f"{out}/runs/*/summary.json")[0]).read_text())
    worker, startup, launcher, imports = collections.Counter(), 0, 0, 0
    for line in raw.read_text().splitlines():
        stack, count = line.rsplit(" ", 1)
        frames, count = stack.split(";"), int(count)
        processes = [f for f in frames if f.startswith("process ")]
        if WAITING.search(frames[-1]) or len(processes) == len(frames):
            continue  # blocked, or a thread with no Python frame (torch's, gloo's)
        if any("importlib" in f for f in frames):
            imports += count
        elif len(processes) == 1:  # the launcher itself (the simulator, the records)
            launcher += count
        elif not any(IN_TRAINING.search(f) for f in frames) or any(map(STARTUP.search, frames)):
            startup += count
        else:
            worker[classify(frames)] += count
    shutil.rmtree(out, ignore_errors=True)
    if not worker:
        raise SystemExit(f"no sample of the worker's training was recognised ({IN_TRAINING.pattern} "
                         f"in no stack): has the engine's layout moved?")
    return {"worker": worker, "startup": startup, "launcher": launcher, "imports": imports,
            "summary": summary}


def plain_seconds_per_node_step(nodes: int, steps: int) -> float:
    """CPU seconds of one mlp model's step, stepping up to 64 models in turn (a step's cost
    does not depend on how many more there are)."""
    torch.set_num_threads(1)
    models = min(nodes, 64)
    step = nodes_of(models, steps)
    plain(step, models, 1)  # warm-up
    start = time.thread_time()
    plain(step, models, steps)
    return (time.thread_time() - start) / (models * steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="4,64,1024")
    parser.add_argument("--steps", default="100,30,6", help="per node count")
    parser.add_argument("--rate", type=int, default=500, help="samples per second")
    options, extra = parser.parse_known_args()
    extra = extra or ["--strategy", "diloco", "-p", "H=10"]
    if shutil.which("py-spy") is None:
        raise SystemExit("py-spy is not installed: pip install -e '.[bench]'")
    counts = [int(n) for n in options.nodes.split(",")]
    steps = [int(s) for s in options.steps.split(",")]
    print(f"exoframe run --workload mlp {' '.join(extra)}, all nodes in one worker; "
          f"py-spy at {options.rate}/s")
    for nodes, n_steps in zip(counts, steps):
        plain_step = plain_seconds_per_node_step(nodes, 20)
        found = profile_run(nodes, n_steps, options.rate, extra)
        node_steps = nodes * n_steps

        def per_node_step(samples):
            return samples / options.rate / node_steps

        print(f"\n{nodes} nodes x {n_steps} steps; plain step {plain_step * 1e3:.3f} ms "
              f"(CPU, one mlp model)")
        print(f"  {'part':<38} {'ms/node-step':>12} {'of a plain step':>16}")
        total = 0.0
        for part, samples in found["worker"].most_common():
            seconds = per_node_step(samples)
            total += seconds
            print(f"  {part:<38} {seconds * 1e3:12.3f} {seconds / plain_step:15.1%}")
        own = total - sum(per_node_step(found["worker"][part]) for part in PLAIN_PARTS)
        print(f"  {'worker, training, all parts':<38} {total * 1e3:12.3f} "
              f"{total / plain_step:15.1%}")
        print(f"  {'the engine own work (the rest)':<38} {own * 1e3:12.3f} {own / plain_step:15.1%}")
        print(f"  launcher beside training (simulator, records): "
              f"{per_node_step(found['launcher']) * 1e3:.3f} ms/node-step "
              f"({per_node_step(found['launcher']) / plain_step:.1%}); imports, all processes: "
              f"{found['imports'] / options.rate:.2f} s; worker start-up "
              f"{found['startup'] / options.rate:.2f} s; the run's start-up (summary) "
              f"{found['summary']['startup_seconds']:.2f} s")


if __name__ == "__main__":
    main()
