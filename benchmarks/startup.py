"""Time from `exoframe run` invocation to the first finished training step, N = 1, 2, 4.

    python benchmarks/startup.py [--repeats 3]

Watches the run's metrics.jsonl (exoframe.sinks writes each row as its step finishes, and
the launcher writes a step's row only when every rank reported it): the moment its first
line is whole, every rank has finished step 1. (The progress bar is no clock for this:
tqdm redraws at most every 0.1 s, so a fast run's bar may never show "1/3".)
"""
import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLL = 0.002  # seconds between looks at the folder


def first_row_written(out: Path) -> bool:
    return any(path.read_text().find("\n") >= 0 for path in out.glob("*/metrics.jsonl"))


def time_to_first_step(nodes: int, steps: int = 3) -> float:
    out = Path(tempfile.mkdtemp(prefix="exoframe-startup-"))
    try:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "exoframe", "run", "--nodes", str(nodes), "--steps",
             str(steps), "--eval-every", "1000", "--out", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        first = None
        while first is None and proc.poll() is None:
            if first_row_written(out):
                first = time.perf_counter() - start
            else:
                time.sleep(POLL)
        _, errors = proc.communicate()
        if first is None and first_row_written(out):  # the run ended between two looks
            first = time.perf_counter() - start
        if proc.returncode != 0 or first is None:
            raise SystemExit(f"run failed (exit {proc.returncode}): {errors[-2000:]}")
        return first
    finally:
        shutil.rmtree(out, ignore_errors=True)


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
