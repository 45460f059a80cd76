"""Trace replay against full re-runs, projection against the closed form, the sweep's
outputs, and its bad inputs."""
import json
import math
import dataclasses
from dataclasses import dataclass

import pytest
import torch
import yaml
from conftest import SMALL_GPT, SMALL_GPT_FLAGS, one_line_error as bad

import exoframe
from exoframe.cli import main
from exoframe.config import RunConfig
from exoframe.engine import execute, job_from_config
from exoframe.experiments.run_replays import Projection, replay_trace
from exoframe.plugins import get_plugin_manager
from exoframe.sim import resolve_sim
from exoframe.sim.network.netconfig import load_network
from exoframe.strategies import Traits

NETS = ["wan-10mbps", "geo-2dc", "home-broadband"]


def run(**fields):
    config = RunConfig(**{"workload_params": dict(SMALL_GPT), "eval_every": 3,
                          "compute": "fixed:10ms", **fields}).validate()
    return execute(job_from_config(config))


def sim_for(net, nodes):
    return resolve_sim(net, "measured", "", nodes, get_plugin_manager())


@pytest.mark.parametrize("strategy,params", [("ddp", {}), ("diloco", {"H": 3}),
                                             ("sparta", {"p": 0.05})])
def test_replay_through_other_networks_equals_full_reruns(strategy, params):
    """Jittery networks, two sites, asymmetric links, random stragglers: the trace of the
    run on the first network, replayed through each network, gives every rank's clock and
    every step's time as the run on that network does."""
    runs = {net: run(strategy=strategy, strategy_params=params, nodes=4, steps=6, net=net,
                     stragglers="lognormal:0.3") for net in NETS}
    trace = runs[NETS[0]].trace
    for net in NETS:
        replayed = replay_trace(trace, sim_for(net, 4))
        rerun = runs[net]
        for ours, theirs in zip(replayed["per_rank"], rerun.summary["per_rank"]):
            for key in ("simulated_seconds", "compute_seconds", "comm_seconds", "idle_seconds"):
                assert math.isclose(ours[key], theirs[key], rel_tol=1e-9, abs_tol=1e-12), (net, key)
        for t, row in zip(replayed["sim_times"], rerun.metrics, strict=True):
            assert math.isclose(t, row["sim_time"], rel_tol=1e-9)
        assert replayed["bytes_sent_per_node"] == rerun.summary["bytes_sent_per_node"]
    times = [runs[net].summary["simulated_seconds"] for net in NETS]
    assert len(set(times)) == 3  # the networks do differ


def test_an_overlap_rate_slows_overlapped_exchanges_and_replays_keep_it():
    """The compute model's overlap=: streaming-diloco's fragments, in flight while the ranks
    compute, take longer than at the network's pace; the run's trace replays to the same
    clocks on the same network and to a full re-run's on another; a run without
    overlapped exchanges (ddp) is unchanged by it."""
    def streaming(net, compute):
        return run(strategy="streaming-diloco", strategy_params={"H": 2, "fragments": 2},
                   nodes=4, steps=6, net=net, compute=compute)

    def clock(result):  # each step's time on the simulated clock (no wall-clock here)
        return [row["sim_time"] for row in result.metrics]

    # (a step long enough for a fragment's exchange to be in flight while the ranks compute:
    # gloo's first segments wait for the receivers' notices, a round trip of 100 ms)
    slowed = "fixed:200ms,overlap=1mbit"
    free, busy = streaming("wan-10mbps", "fixed:200ms"), streaming("wan-10mbps", slowed)
    assert clock(busy)[-1] > clock(free)[-1]  # the fragments took longer to arrive
    assert busy.summary["overlap_rate"] == 125000.0 and free.summary["overlap_rate"] is None
    for net in ("wan-10mbps", "geo-2dc"):
        rerun = busy if net == "wan-10mbps" else streaming(net, slowed)
        replayed = replay_trace(busy.trace, sim_for(net, 4))
        assert replayed["sim_times"] == pytest.approx(clock(rerun), rel=1e-9), net
    ddp = [run(strategy="ddp", nodes=4, steps=3, net="wan-10mbps", compute=compute)
           for compute in ("fixed:200ms", slowed)]
    assert clock(ddp[0]) == clock(ddp[1])  # nothing of ddp's is in flight while it computes


def test_projection_of_an_every_step_all_reduce_matches_the_ring_closed_form(tmp_path):
    net = tmp_path / "ring.yaml"
    net.write_text("bandwidth: 1gbit\nlatency: 5ms\nprotocol: none\n")
    n, params, step = 4, 1e9, 0.1
    result = run(strategy="localsgd", strategy_params={"H": 1}, nodes=n, steps=5)
    projected = replay_trace(result.trace, sim_for(str(net), n), Projection(params, step))
    ring = 2 * (n - 1) * (0.005 + 4 * params / (n * 1e9 / 8))
    times = [0.0, *projected["sim_times"]]
    for before, after in zip(times, times[1:]):
        assert math.isclose(after - before, step + ring, rel_tol=1e-6)
    # DDP's buckets, one after another through the backward pass: tests/test_projection.py.


class Impatient(exoframe.Strategy):
    """Timing-dependent: averages only if last step's all-reduce is done by now."""

    traits = Traits(timing_dependent=True)

    @dataclass
    class Params:
        pass

    def setup(self):
        self.handle = None

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.handle is None or self.handle.is_completed():
            self.handle = self.comm.all_reduce(torch.ones(10), async_op=True)


def test_sweep_writes_table_csv_json_and_plots_and_report_rebuilds_them(tmp_path, capsys):
    main(["sweep", "--strategy", "ddp,diloco", "--net", "wan-100mbps,wan-1gbps", "--nodes", "2",
          "--steps", "6", "--compute", "fixed:10ms", "-p", "diloco.H=3", *SMALL_GPT_FLAGS,
          "--target-loss", "3.3", "--out", str(tmp_path / "sweeps"), "--no-progress"])
    printed = capsys.readouterr().out
    (folder,) = (tmp_path / "sweeps").glob("*-sweep")
    rows = json.loads((folder / "sweep.json").read_text())
    assert sorted((r["strategy"], r["net"], r["source"]) for r in rows) == [
        ("ddp", "wan-100mbps", "run"), ("ddp", "wan-1gbps", "replay"),
        ("diloco", "wan-100mbps", "run"), ("diloco", "wan-1gbps", "replay")]
    by = {(r["strategy"], r["net"]): r for r in rows}
    assert by["ddp", "wan-1gbps"]["simulated_seconds"] < by["ddp", "wan-100mbps"]["simulated_seconds"]
    assert all(r["time_to_target"] is None or r["time_to_target"] <= r["simulated_seconds"]
               for r in rows)
    csv_lines = (folder / "sweep.csv").read_text().splitlines()
    assert csv_lines[0].startswith("strategy,seed,net,") and len(csv_lines) == 5
    pngs = sorted(p.name for p in folder.glob("*.png"))
    assert pngs == ["compare_wan-100mbps.png", "compare_wan-1gbps.png", "loss_vs_bytes.png",
                    "loss_vs_time_ddp.png", "loss_vs_time_diloco.png",
                    "speedup_vs_bandwidth.png", "time_to_target_vs_bandwidth.png", "time_vs_bandwidth.png",
                    "utilization_vs_bandwidth.png", "val_loss_wan-100mbps.png",
                    "val_loss_wan-1gbps.png"]
    assert len((folder / "sweep_summary.csv").read_text().splitlines()) == 5  # one seed each
    assert all((folder / p).stat().st_size > 10_000 for p in pngs)

    main(["report", str(folder), "--target-loss", "3.3"])
    tables = printed.strip().rsplit("\n", 1)[0].strip()  # (less the sweep folder's line)
    assert "50% util." in tables  # the bandwidth for each compute utilization, after the table
    assert capsys.readouterr().out.strip() == tables


def test_bad_sweep_and_replay_input_is_one_clear_line(tmp_path, capsys):
    out = ["--out", tmp_path / "s", "--no-progress"]
    assert "--points: a grid needs at least 2 points" in bad(
        capsys, "sweep", "--bandwidth", "10mbit..1gbit", "--points", "1", *out)
    assert "the low end (10mbit) must be below the high end (1mbit)" in bad(
        capsys, "sweep", "--bandwidth", "10mbit..1mbit", *out)
    assert "--strategy: give at least one name" in bad(capsys, "sweep", "--strategy", ",", *out)
    assert "no trace.json" in bad(capsys, "replay", tmp_path, "--net", "wan-1gbps")

    config = RunConfig(workload_params=dict(SMALL_GPT), nodes=2, steps=3,
                       compute="fixed:10ms").validate()
    job = dataclasses.replace(job_from_config(config), strategy_cls=Impatient,
                              strategy_params=Impatient.Params(), strategy_name="impatient")
    result = execute(job, out=str(tmp_path / "runs"))
    assert "is timing-dependent" in bad(capsys, "replay", result.run_dir, "--net", "wan-1gbps")


def test_a_sweep_checks_every_point_before_anything_trains(tmp_path, capsys):
    """A mistake in the last point is refused before the first trains: exit 2, one line,
    no sweep folder."""
    out = tmp_path / "s"
    flags = ["--out", out, "--no-progress", "--no-plots", "--steps", "2", *SMALL_GPT_FLAGS]
    assert "strategy 'diloco': unknown parameter 'h'" in bad(
        capsys, "sweep", "--strategy", "ddp,diloco", "-p", "diloco.h=5", *flags)
    assert "unknown network preset 'nowhere'" in bad(
        capsys, "sweep", "--strategy", "ddp", "--net", "wan-1gbps,nowhere", *flags)
    assert "node 7 does not exist" in bad(capsys, "sweep", "--strategy", "ddp", "--faults",
                                          "none", "--faults", "7@1s:1s", *flags)
    assert "compute" in bad(capsys, "sweep", "--strategy", "ddp", "--compute", "flops:abacus",
                            *flags)
    config = tmp_path / "sinks.yaml"
    config.write_text("sinks: [jsonl, nosuchsink]\n")
    assert "nosuchsink" in bad(capsys, "sweep", "--config", config, "--strategy", "ddp", *flags)
    config.write_text("checkpoint_every: 1\n")
    assert "strategy 'async-localsgd' cannot be checkpointed" in bad(
        capsys, "sweep", "--config", config, "--strategy", "ddp,async-localsgd", *flags)
    assert not out.exists()


def test_a_timing_dependent_strategy_is_trained_again_on_each_network(tmp_path, capsys):
    main(["sweep", "--strategy", "async-localsgd", "--net", "ideal,wan-10mbps", "--nodes", "2",
          "--steps", "4", "-p", "H=2", "--compute", "fixed:10ms", *SMALL_GPT_FLAGS,
          "--out", str(tmp_path), "--no-progress", "--no-plots"])
    (folder,) = tmp_path.glob("*-sweep")
    rows = json.loads((folder / "sweep.json").read_text())
    assert sorted((r["net"], r["source"]) for r in rows) == [("ideal", "run"), ("wan-10mbps", "run")]
    assert len(list((folder / "runs").iterdir())) == 2


def test_a_bandwidth_grid_is_log_spaced_and_sets_the_bottleneck_link(tmp_path):
    from exoframe.experiments.sweep import grid_networks, parse_grid

    grid = parse_grid("10mbit..10gbit", 4)
    assert [round(b * 8 / 1e6, 6) for b in grid] == [10, 100, 1000, 10000]
    pm = get_plugin_manager()
    for base, changed in (("wan-100mbps", "nic"), ("geo-2dc", "site link")):
        paths = grid_networks(base, grid, tmp_path / base, pm)
        original = sim_for(base, 4).topology
        for bandwidth, path in zip(grid, paths):
            topology = sim_for(path, 4).topology
            assert math.isclose(topology.bottleneck(), bandwidth, rel_tol=1e-3)
            # Only the bandwidth varies along the grid: latency, jitter, protocol are the base's.
            copy, net = load_network(path, pm.networks), load_network(base, pm.networks)
            assert ((copy.latency, copy.jitter, copy.protocol, [l.latency for l in copy.links])
                    == (net.latency, net.jitter, net.protocol, [l.latency for l in net.links]))
            if changed == "nic":
                assert all(math.isclose(b, bandwidth, rel_tol=1e-3) for b in topology.uplink)
            else:  # the datacenters keep their own NICs; only the WAN between them changes
                assert topology.uplink == original.uplink
                assert topology.intra == original.intra


def test_a_projected_sweep_reports_only_the_projected_model(tmp_path, capsys):
    main(["sweep", "--strategy", "localsgd", "-p", "H=1", "--net", "wan-1gbps,wan-100mbps",
          "--nodes", "2", "--steps", "3", "--compute", "fixed:10ms", *SMALL_GPT_FLAGS,
          "--project-params", "1e8", "--step-time", "200ms",
          "--out", str(tmp_path), "--no-progress", "--no-plots"])
    (folder,) = tmp_path.glob("*-sweep")
    rows = json.loads((folder / "sweep.json").read_text())
    assert sorted(r["net"] for r in rows) == ["wan-100mbps", "wan-1gbps"]
    assert {r["projection"] for r in rows} == {"1e+08 params, 0.2 s/step"}
    by_net = {r["net"]: r for r in rows}
    # Each step: the projected 0.2 s of compute, then the projected model's all-reduce
    # (4e8 bytes), as it takes alone on that network (replayed by itself, on new TCP
    # connections: the steps after the first take no longer, their windows grown, but
    # for the jitter of their 764 segments' latencies, each drawn anew: 3 %).
    from exoframe.sim.traces.replay import all_reduce_alone

    for net in ("wan-1gbps", "wan-100mbps"):
        setup = sim_for(net, 2)
        alone = all_reduce_alone(setup.topology, setup.algorithms, 2)(4e8, (0, 1))
        total = by_net[net]["simulated_seconds"]
        assert 0.6 + alone < total <= 3 * (0.2 + alone) * 1.03, (net, total, alone)
    assert len(list((folder / "runs").glob("*/replays/*.json"))) == 2


def sweep_csv_without_run_dirs(folder):
    import csv
    with open(folder / "sweep.csv") as f:
        return [{k: v for k, v in row.items() if k != "run_dir"} for row in csv.DictReader(f)]


def test_a_sweep_on_a_local_ray_gives_the_local_sweep_csv(tmp_path):
    pytest.importorskip("ray")
    flags = ["sweep", "--strategy", "ddp,async-localsgd", "-p", "async-localsgd.H=2",
             "--net", "wan-100mbps,wan-1gbps", "--seeds", "0,1", "--nodes", "2", "--steps", "4",
             "--compute", "fixed:10ms", *SMALL_GPT_FLAGS, "--no-progress", "--no-plots"]
    main([*flags, "--out", str(tmp_path / "local")])
    main([*flags, "--out", str(tmp_path / "ray"), "--executor", "ray"])
    (local,), (on_ray,) = (tmp_path / "local").glob("*-sweep"), (tmp_path / "ray").glob("*-sweep")
    rows = sweep_csv_without_run_dirs(on_ray)
    # ddp: 2 seeds trained once and replayed; async-localsgd: trained on each network
    assert len(rows) == 8 and {r["source"] for r in rows} == {"run", "replay"}
    assert rows == sweep_csv_without_run_dirs(local)
    assert len(list((on_ray / "runs").iterdir())) == 6  # the run folders came back


def test_an_executor_that_cannot_run_is_one_line(tmp_path, capsys, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    assert "--executor ray needs Ray: pip install 'exoframe[ray]'" in bad(
        capsys, "sweep", "--executor", "ray", "--out", tmp_path, "--no-progress")
    assert not (tmp_path).exists() or not any(tmp_path.iterdir())  # nothing ran


MLP_FLAGS = ["--workload", "mlp", "-w", "hidden=16", "-w", "train_examples=512", "--nodes", "2",
             "--steps", "2", "--compute", "fixed:10ms", "--net", "wan-100mbps", "--no-progress",
             "--no-plots"]


def run_configs(folder):
    return [yaml.safe_load((d / "config.yaml").read_text())
            for d in sorted((folder / "runs").iterdir())]


def test_any_field_and_any_strategy_parameter_is_a_sweep_axis(tmp_path):
    """-p diloco.H=5,20 × --partition iid,dirichlet:0.5 × --seeds 0,1: 8 diloco runs, each
    recording its values; ddp has no H, so it trains once per partition and seed."""
    main(["sweep", "--strategy", "ddp,diloco", "-p", "diloco.H=5,20", "--partition",
          "iid,dirichlet:0.5", "--seeds", "0,1", *MLP_FLAGS, "--out", str(tmp_path)])
    (folder,) = tmp_path.glob("*-sweep")
    configs = run_configs(folder)
    points = sorted((c["strategy"], c["strategy_params"].get("H"), c["partition"], c["seed"])
                    for c in configs)
    assert points == sorted([("diloco", h, p, s) for h in (5, 20)
                             for p in ("iid", "dirichlet:0.5") for s in (0, 1)]
                            + [("ddp", None, p, s) for p in ("iid", "dirichlet:0.5")
                               for s in (0, 1)])
    rows = json.loads((folder / "sweep.json").read_text())
    assert len(rows) == 12 and len({r["run_dir"] for r in rows}) == 12
    # Reported as groups of 2 seeds: diloco's 4 (H × partition), ddp's 2 (partition).
    groups = json.loads((folder / "sweep_summary.json").read_text())
    assert sorted((g["strategy"], g["H"], g["partition"], g["seeds"]) for g in groups) == \
        sorted([("diloco", str(h), p, 2) for h in (5, 20) for p in ("iid", "dirichlet:0.5")]
               + [("ddp", "-", p, 2) for p in ("iid", "dirichlet:0.5")])


def test_a_sweep_axis_value_is_checked_before_anything_trains(tmp_path, capsys):
    out = tmp_path / "s"
    flags = [*MLP_FLAGS, "--out", out]
    assert "partition: unknown kind 'dirichlt'. Did you mean 'dirichlet'" in bad(
        capsys, "sweep", "--strategy", "ddp", "--partition", "iid,dirichlt:0.5", *flags)
    assert "H" in bad(capsys, "sweep", "--strategy", "diloco", "-p", "H=5,x", *flags)
    assert "--lr: field 'lr' must be" in bad(capsys, "sweep", "--strategy", "ddp", "--lr",
                                             "0.1,fast", *flags)
    assert "--schedule: unknown choice 'cosin'. Did you mean 'cosine'" in bad(
        capsys, "sweep", "--strategy", "ddp", "--schedule", "constant,cosin", *flags)
    assert "-p localsgd.H: 'localsgd' is not one of the swept strategies" in bad(
        capsys, "sweep", "--strategy", "diloco", "-p", "localsgd.H=2,3", *flags)
    assert not out.exists()


@pytest.mark.parametrize("argv,said", [
    (["--seeds", "0,0"], "--seeds: 0 is given twice; give each value once."),
    (["--strategy", "ddp,ddp"], "--strategy: 'ddp' is given twice; give each value once."),
    (["--strategy", "diloco", "-p", "H=5,5.0"], "-p H: 5.0 is given twice"),
    (["--strategy", "ddp", "--partition", "iid,iid"], "--partition: 'iid' is given twice"),
    (["--strategy", "ddp", "--net", "ideal,ideal"], "--net: 'ideal' is given twice"),
    (["--strategy", "diloco", "-p", "diloco.H=5,20", "-p", "H=5,20"],  # the last H counts
     "sweep: two points are the same run"),
    (["--strategy", "ddp", "--epochs", "1", "--steps", "2,3"],  # epochs sets the steps
     "sweep: two points are the same run"),
])
def test_duplicate_points_are_refused_in_one_line_before_any_run(tmp_path, capsys, argv, said):
    out = tmp_path / "s"
    assert said in bad(capsys, "sweep", *MLP_FLAGS, *argv, "--out", out)
    assert not out.exists()
