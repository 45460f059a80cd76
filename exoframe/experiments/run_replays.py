"""Replays of a run folder's trace through other networks, saved beside the run.

A replay is stored as <run>/replays/<network>.json with the same timing fields as
summary.json (simulated_seconds, compute_utilization, per_rank) plus each step's
simulated time, so reports can draw loss against simulated time for every network.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ExoframeError, shorten
from ..files import write_atomic
from ..plugins import get_plugin_manager
from ..report import strict_json
from ..sim import SimSetup, resolve_sim
from ..sim.network.collectives import Plans
from ..sim.traces.projection import DDP_BUCKET_BYTES, project
from ..sim.traces.replay import NotReplayable, ReplayError, all_reduce_alone, check_trace, replay

MIB = 1024 * 1024


@dataclass
class Projection:
    """Answer for a model of `parameters` parameters whose training step computes for
    `step_seconds`, whose exchanges carry `payload_bits` per value (32: fp32 as recorded,
    16: bf16, fewer for a quantized exchange) and whose streamed all-reduces go in buckets of
    `bucket_mb` MiB (see exoframe.sim.traces.projection)."""

    parameters: float
    step_seconds: float
    payload_bits: float = 32
    bucket_mb: float = DDP_BUCKET_BYTES / MIB

    def __post_init__(self):
        if not 0 < self.parameters < math.inf:
            raise ExoframeError(f"--project-params must be a positive number of parameters "
                                f"(e.g. 1e9), got {self.parameters:g}.")
        if not 0 < self.step_seconds < math.inf:
            raise ExoframeError(f"--step-time must be a positive time (e.g. 0.5s), got "
                                f"{self.step_seconds:g} s.")
        if not 0 < self.payload_bits <= 32:
            raise ExoframeError(f"--payload-bits must be more than 0 and at most 32 bits per "
                                f"value (32: fp32, 16: bf16, 8, 4, ...), got "
                                f"{self.payload_bits:g}.")
        if not 0 < self.bucket_mb < math.inf:
            raise ExoframeError(f"--bucket-mb must be a positive size in MiB (torch's DDP: 25), "
                                f"got {self.bucket_mb:g}.")

    def label(self) -> str:
        extras = []
        if self.payload_bits != 32:
            extras.append(f"{self.payload_bits:g}-bit payloads")
        if self.bucket_mb != DDP_BUCKET_BYTES / MIB:
            extras.append(f"{self.bucket_mb:g} MiB buckets")
        return ", ".join([f"{self.parameters:.3g} params, {self.step_seconds:g} s/step", *extras])


def load_trace(run_dir) -> dict:
    path = Path(run_dir) / "trace.json"
    if not path.is_file() and (Path(run_dir) / "summary.json").is_file():
        summary = strict_json.load(Path(run_dir) / "summary.json", "summary")
        status = summary.get("status") if isinstance(summary, dict) else None
        if status in ("failed", "interrupted"):
            raise ExoframeError(
                f"{run_dir}: the run {status} after {summary.get('steps_completed')} steps "
                f"({shorten(str(summary.get('error')), 200)}); only a run that completes "
                "records a trace to replay. Resume it (`exoframe resume`) or run it again.")
    if not path.is_file():
        raise ExoframeError(f"{run_dir}: no trace.json; only runs made by exoframe 0.1 with the "
                            "network simulator record one. Run it again with `exoframe run`.")
    trace = strict_json.load(path, "trace")
    try:
        check_trace(trace)
    except NotReplayable as e:
        raise ExoframeError(f"{run_dir}: {e}.") from None
    except ReplayError as e:
        raise ExoframeError(f"trace {path}: {e}; the file is corrupt or truncated: run the "
                            "run again to record it.") from None
    return trace


def check_replayable(trace: dict, where) -> None:
    if trace["timing_dependent"]:
        raise ExoframeError(
            f"{where}: strategy '{trace['strategy']}' is timing-dependent (what it does depends "
            "on when data arrives), so its trace cannot be replayed on another network; re-run "
            "it with --net instead (exoframe sweep does that by itself).")


def replay_trace(trace: dict, sim: SimSetup, projection: Projection | None = None) -> dict:
    """Replay `trace` through the network of `sim` (a SimSetup for the trace's node count)."""
    if sim.real:
        raise ExoframeError("--net real: a replay computes times on a simulated network; name "
                            "one (a preset or a YAML file).")
    ranks = trace["ranks"]
    if projection is not None:
        ratio = projection.parameters / trace["model_parameters"] * projection.payload_bits / 32
        try:
            ranks = project(
                ranks, ratio, projection.step_seconds, trace["bucketed_gradients"],
                # Traces made before outer syncs could be declared overlappable lack the key.
                trace.get("overlapped_outer_sync", False), projection.bucket_mb * MIB,
                all_reduce_alone(sim.topology, sim.algorithms, trace["nodes"], trace["seed"]))
        except ReplayError as e:
            raise ExoframeError(f"projection of '{trace['strategy']}': {e}") from None
    try:
        # A projection's backward pass runs beside its communication stream ("b" events),
        # which the host's overlap rate does not describe: projections leave it out.
        overlap = trace.get("overlap_rate") if projection is None else None
        result = replay(ranks, sim.topology, sim.algorithms, seed=trace["seed"],
                        overlap_rate=overlap)
    except ReplayError as e:
        raise ExoframeError(f"replay of '{trace['strategy']}' on {sim.net}: {e}") from None
    simulated = result.simulated_seconds
    return {
        "strategy": trace["strategy"],
        "net": sim.net,
        "bottleneck_bandwidth": sim.topology.bottleneck(),
        "latency": sim.topology.longest_latency(),
        "projection": projection.label() if projection else None,
        "simulated_seconds": simulated,
        "compute_utilization": result.compute_utilization,
        "bytes_sent_per_node": _bytes_sent_per_node(ranks, sim),
        "per_rank": [{"rank": r.rank, **r.stats()} for r in result.ranks],
        "sim_times": result.step_times(),
    }


def replay_run(run_dir, net: str, projection: Projection | None = None, save: bool = True,
               pm=None) -> dict:
    """Replay the run in `run_dir` on network `net` (preset name or YAML file)."""
    trace = load_trace(run_dir)
    if projection is None:
        check_replayable(trace, run_dir)
    sim = resolve_sim(net, "measured", "", trace["nodes"], pm or get_plugin_manager())
    record = replay_trace(trace, sim, projection)
    if save:
        save_replay(run_dir, record)
    return record


def save_replay(run_dir, record: dict) -> Path:
    folder = Path(run_dir) / "replays"
    folder.mkdir(exist_ok=True)
    name = record["net"] + (f" [{record['projection']}]" if record["projection"] else "")
    path = folder / (re.sub(r"[^\w.@+-]+", "_", name) + ".json")  # "/" in "s/step"
    write_atomic(path, strict_json.dumps(record, indent=1) + "\n")
    return path


def _bytes_sent_per_node(ranks: list, sim: SimSetup) -> float:
    """Bytes each rank sends on average, by the network's algorithm for each operation."""
    plans, total = Plans(sim.topology.algorithms, sim.algorithms, sim.topology), 0.0
    for rank, events in enumerate(ranks):
        for event in (e for e in events if e[0] == "o"):
            _, _, _, kind, nbytes, participants, root, _ = event
            plan = plans.of(kind, len(participants), root, participants)
            total += plan.compiled.sent[list(participants).index(rank)] * nbytes
    return total / len(ranks)
