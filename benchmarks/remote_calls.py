"""What remote calls cost in real time: seconds per step of the default gpt workload under
`param-server` (every exchange a remote call, whose contents travel through the launcher)
against `ddp` (gloo collectives) doing the same training, both with `fixed` compute.

    python benchmarks/remote_calls.py [--nodes 4] [--steps 60] [--servers 1]

Synchronous param-server and ddp train the same weights (its rows' losses are printed
side by side as a check); the ratio of their real seconds per step is the machinery's cost.
"""
import argparse
import tempfile

from exoframe.config import RunConfig
from exoframe.engine import execute, job_from_config


def timed_run(out: str, strategy: str, params: dict, nodes: int, steps: int):
    config = RunConfig(strategy=strategy, strategy_params=params, nodes=nodes, steps=steps,
                       compute="fixed:100ms", net="wan-100mbps", out=out)
    job = job_from_config(config)
    summary = execute(job, out=out, config_record=job.config_record()).summary
    return summary, (summary["elapsed_seconds"] - summary["startup_seconds"]) / steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--servers", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        ddp, ddp_step = timed_run(out, "ddp", {}, args.nodes, args.steps)
        ps, ps_step = timed_run(out, "param-server", {"servers": args.servers}, args.nodes,
                                args.steps)
    print(f"{args.nodes} nodes, {args.steps} steps of gpt, fixed:100ms, wan-100mbps")
    print(f"  ddp:          {1000 * ddp_step:.1f} ms/step real, final loss {ddp['final_loss']:.6f},"
          f" simulated {ddp['simulated_seconds']:.2f} s")
    print(f"  param-server: {1000 * ps_step:.1f} ms/step real, final loss {ps['final_loss']:.6f},"
          f" simulated {ps['simulated_seconds']:.2f} s ({args.servers} server(s))")
    print(f"  ratio: {ps_step / ddp_step:.2f}")


if __name__ == "__main__":
    main()
