"""`--net real`: what each rank measured (compute, the rest as communication, its wall-clock)
next to the launch's own elapsed time, for a local fork run and under torchrun (two agents
on this machine, 2 ranks each, rendezvous on loopback).

    python benchmarks/real_network.py [--steps 50] [--strategy ddp]

A rank's measured wall-clock leaves the engine's bookkeeping out, so it should lie inside
the launch that rank 0's launcher timed on its own clock; "inside" says whether it does.
"""
import tempfile

from torchrun import fork_run, parse_options, summary, torchrun_run  # beside this file


def report(name: str, said: dict):
    elapsed = said["elapsed_seconds"]
    print(f"{name}: launch {elapsed:.2f} s")
    for i, rank in enumerate(said["per_rank"]):
        wall = rank["simulated_seconds"]
        print(f"  rank {i}: wall-clock {wall:.3f} s = compute {rank['compute_seconds']:.3f} s "
              f"+ comm {rank['comm_seconds']:.3f} s; inside the launch: "
              f"{'yes' if 0 < wall <= elapsed else 'NO'}")


def main():
    options = parse_options(steps=50)
    args = ["--workload", "mlp", "--strategy", options.strategy, "--net", "real",
            "--steps", str(options.steps), "--no-progress"]
    fork_out, torchrun_out = tempfile.mkdtemp(), tempfile.mkdtemp()
    fork_run(args, fork_out)
    report("fork, 4 ranks", summary(fork_out))
    torchrun_run(args, torchrun_out)
    report("torchrun, 2 agents x 2 ranks", summary(torchrun_out))


if __name__ == "__main__":
    main()
