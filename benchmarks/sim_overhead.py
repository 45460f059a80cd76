"""What the simulator costs a training run in real time: gpt workload, diloco, N=4, with
the network simulated (wan-100mbps, jittery links, flows) versus `--net ideal` (no links
to simulate: every transfer completes when its last participant arrives).

    python benchmarks/sim_overhead.py [--steps 300] [--repeats 3]

Runs alternate between the two networks; medians of the run's real seconds (start-up
excluded) are compared. Target (issue 3): at most 5% more with the simulator on.
"""
import argparse
import statistics

from exoframe.config import RunConfig
from exoframe.engine import execute, job_from_config


def run_seconds(net: str, steps: int) -> float:
    config = RunConfig(strategy="diloco", nodes=4, steps=steps, net=net).validate()
    summary = execute(job_from_config(config)).summary
    return summary["elapsed_seconds"] - summary["startup_seconds"]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    times = {"ideal": [], "wan-100mbps": []}
    for _ in range(args.repeats):
        for net in times:
            times[net].append(run_seconds(net, args.steps))
    ideal, wan = (statistics.median(times[k]) for k in ("ideal", "wan-100mbps"))
    for net, values in times.items():
        print(f"{net:<12} median {statistics.median(values):.2f} s  "
              f"(runs: {', '.join(f'{v:.2f}' for v in values)})")
    print(f"overhead of simulating wan-100mbps: {100 * (wan / ideal - 1):+.1f}%")
