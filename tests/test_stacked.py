"""--stack-replicas (engine/node/stacked.py): a worker's nodes train as one stacked model, and
give the records of the unstacked run to float tolerance, on the same simulated clock; the
simulator resumes a node that waits for its worker's others when the simulation waits for
it (Paused, Resume), so that no run hangs and the grouping is the simulation's alone."""
import random
import re
import time

import pytest
import torch
from test_sim import B, send_recv

from exoframe import testing
from exoframe.config import RunConfig
from exoframe.engine import job_from_config
from exoframe.engine.ipc.processes import RankFailed
from exoframe.engine.node import stacked
from exoframe.errors import ExoframeError, RunStopped
from exoframe.sim import Simulator, Topology
from exoframe.sim.clocks.protocol import Paused, Resume, Waited
from exoframe.sim.network.collectives import BUILTIN

# Two sites and a rank 4 times slower: the nodes of a worker reach each step's compute at
# different simulated times, and some wait there while the others wait for the network.
HELD = dict(net="geo-2dc", stragglers="1:4", compute="fixed:10ms", hang_timeout=60)


def close_records(stacked_run, plain):
    for a, b in zip(stacked_run.metrics, plain.metrics, strict=True):
        assert a["sim_time"] == b["sim_time"]  # (fixed compute: the same simulation)
        assert a["bytes_sent_per_node"] == b["bytes_sent_per_node"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
        assert ("val_loss" in a) == ("val_loss" in b)
        if "val_loss" in a:
            assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5, abs=1e-6)
    assert testing.max_difference(stacked_run, plain) < 1e-5


@pytest.mark.parametrize("strategy,params", [("ddp", {}), ("diloco", {"H": 2}),
                                             ("localsgd", {"H": 3}), ("hier-diloco", {"H": 2})])
def test_stacked_nodes_give_the_unstacked_records(strategy, params):
    """Two forked workers of 4 and 2 nodes: the unstacked run's losses, validation losses,
    bytes, simulated clock and final model; and the same bits in a second stacked run."""
    def run(**fit):
        return testing.run(strategy, params, nodes=6, steps=6, eval_every=3,
                           nodes_per_process=4, **HELD, **fit)
    plain, stacked_run = run(), run(stack_replicas=True)
    close_records(stacked_run, plain)
    assert stacked_run.metrics != plain.metrics  # (batched kernels: not the same bits)
    assert run(stack_replicas=True).metrics == stacked_run.metrics


class Preceded(testing.TinyRegression):
    """The MLP after a layer of its own on the inputs (BatchNorm: buffers each pass updates
    in place; dropout: random draws)."""

    def __init__(self, first: torch.nn.Module):
        super().__init__()
        self.first = first

    def forward(self, batch):
        x, y = batch
        return super().forward((self.first(x), y))


def test_nodes_the_simulation_waits_for_compute_without_the_others(monkeypatch):
    """One worker of 4 nodes in this process, 2 micro-batches a step. Where a node waits for
    its worker's others while one of them waits for the simulated network, which waits for
    it, the simulator resumes it and the nodes there compute together; each node computes
    each step once, its BatchNorm counts every micro-batch, and the records are the
    unstacked run's."""
    groups, stacks = [], []
    compute, init = stacked.StackedReplicas.compute, stacked.StackedReplicas.__init__

    def recording(self, ranks, *args):
        groups.append((args[-1], tuple(ranks)))
        return compute(self, ranks, *args)

    def kept(self, *args, **kwargs):
        init(self, *args, **kwargs)
        stacks.append(self)
    monkeypatch.setattr(stacked.StackedReplicas, "compute", recording)
    monkeypatch.setattr(stacked.StackedReplicas, "__init__", kept)

    def run(**fit):
        torch.manual_seed(0)
        return testing.run("localsgd", {"H": 3}, nodes=4, steps=6,
                           model=Preceded(torch.nn.BatchNorm1d(6)), accumulate=2, **HELD,
                           **fit)
    stacked_run = run(stack_replicas=True, nodes_per_process=4, in_process=True)
    for step in range(1, 7):
        ranks = [r for s, group in groups if s == step for r in group]
        assert sorted(ranks) == [0, 1, 2, 3]
    assert any(len(group) < 4 for _, group in groups)  # (the simulator resumed a node)
    assert any(len(group) == 4 for _, group in groups)
    assert stacks[0].buffers["first.num_batches_tracked"].tolist() == [12] * 4
    close_records(stacked_run, run())


def read_late(monkeypatch, seed: int):
    """Make the workers' hubs sleep at random (0-4 ms) before half of their reads, as a busy
    machine would make them."""
    from exoframe.engine.node import packing
    receive, draws = packing.Hub._receive, random.Random(seed)

    def late_receive(hub, block):
        if not block and draws.random() < 0.5:
            time.sleep(draws.random() * 0.004)
        return receive(hub, block)
    monkeypatch.setattr(packing.Hub, "_receive", late_receive)


def test_which_nodes_compute_together_does_not_depend_on_when_a_worker_reads(monkeypatch):
    """Two forked workers whose hubs read late at random: the same groups, so the same
    losses (with dropout, whose draws depend on the group), as without the sleeps."""
    def run(sleeps: int):
        if sleeps:
            monkeypatch.undo()
            read_late(monkeypatch, sleeps)
        torch.manual_seed(0)
        return testing.run("diloco", {"H": 2}, nodes=6, steps=12,
                           model=Preceded(torch.nn.Dropout(0.3)), nodes_per_process=4,
                           stack_replicas=True, **HELD).metrics
    unhurried = run(0)
    for sleeps in (1, 2, 3):
        assert run(sleeps) == unhurried


def test_stacked_runs_stop_at_a_target_loss_or_a_time_budget(monkeypatch):
    """Nodes waiting for their worker's others while peers wait for a stopping verdict that
    the simulation holds back: the launcher resumes them (an unstacked run would not have
    waited there), then lets the verdicts go. A target loss is reached at the step and
    simulated time of the stacked run validated every step, the same with hubs that read
    late; a time budget stops after the unstacked run's step, on its clock."""
    def run(**fit):
        return testing.run("diloco", {"H": 2}, nodes=6, steps=20, nodes_per_process=4,
                           lr=0.01, **{**HELD, **fit})  # (validation losses that fall)
    reference = run(stack_replicas=True, eval_every=1).metrics
    target = reference[7]["val_loss"]
    reached = next(row for row in reference if row["val_loss"] <= target)
    assert 2 < reached["step"] < 18
    on_time = run(stack_replicas=True, target_loss=target)

    read_late(monkeypatch, 0)
    for result in (on_time, run(stack_replicas=True, target_loss=target)):
        assert result.summary["steps_to_target"] == reached["step"]
        assert result.summary["time_to_target"] == reached["sim_time"]
        assert result.metrics == on_time.metrics
    # Step 6 is the first to end at the budget; where the simulation holds the verdicts
    # back, ranks are let run past it, and the nodes paused there go on first.
    budget = reference[5]["sim_time"] - 1e-9
    stacked_run, plain = (run(stack_replicas=stack, time_budget=budget, net="wan-100mbps")
                          for stack in (True, False))
    assert stacked_run.summary["stopped_by"] == plain.summary["stopped_by"] == "time_budget"
    assert len(stacked_run.metrics) == len(plain.metrics) > 6
    close_records(stacked_run, plain)


def test_the_watchdog_names_nodes_waiting_for_their_workers_others(monkeypatch):
    """A launcher that takes a paused node for a running one (as it did before it let
    verdicts go past them) stalls the run above; the watchdog's line names the paused
    nodes and the step they wait at, instead of "made no progress"."""
    from exoframe.engine.launch.monitor import Monitor
    break_stall = Monitor.break_stall

    def blind_to_pauses(monitor):
        paused, monitor.sim.paused = monitor.sim.paused, {}
        try:
            break_stall(monitor)
        finally:
            monitor.sim.paused = paused
    monkeypatch.setattr(Monitor, "break_stall", blind_to_pauses)
    with pytest.raises(RunStopped) as failed:
        testing.run("diloco", {"H": 2}, nodes=6, steps=20, nodes_per_process=4,
                    stack_replicas=True, time_budget=3.0, **{**HELD, "hang_timeout": 2})
    line = str(failed.value)
    assert isinstance(failed.value.__cause__, RankFailed)
    assert "no process made progress" in line, line
    assert re.search(r"rank \d waits for its worker's other nodes, to compute step \d+ with "
                     r"them \(--stack-replicas\)", line), line


def test_the_simulator_resumes_the_lowest_paused_rank_when_it_waits_for_it():
    """Ranks 0 and 1 exchange S bytes (done at 0.01 + S/B); ranks 2 and 3 wait outside the
    simulator. It answers only once no rank runs, and then resumes one rank: the lowest."""
    sim = Simulator(Topology.uniform(4, B, 0.01), BUILTIN)
    for rank, message in send_recv(0, 1, 4e6):
        sim.receive(rank, message)
    sim.receive(2, Paused(0.002, 7))
    assert sim.advance() == []  # rank 3 runs: it may still send something before 0.042
    sim.receive(3, Paused(0.001, 5))
    assert sim.advance() == [(3, Resume(5))]  # the lowest bound, and it alone
    assert sim.advance() == []  # rank 3 runs now
    sim.receive(3, Paused(0.02, 6))
    assert sim.advance() == [(2, Resume(7))]
    sim.note_clock(2, 0.1)  # rank 2 went on (a step's end)
    assert sim.advance() == []  # it runs
    sim.receive(2, Paused(0.1, 8))
    assert sim.advance() == [(3, Resume(6))]  # the exchange waits for rank 3, at 0.02
    sim.note_clock(3, 0.1)
    replies = dict(sim.advance())
    assert set(replies) == {0, 1} and all(isinstance(r, Waited) for r in replies.values())
    assert replies[0].end == pytest.approx(0.01 + 4e6 / B)


def test_a_resumed_stacked_run_equals_the_run_never_stopped(tmp_path):
    """Checkpointed at step 2 and resumed to 6: the uninterrupted stacked run's bits (the
    simulator's recorded inputs hold the pauses; a Resume it answers again is for a step the
    nodes have passed)."""
    from exoframe import Trainer
    from exoframe.testing import tiny_data, tiny_model

    run = dict(strategy="ddp", num_nodes=4, nodes_per_process=2, stack_replicas=True,
               checkpoint_every=2, **HELD)
    whole = Trainer(tiny_model(), tiny_data(), batch_size=4).fit(steps=6, out=str(tmp_path),
                                                                 **run)
    first = Trainer(tiny_model(), tiny_data(), batch_size=4).fit(steps=2, out=str(tmp_path),
                                                                 **run)
    again = Trainer(tiny_model(), tiny_data(), batch_size=4).fit(
        steps=6, resume=str(first.run_dir), **run)
    assert again.metrics == whole.metrics


class ItemInForward(testing.TinyRegression):
    def forward(self, batch):
        if batch[0].sum().item() > 1e9:  # (vmap cannot take a tensor's value)
            return batch[0].sum()
        return super().forward(batch)


def test_a_model_vmap_cannot_take_stops_the_run_in_one_line():
    torch.manual_seed(0)
    with pytest.raises(RunStopped, match=r"stack_replicas: the model cannot run stacked under "
                                         r"torch.func.vmap \(RuntimeError: vmap: .*\.item\(\).*"
                                         r"drop --stack-replicas\."):
        testing.run("ddp", nodes=4, steps=2, model=ItemInForward(), nodes_per_process=2,
                    stack_replicas=True, compute="fixed:10ms")


@pytest.mark.parametrize("fields,message", [
    ({"strategy": "sparta"}, "stack_replicas: strategy 'sparta' does not declare that its "
                             "nodes may share one stacked model"),
    ({"faults": "1@1s:1s"}, "stack_replicas: stacked nodes compute every step together"),
    ({"precision": "fp16"}, "stack_replicas: fp16's loss scale is each node's own"),
    ({"nodes_per_process": 1}, "stack_replicas: only nodes packed in a worker train as one "
                               "stacked model"),
])
def test_what_cannot_stack_is_one_clear_line(fields, message):
    config = RunConfig(workload="mlp", stack_replicas=True,
                       **{"nodes": 4, "nodes_per_process": 2, **fields})
    with pytest.raises(ExoframeError, match=message):
        job_from_config(config.validate())


def test_stacked_with_offload_is_refused(monkeypatch):
    from exoframe.engine.plan import placement
    monkeypatch.setattr(placement, "check_offload", lambda *_: None)  # (a GPU option)
    config = RunConfig(workload="mlp", nodes=4, nodes_per_process=2, stack_replicas=True,
                       offload=True)
    with pytest.raises(ExoframeError, match="stack_replicas: stacked nodes keep their state in "
                                            "the stacked model"):
        job_from_config(config.validate())


def test_a_checkpoint_of_a_stacked_node_holds_its_own_weights_only():
    """torch.save writes a view's whole storage: a node's checkpoint copies its slice."""
    from exoframe.engine.records.rank_state import own_storage

    weights = torch.zeros(4, 3)
    node = weights[1]
    assert own_storage(node).untyped_storage().nbytes() == 3 * 4
    assert torch.equal(own_storage(node), node)
    whole = torch.zeros(3)
    assert own_storage(whole) is whole


def test_a_stacked_nodes_parameters_are_views_of_the_stack():
    """Written in place by its strategy, a node's parameter is its row of the stack."""
    model = testing.tiny_model()
    replicas = stacked.StackedReplicas(model, [4, 5, 6], torch.device("cpu"), 0,
                                       block=None, shared=None)
    node = replicas.model_of(5)
    first = next(node.parameters())
    with torch.no_grad():
        first.add_(1.0)
    stack = replicas.weights["net.0.weight"]
    assert torch.equal(stack[1], first) and torch.equal(stack[0] + 1, first)
    assert torch.equal(stack[0], next(model.parameters()))
