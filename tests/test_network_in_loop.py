"""Real ranks training under the simulated network: clocks against closed forms, numerics
unchanged by the network, staleness seen by asynchronous handles, failures reported."""
import math
import textwrap
import dataclasses
from dataclasses import dataclass

import pytest
import torch
from conftest import SMALL_GPT

import exoframe
from exoframe.cli import main
from exoframe.config import RunConfig
from exoframe.engine import execute, job_from_config
from exoframe.engine.launch.launcher import RankFailed
from exoframe.errors import RunStopped



def run(**fields):
    config = RunConfig(workload_params=dict(SMALL_GPT), eval_every=1000, **fields).validate()
    job = job_from_config(config)
    result = execute(job)
    return job, result


def model_bytes(job):
    return 4 * sum(p.numel() for p in job.model.parameters())


@pytest.mark.parametrize("strategy,params", [("ddp", {}), ("diloco", {"H": 3})])
def test_the_network_changes_the_clock_not_synchronous_numerics(strategy, params):
    runs = {net: run(strategy=strategy, strategy_params=params, nodes=3, steps=7, net=net,
                     compute="fixed:10ms")[1] for net in ("ideal", "wan-10mbps")}
    ideal, wan = runs["ideal"], runs["wan-10mbps"]
    assert [r["loss"] for r in ideal.metrics] == [r["loss"] for r in wan.metrics]
    for a, b in zip(ideal.model.parameters(), wan.model.parameters()):
        assert torch.equal(a, b)
    assert math.isclose(ideal.summary["simulated_seconds"], 7 * 0.01, rel_tol=1e-9)
    assert wan.summary["simulated_seconds"] > ideal.summary["simulated_seconds"] + 0.1
    assert ideal.summary["compute_utilization"] == pytest.approx(1.0)


def test_ddp_clock_matches_the_ring_closed_form_and_stragglers_make_others_idle(tmp_path):
    net = tmp_path / "flat.yaml"
    net.write_text("bandwidth: 10mbit\nlatency: 5ms\nprotocol: none\n")
    n, steps, c, alpha, bandwidth = 3, 4, 0.01, 0.005, 10e6 / 8
    job, result = run(strategy="ddp", nodes=n, steps=steps, net=str(net), compute="fixed:10ms",
                      stragglers="2:3")
    size = model_bytes(job)
    ring = 2 * (n - 1) * (alpha + size / (n * bandwidth))
    # rank 2 computes 3c per step; the others wait for it (idle), then all run the ring
    assert math.isclose(result.summary["simulated_seconds"], steps * (3 * c + ring), rel_tol=1e-9)
    for r in result.summary["per_rank"]:
        slow = r["rank"] == 2
        assert math.isclose(r["compute_seconds"], steps * c * (3 if slow else 1), rel_tol=1e-9)
        assert math.isclose(r["idle_seconds"], 0 if slow else steps * 2 * c, abs_tol=1e-12)
        assert math.isclose(r["comm_seconds"], steps * ring, rel_tol=1e-9)
        assert r["bytes_sent"] == steps * round(2 * (n - 1) * size / n)
    times = [row["sim_time"] for row in result.metrics]
    assert all(math.isclose(t, (i + 1) * (3 * c + ring), rel_tol=1e-9) for i, t in enumerate(times))


class Poller(exoframe.Strategy):
    """Starts one asynchronous all-reduce of a big buffer at step 1 and asks each step
    whether it has completed by the rank's simulated now. Trains locally otherwise."""

    @dataclass
    class Params:
        numel: int = 250_000

    def setup(self):
        self.buffer = torch.ones(self.params.numel)
        self.handle = None
        self.completed_at = None

    def step(self):
        if self.step_num == 1:
            self.handle = self.comm.all_reduce(self.buffer, async_op=True)
        elif self.completed_at is None and self.handle.is_completed():
            self.completed_at = self.step_num
            assert torch.all(self.buffer == self.world_size)
        self.optimizer.step()
        self.optimizer.zero_grad()

    def metrics(self):
        return {"completed_at": self.completed_at}


def test_an_async_handle_completes_when_the_network_says_not_when_the_bytes_land(tmp_path):
    net = tmp_path / "slow.yaml"
    net.write_text("bandwidth: 10mbit\nlatency: 20ms\nprotocol: none\n")
    n, c = 2, 0.05
    config = RunConfig(workload_params=dict(SMALL_GPT), nodes=n, steps=30, net=str(net),
                       compute="fixed:50ms", eval_every=1000).validate()
    job = dataclasses.replace(job_from_config(config), strategy_cls=Poller,
                              strategy_params=Poller.Params())
    result = execute(job)
    # Started at c (after step 1's compute), done T later; the check at step s happens at
    # s * c (each step's compute is charged when it starts), so s = ceil(1 + T / c) = 18.
    ring = 2 * (n - 1) * (0.02 + 4 * 250_000 / (n * 10e6 / 8))
    expected = math.ceil(1 + ring / c)
    assert expected == 18
    assert [row.get("completed_at") for row in result.metrics] == \
        [None] * (expected - 1) + [expected] * (30 - expected + 1)


def test_diloco_keeps_the_compute_busier_than_ddp_on_a_wan():
    utilization = {}
    for strategy, params in (("ddp", {}), ("diloco", {"H": 10})):
        _, result = run(strategy=strategy, strategy_params=params, nodes=4, steps=20,
                        net="wan-100mbps", compute="fixed:50ms")
        utilization[strategy] = result.summary["compute_utilization"]
    assert utilization["diloco"] > 2 * utilization["ddp"], utilization


def test_compute_beside_exchanges_in_flight_is_counted_and_said():
    """Streaming DiLoCo (H=4, 2 fragments, tau=1) syncs fragments at steps 2, 4, 6 and 8;
    each but the last is in flight through one step's compute: 3 of 8 steps. The run's
    table says what such exchanges leave out; ddp, which overlaps nothing, says nothing."""
    from exoframe.report import summary_table
    from exoframe.report.summary import OVERLAP_NOTE

    _, streaming = run(strategy="streaming-diloco", strategy_params={"H": 4, "fragments": 2},
                       nodes=2, steps=8, net="wan-100mbps", compute="fixed:10ms")
    assert streaming.summary["overlapped_compute_share"] == pytest.approx(3 / 8, rel=1e-12)
    table = summary_table(streaming.summary)
    assert OVERLAP_NOTE.format(share=3 / 8) in table
    assert "congestion loss is not modelled" in table  # what it cannot capture
    # On a network without limits the exchanges take no time: nothing to say.
    _, ideal = run(strategy="streaming-diloco", strategy_params={"H": 4, "fragments": 2},
                   nodes=2, steps=8, net="ideal", compute="fixed:10ms")
    assert ideal.summary["overlapped_compute_share"] == pytest.approx(3 / 8, rel=1e-12)
    assert "overlapped exchanges" not in summary_table(ideal.summary)
    _, ddp = run(strategy="ddp", nodes=2, steps=2, net="wan-100mbps", compute="fixed:10ms")
    assert ddp.summary["overlapped_compute_share"] == 0
    assert "overlapped exchanges" not in summary_table(ddp.summary)


class Orphan(exoframe.Strategy):
    """Rank 0 waits for a message that rank 1 never sends."""

    @dataclass
    class Params:
        pass

    def step(self):
        if self.rank == 0:
            self.comm.recv(torch.empty(4), src=1)
        self.optimizer.step()


def test_a_simulated_deadlock_stops_the_run_with_who_waits_for_what():
    config = RunConfig(workload_params=dict(SMALL_GPT), nodes=2, steps=3,
                       compute="fixed:1ms").validate()
    job = dataclasses.replace(job_from_config(config), strategy_cls=Orphan,
                              strategy_params=Orphan.Params())
    with pytest.raises(RunStopped, match="deadlock: rank 0 waits for the transfer 1 -> 0, "
                                         "which rank.s. 1 never started") as stopped:
        execute(job)
    assert isinstance(stopped.value.__cause__, RankFailed)


@pytest.mark.parametrize("args,message", [
    (["--net", "wan-100mbit"], "unknown network preset 'wan-100mbit'. Did you mean 'wan-100mbps'?"),
    (["--net", "{file}"], "{file}: bandwidth: "),
    (["--stragglers", "lognormall:0.3"], "stragglers: unknown distribution 'lognormall'. "
                                         "Did you mean 'lognormal'?"),
    (["--stragglers", "5:2"], "stragglers: rank 5 does not exist in a run of 2 nodes."),
    (["--compute", "flops:h1000"], "compute: unknown device 'h1000'. Did you mean 'h100'?"),
])
def test_bad_simulation_input_is_one_clear_line(tmp_path, capsys, args, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text("bandwidth: 0mbit\n")
    args = [a.format(file=bad) for a in args]
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--no-progress", "--out", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert message.format(file=bad) in err


@pytest.mark.parametrize("yaml_text,field", [
    ("bandwidth: 100mbs\n", "bandwidth: unknown unit 'mbs'"),
    ("bandwidth: -5mbit\n", "bandwidth"),
    ("sites:\n  a: {}\n  b: {}\nlinks:\n  - between: [a, c]\n    bandwidth: 1gbit\n",
     "links[0]"),
    ("latency: [1]\n", "latency"),
])
def test_bad_network_files_name_the_file_and_the_field(tmp_path, capsys, yaml_text, field):
    bad = tmp_path / "net.yaml"
    bad.write_text(textwrap.dedent(yaml_text))
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--no-progress", "--net", str(bad)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert str(bad) in err and field in err, err


def test_the_real_network_trains_the_same_weights_and_measures_its_time(tmp_path):
    """--net real: no simulator. The same numerics as a simulated run; per rank the measured
    time splits into compute and the rest; its trace is not replayed."""
    import json

    from exoframe import testing
    from exoframe.sim.traces.replay import ReplayError, check_trace

    real = testing.run("diloco", {"H": 2}, nodes=2, steps=6, net="real",
                       out=str(tmp_path / "runs"), in_process=False)
    simulated = testing.run("diloco", {"H": 2}, nodes=2, steps=6, net="wan-100mbps",
                            in_process=False)
    assert [r["loss"] for r in real.metrics] == [r["loss"] for r in simulated.metrics]
    assert testing.max_difference(real, simulated) == 0
    assert real.summary["net"] == "real"
    assert real.summary["bytes_sent_per_node"] == simulated.summary["bytes_sent_per_node"]
    # (How the measured times compare with the launch's: benchmarks/real_network.py.)
    for rank in real.summary["per_rank"]:
        assert rank["compute_seconds"] > 0  # the timer counted the training
        # the wall-clock splits into compute, transfers and waiting for peers
        assert rank["comm_seconds"] == rank["transfer_seconds"]
        assert rank["idle_seconds"] == rank["wait_seconds"]
        assert rank["compute_seconds"] + rank["transfer_seconds"] + rank["wait_seconds"] == \
            pytest.approx(rank["simulated_seconds"], rel=1e-9)
    [trace] = (tmp_path / "runs").glob("*/trace.json")
    with pytest.raises(ReplayError, match="real network"):
        check_trace(json.loads(trace.read_text()))
    assert real.summary["real_network"] and not simulated.summary["real_network"]
    from exoframe.errors import ExoframeError
    with pytest.raises(ExoframeError, match="depends on when exchanges complete"):
        testing.run("async-localsgd", {"H": 2}, nodes=2, steps=2, net="real")
