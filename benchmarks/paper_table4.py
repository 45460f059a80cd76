"""exoframe's projection against Table 4 of Streaming DiLoCo (Douillard et al. 2025,
arXiv:2501.18512v1, appendix): the bandwidth (Gbit/s) two workers need between them to reach
50/80/90/95/99 % compute utilization, for 1B/10B/100B models and five methods.

    python benchmarks/paper_table4.py [--protocol none|tcp] [--bucket layer|25mib]
                                      [--bytes-factor F] [--steps 200] [--scales 1B,10B,100B]

Each method is trained once for real (2 nodes, a tiny GPT, fixed compute), then its trace is
projected (`exoframe.experiments.run_replays.Projection`) to the paper's model size and step
time and replayed on two-node networks at the paper's bandwidths, a grid of 50 log-spaced
values from 0.1 to 1000 Gbit/s (np.logspace(-1, 3, 50): every value in Table 4 is one of
them). As the table reads, a level's bandwidth is the first grid value whose utilization
reaches it. The paper's setting as its appendix states it:

- 2 workers; H = 100; fragments of 3 layers (8, 16, 36 fragments for 24, 48, 108 layers);
  τ = 1 where communication overlaps; bf16 payloads, FP4 (4 bits) in the last row;
- step times 0.1 s, 0.8 s, 4.9 s (pure compute);
- its simulator is a DAG of per-layer nodes: each layer's (outer) gradients are reduced once
  its backward pass is done, so buckets are one layer (`--bucket layer`, the default here);
- links are ideal (`--protocol none`, the default here): no TCP/Ethernet overhead, no
  latency.

It prints, per scale and method, exoframe's bandwidths beside those of the rule the
projection is documented to follow (`rule_utilization`, computed step by step here without
exoframe) and the paper's, and how many of the 75 values are equal, one grid step (×1.207)
above or below, or further. `--bytes-factor F` multiplies every payload by F (with no latency
a utilization depends only on bytes / (bandwidth × step time), so F also stands for steps
1/F times longer). Takes about a minute.
"""
from __future__ import annotations

import argparse
import functools
import math
import tempfile
from pathlib import Path

from exoframe.config import RunConfig
from exoframe.engine import execute, job_from_config
from exoframe.experiments.run_replays import Projection, replay_trace
from exoframe.plugins import get_plugin_manager
from exoframe.sim import resolve_sim

LEVELS = (0.5, 0.8, 0.9, 0.95, 0.99)
GRID = [10 ** (-1 + 4 * k / 49) for k in range(50)]  # Gbit/s
H = 100
FRAGMENT_LAYERS = 3  # the paper's streaming fragments: 3 layers each
WORKLOAD = dict(n_layer=1, n_embd=32, block_size=32, train_tokens=40000, val_tokens=4000)

# scale -> (parameters, layers, step seconds)
SCALES = {"1B": (1e9, 24, 0.1), "10B": (1e10, 48, 0.8), "100B": (1e11, 108, 4.9)}

# method -> (strategy, strategy params (fragments filled in per scale), payload bits)
METHODS = {
    "Data-Parallel": ("ddp", {}, 16),
    "Vanilla DiLoCo": ("diloco", {"H": H}, 16),
    "Streaming DiLoCo": ("streaming-diloco", {"H": H, "tau": 0}, 16),
    "Streaming DiLoCo w/ overlapped com.": ("streaming-diloco", {"H": H, "tau": 1}, 16),
    "Streaming DiLoCo w/ overlapped FP4 com.": ("streaming-diloco", {"H": H, "tau": 1}, 4),
}

# Table 4 of arXiv:2501.18512v1, Gbit/s for CU = 50, 80, 90, 95, 99 %.
PAPER = {
    "1B": {"Data-Parallel": (86.8, 152.6, 184.2, 222.3, 569.0),
           "Vanilla DiLoCo": (1.4, 6.2, 13.3, 23.3, 86.8),
           "Streaming DiLoCo": (1.4, 5.2, 9.1, 16.0, 28.1),
           "Streaming DiLoCo w/ overlapped com.": (1.4, 4.3, 6.2, 9.1, 11.0),
           "Streaming DiLoCo w/ overlapped FP4 com.": (0.4, 0.9, 1.7, 2.0, 3.0)},
    "10B": {"Data-Parallel": (104.8, 222.3, 222.3, 268.3, 471.5),
            "Vanilla DiLoCo": (1.7, 7.5, 16.0, 33.9, 104.8),
            "Streaming DiLoCo": (1.7, 5.2, 9.1, 13.3, 19.3),
            "Streaming DiLoCo w/ overlapped com.": (1.7, 3.6, 5.2, 6.2, 7.5),
            "Streaming DiLoCo w/ overlapped FP4 com.": (0.4, 0.9, 1.4, 1.4, 1.7)},
    "100B": {"Data-Parallel": (184.2, 323.8, 390.7, 390.7, 471.5),
             "Vanilla DiLoCo": (3.0, 11.0, 23.3, 49.4, 184.2),
             "Streaming DiLoCo": (2.4, 6.2, 9.1, 11.0, 19.3),
             "Streaming DiLoCo w/ overlapped com.": (1.7, 3.6, 4.3, 5.2, 5.2),
             "Streaming DiLoCo w/ overlapped FP4 com.": (0.5, 0.9, 1.1, 1.1, 1.4)},
}


def grid_index(gbit: float) -> int:
    """The paper's value as an index of GRID (its values are rounded to 0.1 Gbit/s)."""
    return min(range(len(GRID)), key=lambda k: abs(math.log(GRID[k] / gbit)))


def setting(scale: str, method: str, steps: int = 2 * H) -> tuple[str, dict, int]:
    """(strategy, its parameters, steps) that `method` trains at `scale`."""
    strategy, params, _ = METHODS[method]
    if strategy == "streaming-diloco":
        params = {**params, "fragments": SCALES[scale][1] // FRAGMENT_LAYERS}
    return strategy, params, 10 if strategy == "ddp" else steps


def projection_for(scale: str, method: str, trace: dict, bytes_factor: float = 1.0,
                   layer_buckets: bool = True) -> Projection:
    """The paper's model size, step time and payload bits; buckets of one layer (a
    fragment: FRAGMENT_LAYERS buckets of the small model's fragment, ceil(N/F) values, a
    hair over that many layers' share) or torch's 25 MiB."""
    parameters, layers, step = SCALES[scale]
    strategy, params, _ = setting(scale, method)
    bits = METHODS[method][2] * bytes_factor
    bucket_mib = parameters / layers * bits / 8 / 2 ** 20
    if strategy == "streaming-diloco":
        values = trace["model_parameters"]
        share = math.ceil(values / params["fragments"]) / values
        bucket_mib = parameters * share * bits / 8 / 2 ** 20 / FRAGMENT_LAYERS
    return Projection(parameters, step, bits, bucket_mib if layer_buckets else 25)


def train(strategy: str, params: dict, steps: int) -> dict:
    config = RunConfig(workload_params=dict(WORKLOAD), strategy=strategy, strategy_params=params,
                       nodes=2, steps=steps, compute="fixed:10ms").validate()
    return execute(job_from_config(config)).trace


def network(folder: Path, gbit: float, protocol: str) -> str:
    path = folder / f"net-{gbit:.6g}-{protocol}.yaml"
    path.write_text(f"bandwidth: {gbit:.9g}gbit\nlatency: 0ms\nprotocol: {protocol}\n")
    return str(path)


@functools.cache
def two_nodes_at(folder: Path, gbit: float, protocol: str):
    """The simulator's setup for two nodes at `gbit` (once per bandwidth, for every method)."""
    return resolve_sim(network(folder, gbit, protocol), "measured", "", 2, get_plugin_manager())


def utilizations(trace: dict, projection: Projection, folder: Path, protocol: str) -> list:
    """Compute utilization at each GRID bandwidth, stopping once it passes the last level."""
    out = []
    for gbit in GRID:
        sim = two_nodes_at(folder, gbit, protocol)
        out.append(replay_trace(trace, sim, projection)["compute_utilization"])
        if out[-1] >= LEVELS[-1]:
            break
    return out


def rule_utilization(parameters: float, layers: int, step: float, bits: float, method: str,
                     steps: int, gbit: float) -> float:
    """The same setting by the rule the projection is documented to follow, computed here
    step by step without exoframe: a step computes for `step` (forward 1/3, then the backward
    pass in one slice per layer); each all-reduce goes out one layer-sized bucket per
    backward slice, one bucket at a time on one link (two workers: 2(n-1)/n = 1, so a bucket
    takes its bytes over the bandwidth); the step that waits for it ends no sooner than its
    last bucket, and the run once nothing is in flight. Utilization = compute / elapsed
    time."""
    strategy, params, _ = METHODS[method]
    fragments = layers // FRAGMENT_LAYERS
    offsets = [((f + 1) * H // fragments) % H for f in range(fragments)]
    tau = params.get("tau", 0)
    model_bytes = parameters * bits / 8
    per_second = gbit * 1e9 / 8
    elapsed = link_free = 0.0
    waits = {}  # step -> when the exchanges it waits for are done
    for s in range(1, steps + 1):
        if strategy == "ddp":
            exchanges = [(model_bytes, layers, s)]
        elif strategy == "diloco":
            exchanges = [(model_bytes, layers, s)] if s % H == 0 else []
        else:
            exchanges = [(model_bytes / fragments, FRAGMENT_LAYERS, s + tau)
                         for offset in offsets if s % H == offset]
        start = elapsed
        for nbytes, buckets, wait_at in exchanges:
            for k in range(buckets):
                ready = start + step / 3 + (k + 1) * (2 * step / 3) / buckets
                link_free = max(ready, link_free) + nbytes / buckets / per_second
            waits[wait_at] = max(waits.get(wait_at, 0.0), link_free)
        elapsed = max(start + step, waits.pop(s, 0.0))
    elapsed = max([elapsed, *waits.values()])  # the run ends once nothing is in flight
    return steps * step / elapsed


def first_reaching(curve: list, level: float) -> int | None:
    return next((k for k, u in enumerate(curve) if u >= level - 1e-12), None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", choices=["none", "tcp"], default="none")
    parser.add_argument("--bucket", choices=["layer", "25mib"], default="layer")
    parser.add_argument("--steps", type=int, default=2 * H)
    parser.add_argument("--scales", default=",".join(SCALES))
    parser.add_argument("--bytes-factor", type=float, default=1.0)
    args = parser.parse_args()
    scales = args.scales.split(",")
    offsets, rule_offsets = [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        traces = {}
        for scale in scales:
            parameters, layers, step = SCALES[scale]
            print(f"\n{scale}: {layers} layers, {step} s/step; Gbit/s for CU = "
                  + ", ".join(f"{level:.0%}" for level in LEVELS)
                  + " (exoframe / the rule / paper)")
            for method in METHODS:
                strategy, params, steps = setting(scale, method, args.steps)
                key = (strategy, tuple(sorted(params.items())), steps)
                if key not in traces:
                    traces[key] = train(strategy, params, steps)
                projection = projection_for(scale, method, traces[key], args.bytes_factor,
                                            args.bucket == "layer")
                bits = projection.payload_bits
                curve = utilizations(traces[key], projection, folder, args.protocol)
                rule = [rule_utilization(parameters, layers, step, bits, method, steps, gbit)
                        for gbit in GRID]
                cells = []
                for level, paper in zip(LEVELS, PAPER[scale][method]):
                    k, r = first_reaching(curve, level), first_reaching(rule, level)
                    offset = k - grid_index(paper) if k is not None else None
                    offsets.append(offset)
                    rule_offsets.append(None if k is None or r is None else k - r)
                    ours, theirs = (f"{GRID[i]:.1f}" if i is not None else ">1000"
                                    for i in (k, r))
                    cells.append(f"{ours}/{theirs}/{paper}")
                print(f"  {method:40s} " + " ".join(f"{c:>18s}" for c in cells))
    known = [o for o in offsets if o is not None]
    print(f"\n{len(offsets)} values: {sum(o == 0 for o in known)} equal, "
          f"{sum(o == 1 for o in known)} one step above, {sum(o == -1 for o in known)} one "
          f"step below, {sum(abs(o) > 1 for o in known)} further, "
          f"{len(offsets) - len(known)} not reached; within one step: "
          f"{sum(abs(o) <= 1 for o in known)} of {len(offsets)}; mean offset "
          f"{sum(known) / max(1, len(known)):+.2f} steps (one step = x1.207)")
    print(f"against the rule computed here (one-layer buckets, ideal links): "
          f"{rule_offsets.count(0)} of {len(rule_offsets)} equal, "
          f"{sum(o is not None and o != 0 for o in rule_offsets)} differ"
          + ("" if args.bucket == "layer" and args.protocol == "none"
             else " (this run's buckets or links are not the rule's)"))


if __name__ == "__main__":
    main()
