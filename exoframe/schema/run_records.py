"""The records a run writes, one dataclass each, the fields in the files' order:
summary.json (RunSummary for a completed run, StoppedSummary for one that failed or was
interrupted), a metrics.jsonl line (Row), trace.json (Trace), and what a rank sends the
launcher when it is done (RankResult). docs/schemas/ holds their JSON Schemas, made from
these classes (`python -m exoframe.schema.schemas`).

A number that can be non-finite (a loss that diverged) is `float | None`: the files are
strict JSON, where NaN and infinities are written null (report/strict_json.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Optional

from .codec import SCHEMA_VERSION, Record, absent_when_none, flattened


@dataclass(kw_only=True)
class Traffic(Record):
    """One kind of operation of a rank (all_reduce, send, ...): calls and bytes."""
    calls: int
    bytes_sent: int
    bytes_received: int


@dataclass(kw_only=True)
class FailureRecord(Record):
    """A simulated failure of a node (exoframe/comm/rank_failures.py): when, and what it cost."""
    rank: int
    failed_at: float
    noticed_at: float
    back_at: Optional[float]
    step: int
    steps_lost: int  # trained since its last synchronization: discarded
    compute_lost_seconds: float
    steps_down: int
    rejoined_at: Optional[float]
    recovered_from: Optional[int]  # the peer whose state it took back (None: its own)
    recovery_bytes: int
    recovery_seconds: float


@dataclass(kw_only=True)
class RankResult(Record):
    """What a rank did, sent to the launcher as it ends (engine/node/rank.py): its traffic,
    memory and samples, its clock's totals (exoframe/sim/clocks/clock.py), its failures and
    its trace (which goes to trace.json). Not a file: written nowhere, it has no key for
    its version."""
    schema_version: ClassVar[int] = SCHEMA_VERSION
    traffic: dict[str, Traffic]
    bytes_sent: int
    bytes_received: int
    peak_rss_mb: float
    samples: int
    moving_models_seconds: float
    simulated_seconds: float
    compute_seconds: float
    comm_seconds: float
    idle_seconds: float
    # comm_seconds split by the simulator: round trips and bytes (none on a real network)
    comm_latency_seconds: Optional[float] = absent_when_none()
    comm_bandwidth_seconds: Optional[float] = absent_when_none()
    down_seconds: float
    # --net real: added by exoframe/sim/clocks/measured.py split_measured
    transfer_seconds: Optional[float] = absent_when_none()
    wait_seconds: Optional[float] = absent_when_none()
    compute_cpu_seconds: Optional[float] = absent_when_none()
    failures: list[FailureRecord]
    trace: Optional[list] = absent_when_none()  # taken out for trace.json


@dataclass(kw_only=True)
class RankSummary(Record):
    """summary.json's `per_rank`: one rank's times, steps and traffic."""
    rank: int
    simulated_seconds: float
    compute_seconds: float
    comm_seconds: float
    comm_latency_seconds: Optional[float] = absent_when_none()
    comm_bandwidth_seconds: Optional[float] = absent_when_none()
    idle_seconds: float
    down_seconds: float
    transfer_seconds: Optional[float] = absent_when_none()
    wait_seconds: Optional[float] = absent_when_none()
    compute_cpu_seconds: Optional[float] = absent_when_none()
    steps_down: int
    steps_trained: int  # neither spent down nor lost with a failure
    bytes_sent: int
    bytes_received: int
    traffic: dict[str, Traffic]
    compute_utilization: Optional[float]


@dataclass(kw_only=True)
class Validation(Record):
    """summary.json's `validation`: the examples validated on and what validating cost."""
    examples: int
    drawn_from: str
    replicas_average: Optional[str]
    validating_seconds: float
    moving_models_seconds: float


@dataclass(kw_only=True)
class Row(Record):
    """A metrics.jsonl line: one step, averaged over the ranks (engine/launch/step_rows.py).
    The lines carry no version key (a column every metrics.csv and sink would gain): they are
    of the version of the run's summary.json."""
    schema_version: ClassVar[int] = SCHEMA_VERSION
    step: int
    loss: Optional[float] = absent_when_none()  # none when every node was down
    lr: Optional[float] = absent_when_none()
    sim_time: float  # when the step's last rank ended it
    # the strategy's and precision's own numbers (outer_grad_norm, loss_scale, ...)
    metrics: dict[str, Optional[float]] = flattened("")
    grad_norm: Optional[float] = absent_when_none()  # before clipping (clip_grad_norm)
    nodes_down: Optional[float] = absent_when_none()  # with faults
    bytes_sent_per_node: float
    val_loss: Optional[float] = absent_when_none()  # of the held model, at evaluation steps
    # the workload's validation metrics (val_accuracy, ...)
    val_metrics: dict[str, Optional[float]] = flattened("val_")
    val_loss_replicas_average: Optional[float] = absent_when_none()


@dataclass(kw_only=True)
class RunSummary(Record):
    """summary.json of a completed run (report/summary.py build_run_summary)."""
    status: Literal["completed"]  # (first: how the run ended)
    schema_version: int = SCHEMA_VERSION
    strategy: str
    strategy_params: dict[str, Any]
    workload: str
    model_parameters: int
    num_nodes: int
    steps: int  # run: fewer than asked when a stopping rule stopped the run
    stopped_by: str  # steps, target_loss or time_budget
    time_budget: Optional[float]
    final_loss: Optional[float]
    final_val_loss: Optional[float]
    # the workload's own validation metrics at the last validation (final_val_accuracy, ...)
    final_val_metrics: dict[str, Optional[float]] = flattened("final_val_")
    best_achievable_loss: Optional[float]
    validated_model: str  # what val_loss is of: the model a node would deploy, in words
    validation: Optional[Validation]
    target_loss: Optional[float]
    time_to_target: Optional[float]
    steps_to_target: Optional[int]
    seed: int
    partition: Optional[dict[str, Any]]  # each node's size and label histogram
    net: str
    net_defaults: list[str]  # what the network file left out, so the model took its default
    real_network: bool  # --net real: the times are measured, not simulated
    bottleneck_bandwidth: Optional[float]
    latency: Optional[float]
    compute_model: str
    overlap_rate: Optional[float]
    stragglers: str
    faults: str
    failures: list[FailureRecord]
    lost_steps: int
    lost_compute_seconds: float
    down_seconds: float
    recovery_seconds: float
    simulated_seconds: float
    compute_utilization: Optional[float]
    syncs: int  # steps at which the nodes exchanged anything
    overlapped_compute_share: Optional[float]
    comm_seconds_per_node: float
    comm_latency_seconds_per_node: Optional[float]
    comm_bandwidth_seconds_per_node: Optional[float]
    idle_seconds_per_node: float
    per_rank: list[RankSummary]
    bytes_sent_per_node: float
    bytes_received_per_node: float
    bytes_sent_per_node_per_step: float
    bytes_sent_per_rank: list[int]
    bytes_received_per_rank: list[int]
    traffic_by_kind_rank0: dict[str, Traffic]
    bytes_between_sites: dict[str, float]  # "a->b" -> bytes (empty without sites)
    effective_batch_size: float  # batch × accumulate × nodes
    samples_seen: int
    tokens_seen: Optional[int]
    samples_per_second: Optional[float]
    elapsed_seconds: float
    startup_seconds: float
    seconds_per_step: float
    peak_rss_mb_per_rank: list[float]
    resumed_from_step: Optional[int] = absent_when_none()  # (a resumed run)


@dataclass(kw_only=True)
class StoppedSummary(Record):
    """summary.json of a run that did not complete (engine/run.py partial_summary): what it
    was, why it stopped and every step it finished. Also what a running run's summary.json
    says until it ends ("failed", with the steps so far)."""
    status: Literal["failed", "interrupted"]  # (first: how the run ended)
    schema_version: int = SCHEMA_VERSION
    error: str
    strategy: str
    workload: str
    num_nodes: int
    steps: int
    steps_completed: int
    final_loss: Optional[float]
    final_val_loss: Optional[float]
    seed: int
    net: str
    rows: Optional[list[Row]]  # None where a full disk left no room for them


@dataclass(kw_only=True)
class Trace(Record):
    """trace.json: what each rank's clock saw, for replays (exoframe/sim/traces/replay.py)
    and timelines. `version` is the encoding of the events, which the replay reads."""
    schema_version: int = SCHEMA_VERSION
    version: int
    strategy: str
    timing_dependent: bool
    bucketed_gradients: bool
    overlapped_outer_sync: bool
    nodes: int
    steps: int
    seed: int
    net: str
    real_network: bool
    compute_model: str
    overlap_rate: Optional[float]
    faults: str
    model_parameters: int
    ranks: list[list[list[Any]]]  # per rank, its events: ["c", seconds], ["s", step], ...


def summary_from_json(data, where: str = "summary.json") -> RunSummary | StoppedSummary:
    """summary.json's record: a RunSummary when its status is "completed", else a
    StoppedSummary."""
    completed = isinstance(data, dict) and data.get("status") == "completed"
    return (RunSummary if completed else StoppedSummary).from_json(data, where)
