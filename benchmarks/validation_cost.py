"""What validation costs a run: whole `exoframe run` processes with the default validation
(every steps/10) against the same run validating only at its last step, pairs alternated,
and the launcher's peak memory above its baseline while many nodes send their models.

    python benchmarks/validation_cost.py [--pairs 3] [--cases gpt,fedavg64,fedavg1024,memory]

- gpt: the GPT of 3.2M parameters (-w n_layer=4 -w n_embd=256 -w n_head=4
  -w block_size=128), 2 nodes, DiLoCo H=10, 20 steps, --compute fixed:100ms;
- fedavg64 / fedavg1024: `--workload mlp --strategy fedavg --nodes N`, 20 steps, packed
  (a worker per core);
- gpt85m, gpt85m-1node-every-step (on a GPU): GPT 85M (-w n_layer=12 -w n_embd=768
  -w n_head=12 -w block_size=256), bf16, 4 nodes as gpt above; 1 node, 10 steps validated
  at every step (against the last step only);
- memory: that GPT, 64 packed nodes, 4 steps validated every 2: the launcher's peak resident
  memory above its resident memory when the ranks start (Linux: /proc/self/clear_refs resets
  the peak), against the size of one model.

Each ratio is the median elapsed time (summary.json's elapsed_seconds) of the runs as given
(the default validation, but for gpt85m-1node-every-step) over that of the same runs
validating at their last step only; summary.json's `validation` says what was validated
and what validating cost.
"""
from __future__ import annotations

import argparse
import glob
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

GPT_3M = ["-w", "n_layer=4", "-w", "n_embd=256", "-w", "n_head=4", "-w", "block_size=128"]
GPT_85M = ["-w", "n_layer=12", "-w", "n_embd=768", "-w", "n_head=12", "-w", "block_size=256"]
CASES = {
    "gpt": ["--workload", "gpt", *GPT_3M, "--nodes", "2", "--strategy", "diloco", "-p", "H=10",
            "--steps", "20", "--compute", "fixed:100ms"],
    "fedavg64": ["--workload", "mlp", "--strategy", "fedavg", "--nodes", "64", "--steps", "20"],
    "fedavg1024": ["--workload", "mlp", "--strategy", "fedavg", "--nodes", "1024",
                   "--steps", "20"],
    # On a GPU (issue 44's H200 figures): GPT 85M, 4 nodes, bf16; 1 node validating every step.
    "gpt85m": ["--workload", "gpt", *GPT_85M, "--nodes", "4", "--strategy", "diloco",
               "-p", "H=10", "--steps", "20", "--compute", "fixed:100ms", "--device", "cuda",
               "--precision", "bf16"],
    "gpt85m-1node-every-step": ["--workload", "gpt", *GPT_85M, "--nodes", "1", "--steps", "10",
                                "--eval-every", "1", "--compute", "fixed:100ms",
                                "--device", "cuda", "--precision", "bf16"],
}


def run(args: list) -> dict:
    out = tempfile.mkdtemp(prefix="exoframe-validation-")
    proc = subprocess.run([sys.executable, "-m", "exoframe", "run", *args, "--out", out,
                           "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: {proc.stderr.strip().splitlines()[-1]}")
    [path] = glob.glob(f"{out}/*/summary.json")
    return json.loads(Path(path).read_text())


def ratio(name: str, pairs: int):
    steps = CASES[name][CASES[name].index("--steps") + 1]
    default, last = [], []
    for _ in range(pairs):  # alternated, so that a slow spell of the machine hits both
        default.append(run(CASES[name]))
        last.append(run([*CASES[name], "--eval-every", steps]))
    seconds = [statistics.median(s["elapsed_seconds"] for s in runs) for runs in (default, last)]
    per_step = [statistics.median(s["seconds_per_step"] for s in runs) for runs in (default, last)]
    said = default[-1]["validation"]
    print(f"{name}: as given {seconds[0]:7.2f} s, last step only {seconds[1]:7.2f} s, "
          f"ratio {seconds[0] / seconds[1]:.3f}  (default: {said['examples']} examples, "
          f"validating {said['validating_seconds']} s, moving models "
          f"{said['moving_models_seconds']} s; per step {per_step[0]:.3f} s against "
          f"{per_step[1]:.3f} s)", flush=True)


def launcher_memory():
    """Runs in this process: the launcher is this process, the ranks its children."""
    import torch

    from exoframe.config import RunConfig
    from exoframe.engine.plan.resolve import job_from_config
    from exoframe.engine.launch.launcher import launch, prepare

    config = RunConfig(workload="gpt", workload_params=dict(n_layer=4, n_embd=256, n_head=4,
                                                            block_size=128),
                       nodes=64, steps=4, eval_every=2, strategy="diloco",
                       strategy_params={"H": 2}, compute="fixed:100ms")
    job = job_from_config(config)
    model_mb = sum(p.numel() * p.element_size() for p in job.model.parameters()) / 2**20
    job, *prepared = prepare(job)
    torch.set_num_threads(1)

    def status(field: str) -> float:
        line = next(l for l in Path("/proc/self/status").read_text().splitlines()
                    if l.startswith(field + ":"))
        return int(line.split()[1]) / 1024  # kB -> MiB

    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
    baseline = status("VmRSS")
    launch(job, prepared=tuple(prepared))
    above = status("VmHWM") - baseline
    print(f"     memory: launcher's peak {above:.1f} MiB above its baseline during a 64-node "
          f"run of a {model_mb:.1f} MiB model: {above / model_mb:.2f}x one model", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--cases", default="gpt,fedavg64,fedavg1024,memory")
    options = parser.parse_args()
    for name in options.cases.split(","):
        if name == "memory":
            launcher_memory()
        else:
            ratio(name, options.pairs)


if __name__ == "__main__":
    main()
