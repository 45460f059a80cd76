"""What a sweep costs over the training it needs: 2 strategies × 8 bandwidths on the gpt
workload (N=4) versus the 2 training runs alone.

    python benchmarks/sweep_cost.py [--steps 300]

Timing-independent strategies train once and are replayed through the other 7 networks,
so the sweep should cost little more than its 2 runs. Target (issue 4): at most 1.3×.
"""
import argparse
import tempfile
import time
from pathlib import Path

from exoframe.config import RunConfig
from exoframe.engine import execute, job_from_config
from exoframe.experiments.sweep import grid_networks, parse_grid, sweep
from exoframe.plugins import get_plugin_manager

STRATEGIES = ["ddp", "diloco"]

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    base = RunConfig(nodes=4, steps=args.steps, compute="fixed:50ms").validate()
    job_from_config(base)  # the workload's corpus is built once per process: not timed
    with tempfile.TemporaryDirectory() as out:
        nets = grid_networks("wan-100mbps", parse_grid("10mbit..10gbit", 8),
                             Path(out) / "nets", get_plugin_manager())
        start = time.perf_counter()
        for strategy in STRATEGIES:
            execute(job_from_config(RunConfig(**{**vars(base), "strategy": strategy,
                                                 "net": nets[0]})), out=out)
        runs = time.perf_counter() - start
        start = time.perf_counter()
        folder, rows = sweep(base, STRATEGIES, nets, [0], out)
        swept = time.perf_counter() - start
    print(f"2 training runs: {runs:.1f} s; sweep of 2 strategies x 8 bandwidths "
          f"({len(rows)} rows, tables and plots included): {swept:.1f} s; ratio {swept / runs:.2f}")
