"""The run summary (summary.json) and its short terminal table."""
from __future__ import annotations

from ..schema import RankResult, RankSummary, RunSummary, Validation
from ..sim.clocks.clock import overlapped_compute
from ..sim.clocks.compute import MACHINE_OVERLAP
from ..sim.network.units import YEAR, format_bandwidth, format_duration
from .bounds import bound_text

# Below this share of simulated time spent computing, the compute model says so: times
# then compare networks alone (flops:h100 on a tiny model gives microseconds per step).
LOW_UTILIZATION = 0.01
REPLICAS_KEY = "final_val_loss_replicas_average"


def build_run_summary(job, rows: list[dict], launch_result) -> RunSummary:
    """The record of a completed run: what it was, how it went, where each rank's time went
    (rows: its metrics rows; launch_result: engine/launch/launcher.py's LaunchResult)."""
    ranks = [RankResult.from_json(r, f"rank {rank}'s result")
             for rank, r in enumerate(launch_result.rank_results)]
    last = rows[-1] if rows else {}
    val_rows = [r for r in rows if r.get("val_loss") is not None]
    at_target = first_at_target(rows, job.target_loss)
    nodes = job.nodes
    steps = launch_result.steps or job.steps
    simulated = max(r.simulated_seconds for r in ranks)
    samples = sum(r.samples for r in ranks)
    per_rank = [RankSummary(
        rank=rank,
        simulated_seconds=r.simulated_seconds,
        compute_seconds=r.compute_seconds,
        comm_seconds=r.comm_seconds,
        # comm_seconds split by the simulator: round trips and bytes (report/bounds.py)
        comm_latency_seconds=r.comm_latency_seconds,
        comm_bandwidth_seconds=r.comm_bandwidth_seconds,
        idle_seconds=r.idle_seconds,
        down_seconds=r.down_seconds,
        # --net real: comm is the transfer, idle the wait (exoframe/sim/clocks/measured.py)
        transfer_seconds=r.transfer_seconds,
        wait_seconds=r.wait_seconds,
        compute_cpu_seconds=r.compute_cpu_seconds,
        steps_down=sum(f.steps_down for f in r.failures),
        # steps whose work counts: neither spent down nor lost with a failure
        steps_trained=steps - sum(f.steps_down + f.steps_lost for f in r.failures),
        bytes_sent=r.bytes_sent,
        bytes_received=r.bytes_received,
        traffic=r.traffic,  # per operation kind: calls, bytes sent and received
        compute_utilization=_ratio(r.compute_seconds, r.simulated_seconds),
    ) for rank, r in enumerate(ranks)]
    failures = sorted((f for r in ranks for f in r.failures),
                      key=lambda f: (f.failed_at, f.rank))
    simulator_split = not job.sim.real and all(r.comm_latency_seconds is not None
                                                and r.comm_bandwidth_seconds is not None
                                                for r in ranks)
    return RunSummary(
        status="completed",
        strategy=job.strategy_name,
        strategy_params=vars(job.strategy_params).copy(),
        workload=job.workload_name,
        model_parameters=sum(p.numel() for p in job.model.parameters()),
        num_nodes=nodes,
        steps=steps,  # run: fewer than asked when a stopping rule stopped the run
        stopped_by=launch_result.stopped_by,  # steps, target_loss or time_budget
        time_budget=job.time_budget,
        final_loss=last.get("loss"),
        final_val_loss=val_rows[-1]["val_loss"] if val_rows else None,
        # the workload's own validation metrics (val_accuracy, ...) at the last validation
        final_val_metrics={f"final_{key}": value for key, value
                           in (val_rows[-1] if val_rows else {}).items()
                           if key.startswith("val_") and key != "val_loss"},
        best_achievable_loss=job.best_loss,
        # What val_loss, the time to target and the final model are of: the model a node
        # would deploy (the strategy's declaration, strategies/base.py held_model).
        validated_model=job.strategy_cls.traits.held_model,
        # The examples validated on and what validating cost (engine/launch/validation_set.py).
        validation=(None if launch_result.validation is None else
                    Validation.from_json(launch_result.validation, "the run's validation")),
        # Read from the validation loss of that model, validated at every step.
        target_loss=job.target_loss,
        time_to_target=at_target["sim_time"] if at_target else None,
        steps_to_target=at_target["step"] if at_target else None,
        seed=job.seed,
        # the training set's split over the nodes: each node's size and label histogram
        partition=job.partition,
        net=job.sim.net,
        # what the network file left out, so the model took its default ('queue: fair')
        net_defaults=list(job.sim.defaults),
        real_network=job.sim.real,  # --net real: the times are measured, not simulated
        bottleneck_bandwidth=job.sim.topology.bottleneck(),
        latency=job.sim.topology.longest_latency(),
        compute_model=job.sim.compute.describe(),
        # bytes/s an exchange moves while its rank computes (the compute model's overlap=)
        overlap_rate=job.sim.compute.overlap_rate,
        stragglers=job.sim.stragglers.describe(),
        # Simulated failures: each one (when, how long, what it cost), and the totals. Lost
        # steps are a node's steps that count for nothing: those it trained since its last
        # synchronization before failing, and those it spent down.
        faults=job.faults.describe(),
        failures=failures,
        lost_steps=sum(f.steps_lost + f.steps_down for f in failures),
        lost_compute_seconds=sum(f.compute_lost_seconds for f in failures),
        down_seconds=sum(r.down_seconds for r in ranks),
        recovery_seconds=sum(f.recovery_seconds for f in failures),
        simulated_seconds=simulated,
        # Over the whole run: the ranks' compute / (ranks × simulated time to finish).
        compute_utilization=_ratio(sum(r.compute_seconds for r in ranks), nodes * simulated),
        # Steps at which the nodes exchanged anything (a sync, a fragment, a gossip round).
        syncs=steps_with_exchange(rows),
        # Of the ranks' compute, the share run beside their own exchanges in flight.
        overlapped_compute_share=None if job.sim.real else _ratio(
            sum(overlapped_compute(r.trace) for r in ranks),
            sum(r.compute_seconds for r in ranks)),
        comm_seconds_per_node=sum(r.comm_seconds for r in ranks) / nodes,
        # of it, on the paths that ended each wait: round trips (latency) and bytes
        # (bandwidth); None on a real network (exoframe/sim/clocks/critical_path.py)
        comm_latency_seconds_per_node=(sum(r.comm_latency_seconds for r in ranks) / nodes
                                       if simulator_split else None),
        comm_bandwidth_seconds_per_node=(sum(r.comm_bandwidth_seconds for r in ranks) / nodes
                                         if simulator_split else None),
        idle_seconds_per_node=sum(r.idle_seconds for r in ranks) / nodes,
        per_rank=per_rank,
        bytes_sent_per_node=sum(r.bytes_sent for r in ranks) / nodes,
        bytes_received_per_node=sum(r.bytes_received for r in ranks) / nodes,
        bytes_sent_per_node_per_step=sum(r.bytes_sent for r in ranks) / nodes / steps,
        bytes_sent_per_rank=[r.bytes_sent for r in ranks],
        bytes_received_per_rank=[r.bytes_received for r in ranks],
        traffic_by_kind_rank0=ranks[0].traffic,
        # Over the network's links between sites (empty without sites): "a->b" -> bytes.
        bytes_between_sites=getattr(launch_result, "bytes_between_sites", None) or {},
        # The training history as a DDP user reads it, from the examples the ranks trained on
        # (a shard smaller than a batch, or a kept short batch, gives fewer than asked).
        effective_batch_size=_per_step(samples, steps),  # batch × accumulate × nodes
        samples_seen=samples,
        tokens_seen=samples * job.tokens_per_sample if job.tokens_per_sample else None,
        samples_per_second=_ratio(samples, launch_result.elapsed_seconds
                                  - launch_result.startup_seconds),
        elapsed_seconds=launch_result.elapsed_seconds,
        startup_seconds=launch_result.startup_seconds,
        seconds_per_step=(launch_result.elapsed_seconds - launch_result.startup_seconds)
        / max(1, steps - 1),
        peak_rss_mb_per_rank=[round(r.peak_rss_mb, 1) for r in ranks],
    )


def steps_with_exchange(rows: list[dict]) -> int:
    sent = [0.0, *(r.get("bytes_sent_per_node") or 0.0 for r in rows)]
    return sum(after > before for before, after in zip(sent, sent[1:]))


def compute_warning(summary: dict | RunSummary) -> str | None:
    """One line when the compute model leaves the nodes computing less than 1 % of the
    simulated time, else None."""
    summary = as_run_summary(summary)
    utilization = summary.compute_utilization
    if summary.real_network or utilization is None or utilization >= LOW_UTILIZATION:
        return None
    ranks = summary.per_rank
    per_step = sum(r.compute_seconds for r in ranks) / len(ranks) / max(1, summary.steps)
    return (f"warning: compute model {summary.compute_model} gives "
            f"{format_duration(per_step)} of compute per step, {100 * utilization:.2g}% of the "
            "simulated time: the times compare the network alone and stragglers change "
            "little; give the step time you mean (--compute fixed:<time per step>) or a larger "
            "model.")


def as_run_summary(summary: dict | RunSummary) -> RunSummary:
    """A completed run's summary as its record (RunResult.summary is summary.json's mapping)."""
    if isinstance(summary, RunSummary):
        return summary
    return RunSummary.from_json(summary, "the run's summary")


def first_at_target(rows: list[dict], target: float | None) -> dict | None:
    """The first step's row whose validation loss is at most `target`."""
    if target is None:
        return None
    return next((r for r in rows if r.get("val_loss") is not None and r["val_loss"] <= target),
                None)


def _per_step(samples: int, steps: int):
    per_step = samples / max(1, steps)
    return int(per_step) if per_step == int(per_step) else per_step


def _ratio(a: float, b: float):
    return a / b if b > 0 else None


def format_seconds(s: float) -> str:
    if s >= YEAR:
        return f"{s / YEAR:.3g} years"
    if s >= 3600:
        return f"{s / 3600:.2f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return f"{s:.3g} s" if s < 10 else f"{s:.1f} s"


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n} B"


def summary_table(summary: dict | RunSummary, extra: tuple = ()) -> str:
    """A completed run's summary as `exoframe run` prints it; extra: more (name, value) rows,
    last."""
    def fmt(x):
        return "-" if x is None else f"{x:.4f}"

    s = as_run_summary(summary)
    replicas_loss = s.final_val_metrics.get(REPLICAS_KEY)
    rows = [
        ("strategy", s.strategy + _params_text(s.strategy_params)),
        ("workload", s.workload + (f" ({s.model_parameters:,} parameters)"
                                   if s.model_parameters else "")),
        ("nodes", str(s.num_nodes)),
        ("steps", str(s.steps) + ("" if s.stopped_by == "steps"
                                  else f" (stopped by {s.stopped_by})")),
        ("final train loss", fmt(s.final_loss)),
        ("final val loss", fmt(s.final_val_loss)
         + (f" ({s.validated_model})" if s.validated_model else "")),
        *((key.replace("_", " "), fmt(value)) for key, value in s.final_val_metrics.items()
          if key != REPLICAS_KEY),
        *([("final val loss", f"{fmt(replicas_loss)} (replicas' average, a model no node "
                              "holds)")] if replicas_loss is not None else []),
        ("best achievable loss", fmt(s.best_achievable_loss)),
        ("sent per node", f"{format_bytes(s.bytes_sent_per_node)} in {s.syncs} steps with an "
                          "exchange"),
        ("network", s.net + (f" (not stated, so {', '.join(s.net_defaults)})"
                             if s.net_defaults else "")),
        ("measured wall-clock", f"{format_seconds(s.simulated_seconds)} "
                                "(--net real: nothing simulated)")
        if s.real_network else
        ("simulated wall-clock", f"{format_seconds(s.simulated_seconds)} "
                                 f"(compute model {s.compute_model})"),
        ("compute utilization", "-" if s.compute_utilization is None
         else f"{100 * s.compute_utilization:.1f}%"),
        *_comm_rows(s),
        *_bound_rows(s),
        *_failure_rows(s),
        *_target_rows(s),
        ("elapsed (real)", f"{s.elapsed_seconds:.1f} s (start-up {s.startup_seconds:.1f} s)"),
        *extra,
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def _params_text(params: dict | None) -> str:
    shown = {k: v for k, v in (params or {}).items() if v not in ({}, [], None)}
    return f" ({', '.join(f'{k}={v}' for k, v in shown.items())})" if shown else ""


def _comm_rows(s: RunSummary) -> list:
    if s.real_network:
        return []
    rows = [("comm / idle per node", f"{format_seconds(s.comm_seconds_per_node)} "
             f"communicating (not hidden behind compute) / "
             f"{format_seconds(s.idle_seconds_per_node)} waiting for peers")]
    overlapped = s.overlapped_compute_share
    # (bottleneck None: no link is limited, an exchange takes no time)
    if overlapped and overlapped >= 0.005 and s.bottleneck_bandwidth is not None:
        rate = s.overlap_rate
        rows.append(("overlapped exchanges", OVERLAP_NOTE.format(share=overlapped)
                     if rate is None else OVERLAP_RATE_NOTE.format(
                         share=overlapped, rate=format_bandwidth(rate))))
    return rows


# How exchanges overlapped with compute were simulated (docs/guides/network-fidelity.md, "How
# close is the simulated clock to a real network?"), said on every run that overlaps them.
_OVERLAPPED = "{share:.0%} of compute ran beside the nodes' exchanges in flight, which moved "
_NO_LOSS = ("; congestion loss is not modelled (where a full queue at a bottleneck drops "
            "packets, real runs of these exchanges took up to 1.17x the simulated time: "
            "the network guide, docs/guides/network-fidelity.md in exoframe's source)")
OVERLAP_NOTE = (_OVERLAPPED + "at the network's pace, as where the CPU is free for them (GPU "
                "hosts); where the ranks' compute takes the cores they need, give the compute "
                "model overlap=<bandwidth> (4 ranks on 2 cores: overlap=" + MACHINE_OVERLAP + ")"
                + _NO_LOSS)
OVERLAP_RATE_NOTE = (_OVERLAPPED + "at most {rate} each way while their ranks computed (the "
                     "compute model's overlap=)" + _NO_LOSS)


def _bound_rows(s: RunSummary) -> list:
    text = None if s.real_network else bound_text(s.to_json())  # (a report row's reader too)
    return [("bound by", text)] if text else []


def _failure_rows(s: RunSummary) -> list:
    if not s.failures:
        return []
    return [("failures", f"{len(s.failures)} ({s.faults}): {s.lost_steps} node-steps lost, "
                         f"{format_seconds(s.down_seconds)} down, "
                         f"{format_seconds(s.recovery_seconds)} recovering")]


def _target_rows(s: RunSummary) -> list:
    if s.target_loss is None:
        return []
    if s.time_to_target is None:
        return [("time to target", f"not reached (val loss {s.target_loss:g})")]
    return [("time to target", f"{format_seconds(s.time_to_target)} simulated, step "
                               f"{s.steps_to_target} (val loss of the "
                               f"{s.validated_model} <= {s.target_loss:g})")]
