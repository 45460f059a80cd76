"""The same run as a local fork run and under torchrun (two agents on this machine, 2 ranks
each, rendezvous on loopback): the launch's elapsed time and the seconds per step.

    python benchmarks/torchrun.py [--steps 500] [--strategy ddp]

Each run's summary gives elapsed_seconds (from the launch to the end) and startup_seconds
(to the first finished step); per step = (elapsed - startup) / (steps - 1). Under torchrun
every simulator message of ranks 1-3 crosses a TCP connection instead of a pipe.
"""
import argparse
import glob
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def summary(out: str) -> dict:
    [path] = glob.glob(f"{out}/*/summary.json")
    return json.loads(Path(path).read_text())


def fork_run(args: list[str], out: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "exoframe", "run", "--nodes", "4", "--out", out,
                    *args], check=True, capture_output=True)
    return time.perf_counter() - start


def torchrun_run(args: list[str], out: str) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
         f"bench{port}", "-m", "exoframe", "run", "--out", out, *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
    if any([agent.wait(timeout=3600) for agent in agents]):  # every agent, then the check
        raise SystemExit("a torchrun agent failed")
    return time.perf_counter() - start


def parse_options(steps: int):
    """--steps (default `steps`) and --strategy (default ddp)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--strategy", default="ddp")
    return parser.parse_args()


def main():
    options = parse_options(steps=500)
    args = ["--workload", "mlp", "--strategy", options.strategy, "--net", "wan-100mbps",
            "--compute", "fixed:50ms", "--steps", str(options.steps), "--eval-every",
            str(options.steps)]
    per_step = {}
    for name, launch in (("fork", fork_run), ("torchrun", torchrun_run)):
        out = tempfile.mkdtemp(prefix=f"exoframe-bench-{name}-")
        command_seconds = launch(args, out)
        said = summary(out)
        per_step[name] = (said["elapsed_seconds"] - said["startup_seconds"]) / (options.steps - 1)
        print(f"{name:9s} command {command_seconds:6.2f} s, launch to first step "
              f"{said['startup_seconds']:.2f} s, {per_step[name] * 1000:.2f} ms per step")
    print(f"torchrun / fork per step: {per_step['torchrun'] / per_step['fork']:.2f}")


if __name__ == "__main__":
    main()
