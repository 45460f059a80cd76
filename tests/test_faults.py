"""Simulated node failures: the fault spec, the simulator's membership quorum, and real runs
in which a node fails and comes back (real processes, real collectives)."""
import json

import pytest

from exoframe.config import resolve_config
from exoframe.engine import execute, job_from_config
from exoframe.errors import ExoframeError
from exoframe.plugins import get_plugin_manager
from exoframe.sim import Simulator, Topology
from exoframe.sim.clocks.protocol import Quorum, Quorumed
from exoframe.sim.network.collectives import BUILTIN
from exoframe.sim.network.faults import Failure, parse_faults
from exoframe.sim.network.netconfig import load_network
from exoframe.sim.network.units import parse_bandwidth, parse_duration

H = 5  # diloco's sync period in these runs
STEPS = 40


# -- the spec and the plan --------------------------------------------------------------------
def test_a_fault_spec_reads_given_and_random_failures():
    spec = parse_faults("1@90s:1min, 0@2h:10s, rate:4/h:5min")
    assert spec.failures == (Failure(1, 90.0, 150.0), Failure(0, 7200.0, 7210.0))
    assert (spec.per_hour, spec.down) == (4.0, 300.0)
    assert parse_faults(spec.describe()) == spec
    assert parse_faults(["1@90s:60s"]) == parse_faults("1@90s:60s")  # a YAML list
    assert not parse_faults("").active


@pytest.mark.parametrize("spec, says", [
    ("1@90s", "give NODE@TIME:DOWN"),
    ("x@90s:1s", "give NODE@TIME:DOWN"),
    ("1@0:5s", "must be after the start"),
    ("1@5s:0s", "the time down must be a positive time"),
    ("1@5s:soon", "faults"),
    ("rate:many:5min", "must be a number"),
    ("rate:4", "should be rate:F:D"),
    ("rate:1:1s,rate:2:1s", "at most one rate"),
])
def test_a_bad_fault_spec_is_one_line_naming_faults(spec, says):
    with pytest.raises(ExoframeError) as e:
        parse_faults(spec)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_node_that_does_not_exist_is_refused_before_any_rank_starts():
    with pytest.raises(ExoframeError, match="node 5 does not exist in a run of 4 nodes"):
        resolve_config(None, {"nodes": 4, "faults": "5@1s:1s"})


def test_random_failures_are_seeded_and_arrive_at_the_rate():
    spec = parse_faults("rate:4:60s")
    hours = 200

    def failures(seed):
        plan = spec.plan(4, seed)
        found = []
        for rank in range(4):
            after = 0.0
            while (f := plan.next_failure(rank, after, hours * 3600.0)) is not None:
                found.append(f)
                after = f.back  # failures while down are absorbed
        return found

    first = failures(seed=3)
    assert first == failures(seed=3) and first != failures(seed=4)
    # 800 expected over the cluster (sd 28), a few absorbed by an earlier failure's window.
    assert 700 < len(first) < 900
    assert all(f.back - f.at == 60.0 for f in first)
    by_rank = {r: sorted(f.at for f in first if f.rank == r) for r in range(4)}
    assert all(b - a >= 60.0 for times in by_rank.values() for a, b in zip(times, times[1:]))


# -- the simulator's quorum -------------------------------------------------------------------
def quorum(joins):
    """joins: per rank (t, down_until); the replies by rank."""
    sim = Simulator(Topology.uniform(len(joins), 1e9, 0.001), BUILTIN)
    for rank, (t, down_until) in enumerate(joins):
        sim.receive(rank, Quorum(t, 0, down_until))
    replies = dict(sim.advance())
    assert sorted(replies) == list(range(len(joins)))
    return replies


def test_the_live_members_meet_and_a_node_whose_failure_is_over_joins():
    replies = quorum([(1.0, None), (2.0, None), (0.5, 1.5), (0.5, 3.0)])
    assert replies[0] == Quorumed(2.0, (0, 1), (2,))
    assert all(r == replies[0] for r in replies.values())  # one answer, the same for all


def test_with_every_node_down_the_first_one_back_goes_on_alone():
    replies = quorum([(1.0, 5.0), (2.0, 4.0), (3.0, 4.5)])
    assert replies[1] == Quorumed(4.0, (1,), ())
    assert replies[2].end == 4.0 and replies[0].end == 4.0


def test_a_quorum_a_rank_never_joins_is_reported_as_a_deadlock():
    sim = Simulator(Topology.uniform(3, 1e9, 0.001), BUILTIN)
    sim.receive(0, Quorum(1.0, 0, None))
    sim.receive(1, Quorum(1.0, 0, None))
    sim.rank_done(2)
    assert sim.advance() == []
    assert "rank(s) 2 never joined" in sim.stuck()


# -- real runs --------------------------------------------------------------------------------
def run(tmp_path, strategy, faults="", **extra):
    config = resolve_config(None, {
        "workload": "mlp", "strategy": strategy, "nodes": 4, "steps": STEPS,
        "strategy_params": {"H": H} if strategy == "diloco" else {}, "eval_every": 10,
        "compute": "fixed:100ms", "net": "wan-100mbps", "faults": faults,
        "out": str(tmp_path), **extra})
    result = execute(job_from_config(config), out=config.out)
    return result, [json.loads(line) for line in
                    (result.run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def diloco_runs(tmp_path_factory):
    """diloco on 4 nodes; then node 2 fails at 30 % of that run's time, back at 60 %."""
    tmp = tmp_path_factory.mktemp("faults")
    clean, _ = run(tmp / "clean", "diloco")
    T = clean.summary["simulated_seconds"]
    faults = f"2@{0.3 * T!r}s:{0.3 * T!r}s"
    faulted, rows = run(tmp / "faulted", "diloco", faults)
    return T, faults, faulted, rows


def test_a_diloco_node_fails_and_rejoins_with_the_state_timed_by_the_network(diloco_runs):
    T, faults, result, rows = diloco_runs
    summary = result.summary
    assert summary["status"] == "completed" and summary["steps"] == STEPS
    (failure,) = summary["failures"]
    assert failure["rank"] == 2 and failure["recovered_from"] == 0
    assert failure["failed_at"] == pytest.approx(0.3 * T, rel=1e-12)
    assert failure["back_at"] == pytest.approx(0.6 * T, rel=1e-12)

    # What it fetched: the model, AdamW's two moments and step count per parameter, DiLoCo's
    # global weights and its outer Nesterov momentum, as fp32.
    params = list(result.model.parameters())
    weights = sum(p.numel() for p in params) * 4
    assert failure["recovery_bytes"] == 5 * weights + 4 * len(params)
    # One transfer alone on the network (the others train between syncs): latency plus
    # bytes over the bottleneck, the latency drawn within the preset's jitter.
    net = load_network("wan-100mbps", get_plugin_manager().networks)
    bandwidth = parse_bandwidth(net.bandwidth, "bandwidth", "test")
    latency = parse_duration(net.latency, "latency", "test")
    jitter = parse_duration(net.jitter, "jitter", "test")
    # The preset models TCP: a 1448-byte segment travels in a 1514-byte frame (no flow
    # comes back, so no ACKs share its links; its window allows far more than 100 Mbit/s),
    # on a connection the ring never used: slow start from 10 segments, doubling every
    # round trip until the link holds it.
    payload_rate, rtt = bandwidth * 1448 / 1514, 2 * latency
    left, transfer, window = failure["recovery_bytes"], 0.0, 1448 * 10
    while window / rtt < payload_rate and left > window:  # whole round trips of slow start
        left, transfer, window = left - window, transfer + rtt, 2 * window
    transfer += left / min(window / rtt, payload_rate)
    assert abs(failure["recovery_seconds"] - transfer - latency) <= jitter + 1e-9

    # Down from the step it noticed the failure to the sync it rejoined at; the steps it
    # trained since its last sync are lost too.
    down = [r["step"] for r in rows if r["nodes_down"] == 1]
    assert down == list(range(failure["step"], down[-1] + 1)) and down[-1] % H == 0
    assert all(r["nodes_down"] == 0 for r in rows if r["step"] not in down)
    assert failure["steps_down"] == len(down)
    assert failure["steps_lost"] == (failure["step"] - 1) % H
    assert summary["lost_steps"] == failure["steps_lost"] + failure["steps_down"]
    assert failure["rejoined_at"] >= failure["back_at"]
    rank2 = summary["per_rank"][2]
    # simulated seconds: down from 30 % of T to a sync after 60 %
    assert rank2["down_seconds"] > 0.25 * T and rank2["steps_down"] == len(down)
    assert rank2["steps_trained"] == STEPS - summary["lost_steps"]
    total = sum(rank2[k] for k in ("compute_seconds", "comm_seconds", "idle_seconds",
                                   "down_seconds"))
    assert total == pytest.approx(rank2["simulated_seconds"], rel=1e-12)


def test_the_same_faults_give_the_same_run(diloco_runs, tmp_path):
    _, faults, result, rows = diloco_runs
    again, again_rows = run(tmp_path, "diloco", faults)
    assert again_rows == rows
    assert again.summary["failures"] == result.summary["failures"]


def test_ddp_goes_on_through_the_same_failure(diloco_runs, tmp_path):
    T, faults, _, _ = diloco_runs
    result, rows = run(tmp_path, "ddp", faults)
    assert result.summary["status"] == "completed"
    (failure,) = result.summary["failures"]
    assert failure["steps_lost"] == 0  # DDP synchronizes every step
    assert failure["recovery_seconds"] > 0 and failure["rejoined_at"] >= failure["back_at"]
    assert sum(r["nodes_down"] for r in rows) == failure["steps_down"] > 0


def test_a_strategy_that_cannot_go_on_without_a_node_stops_the_run_saying_so(tmp_path):
    with pytest.raises(ExoframeError, match="strategy 'gossip' cannot go on without it"):
        run(tmp_path, "gossip", "1@0.5s:1s", steps=10)
    (folder,) = tmp_path.iterdir()
    assert json.loads((folder / "summary.json").read_text())["status"] == "failed"


def test_a_sweep_takes_failure_settings_as_an_axis(tmp_path):
    from exoframe.experiments.sweep import sweep
    from exoframe.report.sweep_table import table

    base = resolve_config(None, {"workload": "mlp", "nodes": 2, "steps": 12,
                                 "compute": "fixed:1s", "eval_every": 6})
    _, rows = sweep(base, ["ddp"], ["wan-100mbps"], [0], str(tmp_path),
                    faults=["none", "1@3s:4s"], plots=False)
    by_faults = {r["faults"]: r for r in rows}
    assert set(by_faults) == {"none", "1@3s:4s"}
    assert (by_faults["none"]["failures"], by_faults["1@3s:4s"]["failures"]) == (0, 1)
    assert by_faults["1@3s:4s"]["lost_steps"] > 0
    assert "wan-100mbps (faults 1@3s:4s)" in table(rows)


def test_a_sync_of_several_exchanges_goes_on_while_the_leader_is_down(tmp_path):
    """DDP on a model with buffers makes two collectives per sync (gradients, then the
    buffers from the lowest live rank): a down rank takes part in both for real, outside
    the simulated network, and must not hold it back."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import TensorDataset

    import exoframe

    class WithBatchNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8),
                                           torch.nn.Tanh(), torch.nn.Linear(8, 1))

        def forward(self, batch):
            x, y = batch
            return F.mse_loss(self.net(x).squeeze(1), y)

    def shard(rank, nodes, split):
        g = torch.Generator().manual_seed(7 + rank + (100 if split == "val" else 0))
        x = torch.randn(64, 6, generator=g)
        return TensorDataset(x, x[:, 0])

    torch.manual_seed(0)
    result = exoframe.Trainer(WithBatchNorm(), shard, batch_size=16).fit(
        "ddp", num_nodes=3, steps=12, optimizer="sgd", lr=0.1, eval_every=6,
        compute="fixed:1s", net="wan-100mbps", faults="0@2s:3s", out=str(tmp_path),
        hang_timeout=60)
    (failure,) = result.summary["failures"]
    assert (failure["rank"], failure["recovered_from"]) == (0, 1)
    assert failure["rejoined_at"] >= failure["back_at"] == 5.0
    # Linear(6, 8), BatchNorm1d(8) (weight, bias, running mean and variance) and
    # Linear(8, 1) in fp32, BatchNorm's int64 counter; SGD keeps no state
    assert failure["recovery_bytes"] == (6 * 8 + 8 + 4 * 8 + 8 + 1) * 4 + 8
