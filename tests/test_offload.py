"""--offload (engine/node/offload.py): a packed node's state leaves its device between its
turns and comes back with the same bytes, so a run's records do not change. Offloading is a
GPU option (refused on the CPU: tests/test_placement.py); its mechanism is the same on any
device, and is checked here on the CPU, with the refusal lifted."""
import dataclasses

import pytest
import torch

from exoframe import testing
from exoframe.engine.node import offload
from exoframe.engine.plan import placement

STRATEGIES = [("ddp", {}), ("diloco", {"H": 2}),
              # an exchange in flight across steps: its tensors stay while it is held
              ("streaming-diloco", {"H": 4, "fragments": 2}), ("sparta", {}),
              ("sparseloco", {"H": 2})]


def test_a_parked_storage_comes_back_whole_with_its_views():
    flat = torch.arange(10.0)
    view, weight = flat[2:6], torch.randn(3, 3, requires_grad=True)
    kept = flat.clone(), weight.detach().clone()
    state = offload.OffloadedState(torch.device("cpu"))
    state.park([view, weight, None], held=set())
    assert flat.untyped_storage().nbytes() == 0 and weight.untyped_storage().nbytes() == 0
    assert state.parked_bytes == 10 * 4 + 9 * 4
    state.unpark()
    assert torch.equal(flat, kept[0]) and torch.equal(weight, kept[1])
    view.add_(1)  # still a view of the same storage
    assert torch.equal(flat[2:6], kept[0][2:6] + 1)
    # A storage an exchange holds stays; host buffers are reused turn after turn.
    state.park([weight, view], held=offload.storage_ids([view]))
    assert flat.untyped_storage().nbytes() == 40 and state.parked_bytes == 36
    buffers = {id(host) for _, host, _ in state.parked.values()}
    state.unpark()
    state.park([weight], held=set())
    assert {id(host) for _, host, _ in state.parked.values()} <= buffers
    state.unpark()


@pytest.mark.parametrize("strategy,params", STRATEGIES)
def test_offloaded_nodes_give_the_same_records(strategy, params, monkeypatch):
    """One worker of 4 nodes in this process, and 2 forked workers of 2: the same losses,
    simulated clocks and weights, bit for bit, as without offloading; and the nodes' state
    did leave between turns."""
    parked = []
    park = offload.OffloadedState.park

    def counting_park(self, tensors, held):
        park(self, tensors, held)
        parked.append(self.parked_bytes)
    monkeypatch.setattr(offload.OffloadedState, "park", counting_park)
    monkeypatch.setattr(placement, "check_offload", lambda *_: None)  # (a GPU option)

    def run(**fit):
        return testing.run(strategy, params, nodes=4, steps=6, net="wan-100mbps",
                           compute="fixed:10ms", eval_every=3, **fit)
    for fit in ({}, {"nodes_per_process": 2}):
        plain, offloaded = run(**fit), run(offload=True, **fit)
        assert offloaded.metrics == plain.metrics
        assert testing.max_difference(offloaded, plain) == 0
        # (the simulated clock, under fixed compute: the same events, no wall-clock read)
        assert offloaded.summary["simulated_seconds"] == plain.summary["simulated_seconds"]
    assert parked and max(parked) > 0  # (counted in this process's worker)


def test_a_workers_warm_up_step_changes_nothing_a_node_sees():
    """Under measured compute on a GPU a worker first steps a copy of the model once
    (loop.warm_up): the model, the node's next batch and the random generators are as
    they were (run here on the CPU: the same code)."""
    from exoframe.config import RunConfig
    from exoframe.engine import job_from_config
    from exoframe.engine.node.data import Batches
    from exoframe.engine.node.loop import warm_up

    class Drawing(torch.nn.Module):  # draws from torch's generator, as dropout does
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, batch):
            return self.inner(batch) * (1 + 0 * torch.rand(()))

    job = job_from_config(RunConfig(workload="mlp", nodes=2).validate())
    job = dataclasses.replace(job, model=Drawing(job.model))
    batches, twin = (Batches(job.dataset(0, 2, "train"), job.batch_size, job.seed, 0)
                     for _ in range(2))
    weights = [p.detach().clone() for p in job.model.parameters()]
    torch.manual_seed(7)
    warm_up(job, batches, torch.device("cpu"))
    draw = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(draw, torch.rand(3))
    assert all(torch.equal(p, w) for p, w in zip(job.model.parameters(), weights))
    assert all(p.grad is None for p in job.model.parameters())
    for _ in range(3):  # the same batches, from the first
        for a, b in zip(next(batches), next(twin)):
            assert torch.equal(a, b)
    assert batches.samples == twin.samples
