"""Time from `exoframe run` invocation to the first finished training step, N = 1, 2, 4.

    python benchmarks/startup.py [--repeats 3]

Reads the progress bar on stderr: the moment "1/<steps>" appears, every rank has finished
step 1 (the launcher shows a step only when all ranks reported it).
"""
import argparse
import statistics
import subprocess
import sys
import time


def time_to_first_step(nodes: int, steps: int = 3) -> float:
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "exoframe", "run", "--nodes", str(nodes), "--steps", str(steps),
         "--progress", "--eval-every", "1000", "--out", "/tmp/exoframe-bench-runs"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = ""
    first = None
    while True:
        char = proc.stderr.read(1)
        if not char:
            break
        seen += char
        if first is None and f" 1/{steps}" in seen:
            first = time.perf_counter() - start
    proc.wait()
    if proc.returncode != 0 or first is None:
        raise SystemExit(f"run failed: {seen[-2000:]}")
    return first


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for nodes in (1, 2, 4):
        times = [time_to_first_step(nodes) for _ in range(args.repeats)]
        print(f"N={nodes}: time to first step median {statistics.median(times):.2f} s "
              f"(runs: {', '.join(f'{t:.2f}' for t in times)})")


if __name__ == "__main__":
    main()
