"""Remote calls through the simulated network (exoframe.distributed): real ranks, real calls,
checked against a single-process computation and the network's closed form."""
import json
import math

import pytest
import torch

import exoframe.distributed as todist
from exoframe import testing
from exoframe.errors import ExoframeError
from exoframe.strategies import Strategy, Traits

B = 100e6 / 8  # the network below: 100 Mbit/s NICs, 10 ms latency, no jitter
ALPHA = 0.01
STEP = 0.1  # fixed compute per step
# Each rank's forked copy of these is set before or by the run.
MODEL = None
OUT = None
SEEN = None


def batch():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(8, 6, generator=g)
    return x, torch.sin(x.sum(1))


def loss_and_gradient(x, y):
    """On the rank that serves it: the loss of its share of the batch, and the gradient,
    in one flat tensor. Rank r declares 10·(r+1) ms of compute."""
    todist.compute(0.01 * (todist.get_rank() + 1))
    MODEL.zero_grad()
    loss = MODEL((x, y))
    loss.backward()
    return torch.cat([loss.detach().reshape(1), *(p.grad.reshape(-1) for p in MODEL.parameters())])


class CallsFromRankZero(Strategy):
    """Rank 0 computes the loss and gradient of one batch through remote_sync_call
    (batch_partitioner + mean_reducer) on every rank; the others serve."""

    traits = Traits(remote_calls=True)

    def setup(self):
        global MODEL
        MODEL = self.model

    def step(self):
        if self.rank == 0 and self.step_num == 1:
            start = self.sim_time
            result = todist.remote_sync_call(loss_and_gradient, args=batch(),
                                             partitioner=todist.batch_partitioner,
                                             reducer=todist.mean_reducer)
            torch.save({"result": result, "start": start, "end": self.sim_time,
                        "traffic": self.comm.traffic.as_dict()}, OUT)
        todist.barrier()


def write_net(tmp_path):
    path = tmp_path / "uniform.yaml"
    path.write_text("bandwidth: 100mbit\nlatency: 10ms\nprotocol: none\n")
    return str(path)


def test_a_batch_partitioned_call_equals_one_process_and_the_closed_form(tmp_path):
    global OUT
    OUT = str(tmp_path / "call.pt")
    testing.run(CallsFromRankZero, nodes=4, steps=1, net=write_net(tmp_path),
                compute=f"fixed:{STEP}s")
    got = torch.load(OUT)

    model = testing.tiny_model()  # the weights every rank starts from
    x, y = batch()
    loss = model((x, y))
    loss.backward()
    expected = torch.cat([loss.detach().reshape(1), *(p.grad.reshape(-1)
                                                       for p in model.parameters())])
    assert torch.allclose(got["result"], expected, rtol=0, atol=1e-6)
    assert (got["result"] - expected).abs().max() < 1e-6

    # Bytes: each request carries 2 of the 8 examples (2×6 + 2 floats), each result the loss
    # and the 129 gradients; the envelope (function name, call number) is small.
    traffic = got["traffic"]
    assert traffic["remote"]["bytes_sent"] == 3 * (2 * 6 + 2) * 4
    assert traffic["remote"]["bytes_received"] == 3 * (1 + 129) * 4
    envelope = traffic["remote_envelope"]
    assert 0 < envelope["bytes_sent"] < 3 * 400 and 0 < envelope["bytes_received"] < 3 * 400
    request = (traffic["remote"]["bytes_sent"] + envelope["bytes_sent"]) / 3
    result = (traffic["remote"]["bytes_received"] + envelope["bytes_received"]) / 3
    # Closed form: the three requests leave rank 0's uplink together (B/3 each), then the
    # slowest worker (rank 3, 40 ms) computes, then its result crosses alone (the others'
    # results, 10 and 20 ms earlier, are through by then).
    assert got["start"] == STEP
    closed = STEP + 3 * request / B + ALPHA + 0.04 + result / B + ALPHA
    assert math.isclose(got["end"], closed, rel_tol=1e-12)


def record_rank(tag):
    SEEN.append((tag, todist.get_rank()))


@todist.rank_zero_only
def zero_only():
    record_rank("zero")


@todist.on_rank(1, 2)
def one_and_two():
    record_rank("one-two")


@todist.not_on_rank(1, 2)
def not_one_and_two():
    record_rank("not-one-two")


class Decorated(Strategy):
    traits = Traits(remote_calls=True)

    def step(self):
        global SEEN
        SEEN = []
        zero_only(), one_and_two(), not_one_and_two()
        info = todist.get_world_info()
        assert (info.world_size, info.local_rank, info.local_world_size) == (4, 0, 1)
        # every rank tells rank 0 what ran here
        todist.remote_sync_call(note_seen, args=(list(SEEN),), partitioner=0)
        todist.barrier()
        if self.rank == 0:
            torch.save(sorted(ALL_SEEN), OUT)


ALL_SEEN = []


def note_seen(seen):
    ALL_SEEN.extend(seen)


def test_rank_decorators_run_where_they_say(tmp_path):
    global OUT
    OUT = str(tmp_path / "seen.pt")
    testing.run(Decorated, nodes=4, steps=1, compute="fixed:100ms")
    assert torch.load(OUT) == sorted([("zero", 0), ("one-two", 1), ("one-two", 2),
                                      ("not-one-two", 0), ("not-one-two", 3)])


class CallsRankSeven(Strategy):
    traits = Traits(remote_calls=True)

    def step(self):
        todist.remote_sync_call(note_seen, args=([],), partitioner=7)


def test_a_call_to_a_rank_that_does_not_exist_is_one_clear_error():
    with pytest.raises(ExoframeError) as error:
        testing.run(CallsRankSeven, nodes=4, steps=1, compute="fixed:100ms")
    assert "remote call of note_seen to rank 7, but the run has ranks 0 to 3" in str(error.value)


class Undeclared(Strategy):
    def step(self):
        todist.remote_sync_call(note_seen, args=([],), partitioner=1)


def test_calls_outside_a_run_and_a_missing_declaration_are_one_line():
    with pytest.raises(ExoframeError, match="remote calls run inside a run's ranks"):
        todist.remote_sync_call(note_seen, args=([],), partitioner=0)
    with pytest.raises(ExoframeError,
                       match=r"declare `traits = Traits\(remote_calls=True\)` on its class"):
        testing.run(Undeclared, nodes=2, steps=1, compute="fixed:100ms")


def shard_sizes(servers):
    """The tiny model's 129 parameters (6·16 + 16 + 16 + 1) over the servers, written out."""
    return {1: [129], 2: [65, 64]}[servers]


@pytest.mark.parametrize("servers", [1, 2])
def test_a_synchronous_parameter_server_equals_ddp_and_moves_the_closed_form(servers):
    steps, nodes = 5, 4
    ps = testing.run("param-server", {"servers": servers}, nodes=nodes, steps=steps,
                     compute="fixed:100ms", net="wan-100mbps")
    ddp = testing.run("ddp", nodes=nodes, steps=steps, compute="fixed:100ms", net="wan-100mbps")
    assert testing.max_difference(ps, ddp) < 1e-6
    assert all(row["staleness"] == 0 for row in ps.metrics)
    # Per step, each rank pushes every shard but its own and pulls it back; server s also
    # takes the N−1 other workers' pushes of shard s and answers their pulls (4 B a float).
    shard = [4 * n for n in shard_sizes(servers)]
    for r, rank in enumerate(ps.summary["per_rank"]):
        others = sum(size for s, size in enumerate(shard) if s != r)
        served = (nodes - 1) * shard[r] if r < servers else 0
        assert rank["traffic"]["remote"]["bytes_sent"] == steps * (others + served)
        assert rank["traffic"]["remote"]["bytes_received"] == steps * (others + served)
    # Simulated seconds (fixed compute, deterministic), not wall-clock: waiting for results
    # is mostly transfers, counted as comm, and the clock's split adds up.
    for rank in ps.summary["per_rank"]:
        assert rank["comm_seconds"] > rank["idle_seconds"] / 10
        assert math.isclose(rank["compute_seconds"] + rank["comm_seconds"]
                            + rank["idle_seconds"], rank["simulated_seconds"], rel_tol=1e-12)
    if servers == 1:  # a worker that is no server: S sent and S received per step
        assert ps.summary["per_rank"][3]["traffic"]["remote"]["bytes_sent"] == steps * 4 * 129


def test_bounded_staleness_lets_fast_workers_run_ahead_within_the_bound():
    common = dict(nodes=4, steps=12, compute="fixed:100ms", net="wan-100mbps",
                  stragglers="3:3")
    sync = testing.run("param-server", {"servers": 2}, **common)
    stale = testing.run("param-server", {"servers": 2, "staleness": 2}, **common)
    lags = [row["staleness"] for row in stale.metrics]
    assert max(lags) <= 2 and sum(lags) > 0  # mean over ranks of the updates missed
    assert lags[-1] == 0  # the final model has every update in
    # The three fast ranks no longer wait for the straggler at every step.
    fast = [r["simulated_seconds"] for r in stale.summary["per_rank"][:3]]
    assert max(fast) < min(r["simulated_seconds"] for r in sync.summary["per_rank"][:3])
    assert stale.summary["final_loss"] is not None


def fails(x):
    raise ValueError(f"no good: {x}")


class CallsAFunctionThatRaises(Strategy):
    traits = Traits(remote_calls=True)

    def step(self):
        if self.rank == 0:
            todist.remote_sync_call(fails, args=(3,), partitioner=1)
        todist.barrier()


def test_a_remote_exception_stops_the_run_with_the_serving_ranks_traceback():
    with pytest.raises(ExoframeError) as error:
        testing.run(CallsAFunctionThatRaises, nodes=2, steps=1, compute="fixed:100ms")
    text = str(error.value) + getattr(error.value, "details", "")
    assert "remote call of fails on rank 1 raised" in text
    assert "ValueError: no good: 3" in text


class CallsARankInACollective(Strategy):
    traits = Traits(remote_calls=True)

    def step(self):
        if self.rank == 0:
            todist.remote_sync_call(note_seen, args=([],), partitioner=1)
        self.average_parameters()  # rank 1 waits here, where it serves nothing


def test_a_call_that_no_rank_can_serve_is_reported_as_a_deadlock():
    with pytest.raises(ExoframeError, match="deadlock: rank 0 waits for the answer to a "
                                            "remote call that never comes"):
        testing.run(CallsARankInACollective, nodes=2, steps=1, compute="fixed:100ms")


def test_runs_with_remote_calls_are_not_checkpointed_or_replayed(tmp_path):
    with pytest.raises(ExoframeError, match="makes remote calls, which cannot be checkpointed"):
        testing.run("param-server", nodes=2, steps=2, checkpoint_every=1, out=str(tmp_path))
    from exoframe.sim.traces.replay import ReplayError, check_trace
    testing.run("param-server", nodes=2, steps=2, out=str(tmp_path / "runs"))
    [trace] = (tmp_path / "runs").glob("*/trace.json")
    with pytest.raises(ReplayError, match="made remote calls"):
        check_trace(json.loads(trace.read_text()))


def test_a_call_to_a_rank_that_is_down_names_it():
    from types import SimpleNamespace

    from exoframe.comm.remote import RemoteCalls

    calls = RemoteCalls(SimpleNamespace(rank=0, world_size=4, live=(0, 1, 3)))
    calls.declared = True
    with pytest.raises(ExoframeError, match=r"remote call of note_seen to rank 2, which is down "
                                            r"\(simulated failure\)"):
        calls.call([(2, ([],), {})], note_seen)


def test_partitioners_split_tensors_and_copy_the_rest():
    x, flag = torch.arange(14.0).reshape(7, 2), "keep"
    parts = todist.dim_partitioner(0, workers=[0, 1, 2])(x, flag=flag)
    assert [rank for rank, _, _ in parts] == [0, 1, 2]
    assert [a[0].tolist() for _, a, _ in parts] == [x[0:2].tolist(), x[2:4].tolist(),
                                                    x[4:7].tolist()]
    assert all(k == {"flag": "keep"} for _, _, k in parts)
    one_each = todist.dim_partitioner(-1, exclusive=True, keepdim=False, workers=[0, 1])(x)
    assert [(rank, a[0].tolist()) for rank, a, _ in one_each] == [(0, x[:, 0].tolist()),
                                                                  (1, x[:, 1].tolist())]
    assert todist.batch_partitioner(flag) == [(0, ("keep",), {})]  # no tensor: this rank
    with pytest.raises(ValueError, match="different sizes along dim 0"):
        todist.dim_partitioner(0, workers=[0, 1])(x, torch.zeros(3))
    assert todist.mean_reducer([torch.tensor(1.0), torch.tensor(3.0)]) == 2.0
    assert todist.sum_reducer([torch.tensor(1.0), torch.tensor(3.0)]) == 4.0
