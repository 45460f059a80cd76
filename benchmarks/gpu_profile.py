"""Where an exoframe run's time goes on a GPU: rank 0's process (its own, or the worker of
nodes packed on the device, engine/node/packing.py) under cProfile and torch.profiler, beside a
plain loop of the same compute under torch.profiler, so that what the engine adds per step
can be read off.

    python benchmarks/gpu_profile.py [--case one-node] [--steps 20] [--out DIR]

The case is one of benchmarks/gpu_step_time.py's. Rank 0's process is forked from this one,
so the profilers are put around what it runs here, before the run starts. Writes to --out:
worker_cprofile.txt (Python functions by their own time and by cumulative time),
worker_torch.txt and plain_torch.txt (torch ops and kernels by time), and prints the
worker's GPU-busy share: its kernels' time over its wall-clock.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

import torch
from gpu_step_time import config, exoframe_step, plain_in_turn  # beside this file

from exoframe.engine.launch import hosting, launcher
from exoframe.engine.plan import devices


def activities():
    from torch.profiler import ProfilerActivity
    return [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if devices.gpu_count() else [])]


def profile_rank_zero(out: Path):
    """Rank 0's process (its own, or its worker of packed nodes) runs under both profilers;
    what they saw is written to `out` as it ends."""
    entry = hosting.child_entry  # (what each forked process runs)

    def profiled_entry(who, target, args, conn, *rest, **kw):
        if who == 0:
            target = profiled(target, out)
        return entry(who, target, args, conn, *rest, **kw)
    hosting.child_entry = profiled_entry
    stop_all = launcher.stop_all

    def stop_all_once_written(processes):
        for process in processes[:1]:  # rank 0's: its tables are written as it ends
            process.join(timeout=300)
        stop_all(processes)
    launcher.stop_all = stop_all_once_written


def profiled(target, out: Path):
    def run(*args):
        from torch.profiler import profile
        python = cProfile.Profile()
        start = time.perf_counter()
        with profile(activities=activities()) as prof:
            python.enable()
            try:
                target(*args)
            finally:
                python.disable()
                if torch.cuda.is_initialized():
                    torch.cuda.synchronize()
        write_tables(prof, out / "worker_torch.txt", time.perf_counter() - start)
        text = io.StringIO()
        for order in ("tottime", "cumulative"):
            pstats.Stats(python, stream=text).sort_stats(order).print_stats(40)
        (out / "worker_cprofile.txt").write_text(text.getvalue())
    return run


def write_tables(prof, path: Path, wall: float):
    events = prof.key_averages()
    kernels = sum(e.self_device_time_total for e in events) / 1e6  # µs -> s
    path.write_text(
        f"wall {wall:.3f} s, kernels {kernels:.3f} s: the GPU busy {kernels / wall:.1%}\n\n"
        + events.table(sort_by="self_cuda_time_total", row_limit=30) + "\n\n"
        + events.table(sort_by="self_cpu_time_total", row_limit=30))
    print(f"{path.name}: wall {wall:.3f} s, kernels {kernels:.3f} s "
          f"(GPU busy {kernels / wall:.1%})", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", default="one-node")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--out", default="profile")
    parser.add_argument("--no-plain", action="store_true", help="exoframe's run alone")
    options = parser.parse_args()
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    config(options.case, options.steps, options.device)  # (checks the case)
    profile_rank_zero(out)
    ours = exoframe_step(options.case, options.steps, options.device)
    print(f"exoframe: {ours * 1e3:.1f} ms per step (with the run's end)", flush=True)
    if options.no_plain:
        return
    from torch.profiler import profile
    start = time.perf_counter()
    with profile(activities=activities()) as prof:
        plain = plain_in_turn(options.case, options.steps, options.device)
    write_tables(prof, out / "plain_torch.txt", time.perf_counter() - start)
    print(f"plain loop: {plain * 1e3:.1f} ms per step", flush=True)


if __name__ == "__main__":
    main()
