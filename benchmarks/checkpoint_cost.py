"""What checkpoints cost: real seconds per step of the default gpt workload with and without
--checkpoint-every, the size of one checkpoint, and the time to resume from it.

    python benchmarks/checkpoint_cost.py [--nodes 2] [--steps 60] [--every 10]

Both runs are `diloco` (H=10) with `fixed` compute, so their rows are the same; the
difference in real time per step is the cost of saving (every rank writes its state,
the launcher commits). Resume time: from `exoframe resume --steps steps+every` starting to
its end, minus the steps it trains at the measured per-step time.
"""
import argparse
import tempfile
import time
from pathlib import Path

from exoframe.config import RunConfig
from exoframe.engine import execute, job_from_config
from exoframe.engine.records.checkpoint import CheckpointFolder
from exoframe.engine.resume import resume


def timed_run(out: str, nodes: int, steps: int, every: int | None):
    config = RunConfig(strategy="diloco", strategy_params={"H": 10}, nodes=nodes, steps=steps,
                       compute="fixed:100ms", checkpoint_every=every, out=out)
    job = job_from_config(config)
    result = execute(job, out=out, config_record=job.config_record())
    summary = result.summary
    per_step = (summary["elapsed_seconds"] - summary["startup_seconds"]) / steps
    return result, per_step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        _, plain = timed_run(out, args.nodes, args.steps, None)
        saved, with_checkpoints = timed_run(out, args.nodes, args.steps, args.every)
        checkpoint = CheckpointFolder(saved.run_dir).latest()
        size = sum(p.stat().st_size for p in Path(checkpoint.path).iterdir())
        start = time.perf_counter()
        resume(saved.run_dir, steps=args.steps + args.every)
        resumed = time.perf_counter() - start
    print(f"real s/step without checkpoints  {plain:.4f}")
    print(f"real s/step, one every {args.every:<3} steps  {with_checkpoints:.4f} "
          f"(x{with_checkpoints / plain:.3f})")
    print(f"one checkpoint                   {size / 2**20:.2f} MiB ({args.nodes} ranks)")
    print(f"resume, {args.every} more steps          {resumed:.2f} s "
          f"(~{resumed - args.every * plain:.2f} s beyond training)")


if __name__ == "__main__":
    main()
