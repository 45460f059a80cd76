"""Where an exoframe run's time goes on a GPU: rank 0's process (its own, or the worker of
nodes packed on the device, engine/node/packing.py) under cProfile and torch.profiler, beside a
plain loop of the same compute under torch.profiler, so that what the engine adds per step
can be read off.

    python benchmarks/gpu_profile.py [--case one-node] [--steps 41] [--window 11,31] [--out DIR]

The case is one of benchmarks/gpu_step_time.py's. The profilers see only the steps of
--window (from the first node's start of its first step to the first node's start of the
last), as gpu_step_time.py reads the pace, so neither the run's start-up nor its end (the
final validation, the model written) weighs in; the plain loop is profiled over as many of
its timed steps. Rank 0's process is forked from this one, so the profilers are put in
what it runs here, before the run starts. Writes to --out: worker_cprofile.txt (Python
functions by their own time and by cumulative time), worker_torch.txt and plain_torch.txt
(torch ops and kernels by time), and prints each one's wall-clock per step and GPU-busy
share: its kernels' time over its wall-clock.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

import torch
from gpu_step_time import check_cases, exoframe_step, plain_in_turn  # beside this file

from exoframe.engine.launch import hosting, launcher
from exoframe.engine.node.rank import Rank
from exoframe.engine.plan import devices


def activities():
    from torch.profiler import ProfilerActivity
    return [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if devices.gpu_count() else [])]


class StepWindow:
    """cProfile and torch.profiler from the first call of at(first) to the first of
    at(last); write(name, out) puts what they saw in `out`."""

    def __init__(self, first: int, last: int, python: bool = True):
        self.first, self.last = first, last
        self.python = cProfile.Profile() if python else None
        self.torch = self.start = self.wall = None

    def at(self, step: int):
        if step == self.first and self.torch is None:
            from torch.profiler import profile
            self.torch = profile(activities=activities())
            self.torch.start()
            if self.python:
                self.python.enable()
            self.start = time.perf_counter()
        elif step == self.last and self.torch is not None and self.wall is None:
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
            self.wall = time.perf_counter() - self.start
            if self.python:
                self.python.disable()
            self.torch.stop()

    def write(self, name: str, out: Path):
        if self.wall is None:
            print(f"{name}: the run ended before step {self.last} of the profile's window",
                  flush=True)
            return
        write_tables(self.torch, out / f"{name}_torch.txt", self.wall, self.last - self.first)
        if self.python:
            text = io.StringIO()
            for order in ("tottime", "cumulative"):
                pstats.Stats(self.python, stream=text).sort_stats(order).print_stats(40)
            (out / f"{name}_cprofile.txt").write_text(text.getvalue())


def profile_rank_zero(out: Path, window: tuple[int, int]):
    """Rank 0's process (its own, or its worker of packed nodes) runs under both profilers
    over the window's steps; what they saw is written to `out` as it ends."""
    entry = hosting.child_entry  # (what each forked process runs)

    def profiled_entry(who, target, args, conn, *rest, **kw):
        if who == 0:
            target = profiled(target, out, window)
        return entry(who, target, args, conn, *rest, **kw)
    hosting.child_entry = profiled_entry
    stop_all = launcher.stop_all

    def stop_all_once_written(processes):
        for process in processes[:1]:  # rank 0's: its tables are written as it ends
            process.join(timeout=300)
        stop_all(processes)
    launcher.stop_all = stop_all_once_written


def profiled(target, out: Path, window: tuple[int, int]):
    """`target` with the profilers on over the window: each node's train_step (rank.py)
    tells the window its step as it begins."""
    def run(*args):
        steps = StepWindow(*window)
        train_step = Rank.train_step

        def observed(self, step):
            steps.at(step)
            return train_step(self, step)
        Rank.train_step = observed
        try:
            target(*args)
        finally:
            steps.write("worker", out)
    return run


def write_tables(prof, path: Path, wall: float, steps: int):
    events = prof.key_averages()
    kernels = sum(e.self_device_time_total for e in events) / 1e6  # µs -> s
    line = (f"wall {wall:.3f} s over {steps} steps ({wall / steps * 1e3:.1f} ms a step), "
            f"kernels {kernels:.3f} s: the GPU busy {kernels / wall:.1%}")
    path.write_text(line + "\n\n"
                    + events.table(sort_by="self_cuda_time_total", row_limit=30) + "\n\n"
                    + events.table(sort_by="self_cpu_time_total", row_limit=30))
    print(f"{path.name}: {line}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", default="one-node")
    parser.add_argument("--steps", type=int, default=41)
    parser.add_argument("--window", default="11,31",
                        help="FIRST,LAST: the steps profiled, from FIRST's start to LAST's")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--out", default="profile")
    parser.add_argument("--no-plain", action="store_true", help="exoframe's run alone")
    options = parser.parse_args()
    first, last = (int(step) for step in options.window.split(","))
    if not 1 <= first < last <= options.steps:
        parser.error(f"--window: give FIRST,LAST with 1 <= FIRST < LAST <= --steps "
                     f"({options.steps}), not {options.window}")
    check_cases(parser, [options.case], options.steps, options.device)
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    profile_rank_zero(out, (first, last))
    ours = exoframe_step(options.case, options.steps, options.device)
    print(f"exoframe: {ours * 1e3:.1f} ms per step (with the run's end)", flush=True)
    if options.no_plain:
        return
    plain_steps = StepWindow(0, last - first, python=False)  # as many of its timed steps
    plain = plain_in_turn(options.case, last - first + 1, options.device, plain_steps.at)
    plain_steps.write("plain", out)
    print(f"plain loop: {plain * 1e3:.1f} ms per step", flush=True)


if __name__ == "__main__":
    main()
